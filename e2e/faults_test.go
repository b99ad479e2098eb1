//go:build chaos

package e2e

import (
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// Broker faults for the no-loss and chaos tests, on the broker under test
// (brokertest knows how to stop, kill and start each node of the matrix).

// brokerDownMarker exists while a test has the broker b down on purpose,
// so that benchmarks and suites run beside it by hand can wait. One per
// broker: make test runs the two brokers' suites at the same time.
func brokerDownMarker(b *brokertest.Broker) string {
	return "/tmp/rebound-broker-down-" + b.Name
}

// brokerGoesDown is called just before a test stops or kills the local
// broker. It creates brokerDownMarker and, whatever happens next, has the
// broker running again (and the marker gone) at cleanup.
func brokerGoesDown(t *testing.T, b *brokertest.Broker) {
	t.Helper()
	if err := os.WriteFile(brokerDownMarker(b), []byte(t.Name()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Restore(); err != nil {
			t.Errorf("%v; %s left in place", err, brokerDownMarker(b))
			return
		}
		brokerBack(t, b)
	})
}

// brokerBack removes brokerDownMarker once the broker answers again.
func brokerBack(t *testing.T, b *brokertest.Broker) {
	t.Helper()
	if err := os.Remove(brokerDownMarker(b)); err != nil && !os.IsNotExist(err) {
		t.Error(err)
	}
}

// closedAt tells when the server closed conn.
func closedAt(conn *amqp.Connection) <-chan time.Time {
	at := make(chan time.Time, 1)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		<-closed
		at <- time.Now()
	}()
	return at
}
