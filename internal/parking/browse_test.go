package parking

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/policy"
)

// TestBrowseEndsWhenAnotherReaderTakesMessages: another reader takes
// some of the messages right after a reading counted them. The reading
// waits for no delivery that cannot come: it reads the rest, ends, and
// says how many it did not read.
func TestBrowseEndsWhenAnotherReaderTakesMessages(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType == "quorum")
		const n, taken = 50, 10
		now := time.Now()
		seeds := make([]parked, n)
		for i := range seeds {
			seeds[i] = parked{id: fmt.Sprint("m", i), origin: e.App, reason: policy.MaxRetries}
		}
		e.seed(now, seeds...)
		e.settled(n)
		other, err := e.Broker.Dial(t, e.Broker.URL).Channel()
		if err != nil {
			t.Fatal(err)
		}
		first := true
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		read, unread, err := e.q.browse(ctx, func(amqp.Delivery) bool {
			if first { // the count is taken: another reader holds some
				first = false
				for range taken {
					if _, ok, err := other.Get(e.q.Name(), false); err != nil || !ok {
						t.Fatalf("the other reader's get: %v, %v", ok, err)
					}
				}
			}
			return true
		})
		if err != nil || read != n-taken || unread != taken {
			t.Errorf("read %d, unread %d, %v; want %d and %d", read, unread, err, n-taken, taken)
		}
		if err := other.Close(); err != nil {
			t.Fatal(err)
		}
		e.settled(n)
	})
}
