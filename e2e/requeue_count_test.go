package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// TestQuorumQueueCountsRejectAndNack shows what a quorum queue counts
// when a consumer returns a message with basic.reject (requeue) and with
// basic.nack (requeue): the x-delivery-count and x-acquired-count headers
// of each redelivery, and whether the delivery limit (3 here) ends it,
// dead-lettering it. rebound returns inbox deliveries with basic.nack
// (acker.settle) and its guide for consumers (docs/consumers.md) says
// which to use; this is the broker's word for both.
//
// RabbitMQ 4.3 (rabbitmq-server#15387): basic.reject counts toward the
// delivery limit (x-delivery-count), basic.nack only toward
// x-acquired-count, so a message returned with nack is never dead-lettered
// by the limit. RabbitMQ 3.10 counts both in x-delivery-count, has no
// x-acquired-count, and both reach the limit.
func TestQuorumQueueCountsRejectAndNack(t *testing.T) {
	t.Parallel()
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	const limit, returns = 3, 6
	split := b.AtLeast(4, 3)
	for _, method := range []string{"reject", "nack"} {
		t.Run(method, func(t *testing.T) {
			queue, dead := d.Prefix+method, d.Prefix+method+".dead"
			d.Declare(dead, nil)
			d.Declare(queue, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": limit,
				"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
			d.Publish(queue, amqp.Publishing{MessageId: method})
			var deliveryCounts, acquiredCounts []int64
			returned := 0
			for ; returned < returns; returned++ {
				var m amqp.Delivery
				ok := false
				var err error
				brokertest.Await(10*time.Second, func() bool {
					m, ok, err = d.Ch.Get(queue, false)
					return ok || err != nil || d.QueueLenOr(dead, 0) > 0
				})
				if err != nil {
					t.Fatalf("get from %s: %v", queue, err)
				}
				if !ok {
					break // dead-lettered
				}
				deliveryCounts = append(deliveryCounts, countHeader(m, "x-delivery-count"))
				acquiredCounts = append(acquiredCounts, countHeader(m, "x-acquired-count"))
				if method == "reject" {
					err = m.Reject(true)
				} else {
					err = m.Nack(false, true)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			deadLettered := d.QueueLenOr(dead, 0) > 0 || brokertest.Await(5*time.Second, func() bool { return d.QueueLenOr(dead, 0) > 0 })
			t.Logf("REQUEUE broker=%s %s(requeue) under x-delivery-limit %d: deliveries %d, x-delivery-count %s, x-acquired-count %s, dead-lettered %v",
				b.Version(), method, limit, len(deliveryCounts), counts(deliveryCounts), counts(acquiredCounts), deadLettered)
			countsTowardLimit := method == "reject" || !split
			switch {
			case countsTowardLimit && !deadLettered:
				t.Errorf("%s(requeue) %d times under a delivery limit of %d: not dead-lettered", method, returned, limit)
			case countsTowardLimit && len(deliveryCounts) != limit+1:
				t.Errorf("%s(requeue): %d deliveries before the limit of %d ended it, want %d", method, len(deliveryCounts), limit, limit+1)
			case !countsTowardLimit && (deadLettered || len(deliveryCounts) != returns):
				t.Errorf("%s(requeue): dead-lettered %v after %d deliveries; want it redelivered all %d times, uncounted", method, deadLettered, len(deliveryCounts), returns)
			}
			for i, c := range deliveryCounts {
				want := int64(i)
				if !countsTowardLimit {
					want = 0
				}
				if c != want {
					t.Errorf("%s(requeue): delivery %d carries x-delivery-count %d, want %d", method, i+1, c, want)
				}
				if wantAcquired := map[bool]int64{true: int64(i), false: 0}[split]; acquiredCounts[i] != wantAcquired {
					t.Errorf("%s(requeue): delivery %d carries x-acquired-count %d, want %d", method, i+1, acquiredCounts[i], wantAcquired)
				}
			}
		})
	}
}

// countHeader reads a count header of m, 0 when absent.
func countHeader(m amqp.Delivery, name string) int64 {
	switch v := m.Headers[name].(type) {
	case int64:
		return v
	case int32:
		return int64(v)
	case int:
		return int64(v)
	}
	return 0
}

func counts(cs []int64) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = fmt.Sprint(c)
	}
	return "[" + strings.Join(s, " ") + "]"
}
