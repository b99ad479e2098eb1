package brokertest

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestUsers: the users Users creates sign in with their passwords and hold
// exactly the permissions asked for, and are gone once their test ends.
func TestUsers(t *testing.T) {
	b := Require(t)
	var users []TestUser
	t.Run("created", func(t *testing.T) {
		users = b.Users(t, b.URL,
			UserSpec{Password: "given", Permissions: Permissions{Configure: "^rebound-users-test$", Write: ".*", Read: ".*"}},
			UserSpec{Permissions: Permissions{Configure: "^$", Write: "^$", Read: "^$"}})
		if users[0].Password != "given" || users[1].Password == "" || users[0].Name == users[1].Name {
			t.Fatalf("users %+v", users)
		}
		for i, u := range users {
			conn, err := amqp.Dial(u.URL)
			if err != nil {
				t.Fatalf("user %d: %v", i, err)
			}
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			_, err = ch.QueueDeclare("rebound-users-test", false, true, true, false, nil)
			if allowed := i == 0; allowed != (err == nil) {
				t.Errorf("user %d (configure %q) declaring rebound-users-test: %v", i, []string{"^rebound-users-test$", "^$"}[i], err)
			}
			conn.Close()
		}
	})
	out := b.MustCtl(t, "-q", "list_users")
	for _, u := range users {
		if strings.Contains(out, u.Name) {
			t.Errorf("%s is still there after its test:\n%s", u.Name, out)
		}
		if conn, err := amqp.Dial(u.URL); err == nil {
			conn.Close()
			t.Errorf("%s still signs in after its test", u.Name)
		}
	}
}
