package consumer

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// TestRunWindowFollowsMessageSizes runs small messages through the inbox,
// then large and mixed ones, then large ones right behind small ones, on
// the broker under test, and checks what the window and the meter promise:
// deep for small messages (the prefetch reaches its ceiling), back to one
// delivery after a pause, and the message bytes rebound holds (taken and
// not settled, or read and not taken) never past the budget by more than
// one message, even when a deep window fills with large messages; and
// every message moved.
func TestRunWindowFollowsMessageSizes(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		const (
			ceiling = 64
			budget  = 8 * mib
			large   = 2 * mib
		)
		e := newEnv(t, queueType)
		opt := e.options("REBOUND_PREFETCH", strconv.Itoa(ceiling), "REBOUND_INFLIGHT_BYTES", strconv.Itoa(budget),
			"REBOUND_MIN_DELAY", "1h", "REBOUND_MAX_RETRIES", "5")
		opt.WindowIdle = 2 * time.Second
		s, _ := e.start(opt)
		t.Logf("broker: RabbitMQ %s, %s queues", e.b.Version(), queueType)

		inbox := func(id string, size int) amqp.Publishing {
			return amqp.Publishing{MessageId: id, Body: make([]byte, size),
				Headers: amqp.Table{names.OriginQueue: e.app}}
		}
		var small []amqp.Publishing
		for i := range 600 {
			small = append(small, inbox("s"+strconv.Itoa(i), kib))
		}
		e.Publish(e.topo.InboxQueue, small...)
		e.WaitQueueLen(e.topo.InboxQueue, 0, time.Minute)
		deepest := 0
		for _, l := range e.logged("inbox prefetch") {
			deepest = max(deepest, int(l.ContextMap()["prefetch"].(int64)))
		}
		if deepest != ceiling {
			t.Errorf("the deepest prefetch with small messages was %d, want the ceiling %d", deepest, ceiling)
		}
		e.eventually("the window starts over at one after a pause",
			func() bool { return e.metric("rebound_prefetch") == 1 })

		r := rand.New(rand.NewPCG(1, 2))
		var mixed []amqp.Publishing
		for i := range 40 {
			mixed = append(mixed, inbox("l"+strconv.Itoa(i), large))
		}
		for i := range 120 {
			size := kib
			if r.IntN(3) == 0 {
				size = large
			}
			mixed = append(mixed, inbox("m"+strconv.Itoa(i), size))
		}
		// The worst case for the window: large messages right behind
		// a deep run of small ones, with no pause between them. The
		// broker sends a window of large ones before rebound sees the
		// first; the meter holds them back at the socket.
		var worst []amqp.Publishing
		for i := range 600 {
			worst = append(worst, inbox("w"+strconv.Itoa(i), kib))
		}
		for i := range 30 {
			worst = append(worst, inbox("W"+strconv.Itoa(i), large))
		}
		e.Publish(e.topo.InboxQueue, mixed...)
		e.Publish(e.topo.InboxQueue, worst...)
		want := float64(len(small) + len(mixed) + len(worst))
		retried := func() float64 {
			return e.metric("rebound_messages_retried_total", "kind", "delayed", "policy", "default")
		}
		started := time.Now()
		if !brokertest.Await(5*time.Minute, func() bool { return retried() == want && e.metric("rebound_inflight_deliveries") == 0 }) {
			t.Fatalf("retried %v copies, want %d; %v deliveries in flight, %d messages in the inbox, prefetch %v",
				retried(), int(want), e.metric("rebound_inflight_deliveries"), e.QueueLen(e.topo.InboxQueue), e.metric("rebound_prefetch"))
		}
		t.Logf("large and mixed messages moved in %s", time.Since(started).Round(time.Millisecond))

		if peak := s.peakInflightBytes.Load(); peak > budget+large {
			t.Errorf("held %d message bytes at the peak, want at most the budget %d plus one message of %d", peak, budget, large)
		} else {
			t.Logf("peak message bytes held: %d (budget %d, large messages %d)", peak, budget, large)
		}
		if got := e.metric("rebound_inflight_bytes"); got != 0 {
			t.Errorf("rebound_inflight_bytes = %v with nothing in flight", got)
		}
		if got := e.QueueLen(e.topo.InboxQueue); got != 0 {
			t.Errorf("%d messages left in the inbox", got)
		}
	})
}
