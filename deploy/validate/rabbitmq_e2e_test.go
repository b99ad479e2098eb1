package validate

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// TestRabbitMQSetupEndToEnd runs deploy/rabbitmq/setup.sh against a real
// RabbitMQ (the broker under test, see internal/brokertest) in a fresh
// vhost, then rebound as the user the script made: a message an
// application rejects from a queue the policy matches is retried
// (immediately, then through a delay queue) and parked, with no permission
// refused along the way; rebound then exits 0 on SIGTERM. -short skips it.
func TestRabbitMQSetupEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test; -short skips it")
	}
	b := brokertest.Require(t)
	rabbitmqctl := func(t *testing.T, args ...string) {
		t.Helper()
		if _, err := b.Ctl(context.Background(), nil, append([]string{"-q"}, args...)...); err != nil {
			t.Error(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	suffix := brokertest.RandomSuffix()
	vhost, reboundUser, appUser := "deploy-validate-"+suffix, "rebound-"+suffix, "app-"+suffix
	password := "pw-" + suffix
	rabbitmqctl(t, "add_vhost", vhost)
	t.Cleanup(func() { rabbitmqctl(t, "delete_vhost", vhost) })
	rabbitmqctl(t, "add_user", appUser, password)
	t.Cleanup(func() { rabbitmqctl(t, "delete_user", appUser) })
	rabbitmqctl(t, "set_permissions", "-p", vhost, appUser, ".*", ".*", ".*")

	setup := exec.CommandContext(ctx, "bash", setupScript)
	setup.Env = append(os.Environ(), "VHOST="+vhost, "REBOUND_USER="+reboundUser,
		"REBOUND_PASSWORD="+password, `APP_QUEUES=^orders\.`, "RABBITMQCTL="+strings.Join(b.CtlCommand(), " "))
	t.Cleanup(func() { rabbitmqctl(t, "delete_user", reboundUser) })
	if out, err := setup.CombinedOutput(); err != nil {
		t.Fatalf("setup.sh: %v\n%s", err, out)
	}

	dir := t.TempDir()
	bin := filepath.Join(dir, "rebound")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = "../.."
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build rebound: %v\n%s", err, out)
	}
	urlFile := filepath.Join(dir, "url")
	url := userURL(t, b.URL, reboundUser, password, vhost)
	if err := os.WriteFile(urlFile, []byte(url), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := brokertest.FreeAddr(t)
	logs := &brokertest.SyncBuffer{}
	rebound := exec.CommandContext(ctx, bin, "run")
	rebound.Env = append(os.Environ(), "REBOUND_AMQP_URL_FILE="+urlFile, "REBOUND_HTTP_ADDR="+addr,
		"REBOUND_MIN_DELAY=1s", "REBOUND_JITTER=none", "REBOUND_IMMEDIATE_RETRIES=1", "REBOUND_MAX_RETRIES=2")
	rebound.Stdout, rebound.Stderr = logs, logs
	if err := rebound.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- rebound.Wait() }()
	defer func() {
		_ = rebound.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("rebound's log:\n%s", logs.String())
		}
	}()
	waitReady(t, ctx, "http://"+addr+"/readyz")

	conn, err := amqp.Dial(userURL(t, b.URL, appUser, password, vhost))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// No x-dead-letter-exchange argument: the script's policy supplies it.
	if _, err := ch.QueueDeclare("orders.e2e", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(ctx, "", "orders.e2e", false, false, amqp.Publishing{MessageId: "e2e-1", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	rejects := 0
	for {
		if ctx.Err() != nil {
			t.Fatalf("not parked after %d rejects", rejects)
		}
		if refused(logs.String()) {
			t.Fatal("rebound was refused a permission")
		}
		d, ok, err := ch.Get("orders.e2e", false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			rejects++
			if err := d.Nack(false, false); err != nil {
				t.Fatal(err)
			}
			continue
		}
		p, ok, err := ch.Get("rebound.parked", true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if reason := p.Headers["x-retry-parked-reason"]; reason != "max-retries" || p.MessageId != "e2e-1" {
				t.Errorf("parked %s with reason %v, want e2e-1 with max-retries", p.MessageId, reason)
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The original attempt, one immediate and one delayed retry.
	if rejects != 3 {
		t.Errorf("the application saw the message %d times, want 3", rejects)
	}
	// The script's patterns give rebound no permission on the application
	// queues: RabbitMQ 4.2.6 and later refuse its check that the origin
	// exists, and it says so (deploy/README.md), once.
	unchecked := strings.Count(logs.String(), "cannot check whether origin queue orders.e2e exists")
	if want := map[bool]int{true: 1, false: 0}[b.AtLeast(4, 2)]; unchecked != want {
		t.Errorf("RabbitMQ %s: rebound said %d times it cannot check the origin queue, want %d", b.Version(), unchecked, want)
	}
	// Each of the script's policies applies where it should: the one delay
	// queue rebound declared (1s) runs lazy, the application queue
	// dead-letters to rebound, and rebound's own fixed queues have neither.
	out, err := b.Ctl(ctx, nil, "-q", "list_queues", "-p", vhost, "name", "policy", "--no-table-headers")
	if err != nil {
		t.Fatalf("list queues and their policies: %v", err)
	}
	policies := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			policies[f[0]] = strings.Join(f[1:], " ")
		}
	}
	for queue, want := range map[string]string{
		"rebound.delay.1000": "rebound-delay-queues-lazy", "orders.e2e": "rebound-dead-letter",
		"rebound.inbox": "", "rebound.parked": "",
	} {
		if got, ok := policies[queue]; !ok || got != want {
			t.Errorf("queue %s: policy %q (listed: %v), want %q", queue, got, ok, want)
		}
	}
	if refused(logs.String()) {
		t.Error("rebound was refused a permission")
	}
	if err := rebound.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err // for the deferred Wait
		if err != nil {
			t.Errorf("rebound did not exit 0 on SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("rebound still running 30s after SIGTERM")
	}
}

// userURL is brokerURL for user and password in vhost.
func userURL(t *testing.T, brokerURL, user, password, vhost string) string {
	t.Helper()
	u, err := amqp.ParseURI(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Username, u.Password, u.Vhost = user, password, vhost
	return u.String()
}

func waitReady(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatal(errors.Join(ctx.Err(), err))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func refused(log string) bool {
	return strings.Contains(strings.ToLower(log), "access_refused")
}
