package brokertest

import (
	"slices"
	"strings"
	"testing"
)

// TestCleanupPrefixDeletesWhatTheTestNamed: once a test ends, the queues
// and exchanges named with its prefix are gone from the vhost, and a
// queue of another prefix is left alone. The one eval call that lists
// them (names) must see both kinds on every broker of the matrix.
func TestCleanupPrefixDeletesWhatTheTestNamed(t *testing.T) {
	b := Require(t)
	prefix := "rebound-cleanup-test." + RandomSuffix() + "."
	other := "rebound-cleanup-kept." + RandomSuffix()
	ch, err := b.Dial(t, b.URL).Channel()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("declares", func(t *testing.T) {
		b.CleanupPrefix(t, b.URL, prefix)
		for _, q := range []string{prefix + "app", prefix + "delay.1000", other} {
			if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := ch.ExchangeDeclare(prefix+"delay.1000", "fanout", true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		queues, exchanges := b.names("/")
		if !slices.Contains(queues, prefix+"app") || !slices.Contains(exchanges, prefix+"delay.1000") {
			t.Fatalf("names: queues %q, exchanges %q", queues, exchanges)
		}
	})
	t.Cleanup(func() { _, _ = ch.QueueDelete(other, false, false, false) })
	queues, exchanges := b.names("/")
	for _, name := range append(queues, exchanges...) {
		if strings.HasPrefix(name, prefix) {
			t.Errorf("%s is left after its test ended", name)
		}
	}
	if !slices.Contains(queues, other) {
		t.Errorf("%s, another prefix, was deleted", other)
	}
}
