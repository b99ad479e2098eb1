package consumer

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// Tests of what rebound does with a copy its origin queue refuses: an
// application queue with x-max-length and an overflow that refuses
// publishes (reject-publish, reject-publish-dlx), held full.

// overflows are the overflow settings that make a full queue refuse a
// publish rather than drop its oldest message.
var debugVisible = false

var overflows = []string{"reject-publish", "reject-publish-dlx"}

// declareFull declares an application queue of one message, dead-lettering
// to rebound, with overflow, and fills it; it returns the queue's name.
func (e *env) declareFull(name, overflow string) string {
	e.t.Helper()
	q := e.prefix + name
	e.Declare(q, amqp.Table{"x-max-length": int64(1), "x-overflow": overflow, "x-dead-letter-exchange": e.vars["REBOUND_DEAD_LETTER_EXCHANGE"]})
	e.Publish(q, amqp.Publishing{MessageId: "filler"})
	return q
}

// visible is how many messages rebound's queues (inbox, delay queues,
// parking queue) hold, ready or unacked: what an operator sees. A copy a
// quorum delay queue holds in its dead-letter state (messages_dlx) is not
// among them.
func (e *env) visible() int {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	vhost := "/"
	if u, err := amqp.ParseURI(e.URL()); err == nil && u.Vhost != "" {
		vhost = u.Vhost
	}
	out, err := e.b.Ctl(ctx, nil, "-q", "list_queues", "-p", vhost, "name", "messages_ready", "messages_unacknowledged", "--no-table-headers")
	if err != nil {
		e.t.Fatalf("list queues: %v", err)
	}
	if debugVisible {
		e.t.Logf("queues: %s", out)
	}
	n := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		name := f[0]
		if name != e.topo.InboxQueue && name != e.topo.ParkingQueue && !e.topo.IsDelayQueue(name) {
			continue
		}
		for _, count := range f[1:] {
			if c, err := strconv.Atoi(count); err == nil {
				n += c
			}
		}
	}
	return n
}

// collect takes every message that reaches queue, acked, until want
// distinct message ids have come or timeout has passed, and returns how
// many times each id came and the retry count each carried last.
func (e *env) collect(queue string, want int, timeout time.Duration) (times map[string]int, retries map[string]any) {
	e.t.Helper()
	times, retries = map[string]int{}, map[string]any{}
	brokertest.Await(timeout, func() bool {
		for {
			d, ok, err := e.Ch.Get(queue, true)
			if err != nil {
				e.t.Fatalf("get from %s: %v", queue, err)
			}
			if !ok {
				break
			}
			times[d.MessageId]++
			retries[d.MessageId] = d.Headers[names.RetryCount]
		}
		return len(times) >= want
	})
	return times, retries
}

// TestRunReturnsDelayedCopiesToAFullOrigin holds an origin queue full
// while five delayed copies for it end their delay, then frees it: every
// copy stays visible meanwhile, and every one arrives once there is room,
// counted as the one retry it was (waiting on a refusing origin spends the
// duration budget, not the retry count). Classic delay queues dead-letter
// at most once: a copy they hand to a full origin straight was gone. Quorum
// ones (at-least-once) held it invisible, in messages_dlx, with nothing
// to park it.
func TestRunReturnsDelayedCopiesToAFullOrigin(t *testing.T) {
	const copies = 5
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		for _, overflow := range overflows {
			t.Run(overflow, func(t *testing.T) {
				e := newEnv(t, queueType)
				full := e.declareFull("full", overflow)
				e.start(e.options("REBOUND_MIN_DELAY", "300ms", "REBOUND_MAX_RETRIES", "20", "REBOUND_MAX_DURATION", "10m"))
				for i := range copies {
					e.Publish(e.topo.InboxQueue, amqp.Publishing{MessageId: fmt.Sprintf("r%d", i), Headers: amqp.Table{names.OriginQueue: full}})
				}
				e.eventually("every copy went into its delay queue", func() bool {
					return e.metric("rebound_messages_retried_total", "kind", "delayed") >= copies
				})
				delayQueue, _ := e.topo.DelayQueue(300 * time.Millisecond)
				e.eventually("every copy's delay ended", func() bool { return e.QueueLenOr(delayQueue.Name, -1) == 0 })

				seen := 0
				brokertest.Await(30*time.Second, func() bool {
					seen = max(seen, e.visible())
					return seen >= copies
				})

				if d := e.take(full); d.MessageId != "filler" {
					t.Fatalf("the full queue held %q, want the filler", d.MessageId)
				}
				times, retries := e.collect(full, copies, 30*time.Second)
				arrived, distinct := 0, len(times)
				for _, n := range times {
					arrived += n
				}
				parked := len(e.drain(e.topo.ParkingQueue))
				missing := max(copies-distinct-parked, 0)
				t.Logf("%s delay queues, origin %s, RabbitMQ %s: while the origin was full at most %d of %d copies were visible; "+
					"after it was freed %d arrived (%d distinct), %d parked, %d missing (lost, or still held) 30s later; retry counts %v",
					queueType, overflow, e.b.Version(), seen, copies, arrived, distinct, parked, missing, retries)
				if seen < copies {
					t.Errorf("while the origin was full at most %d of %d copies were visible in rebound's queues", seen, copies)
				}
				if distinct != copies {
					t.Errorf("%d of %d copies arrived once the origin had room (%d parked, %d missing)", distinct, copies, parked, missing)
				}
				for id, n := range retries {
					if times[id] != 1 {
						t.Errorf("copy %s arrived %d times, want once", id, times[id])
					}
					if n != int64(1) {
						t.Errorf("copy %s arrived with retry count %v, want 1: waiting on a full origin is not a retry", id, n)
					}
				}
				if refused := e.metric("rebound_origin_refused_total"); refused < 1 {
					t.Errorf("rebound_origin_refused_total = %v, want the refusals counted", refused)
				}
				// reject-publish-dlx dead-letters a twin of each refused copy
				// back to rebound, which drops it: it still holds the copy.
				if twins := e.metric("rebound_origin_refused_twins_total"); (twins > 0) != (overflow == "reject-publish-dlx") {
					t.Errorf("rebound_origin_refused_twins_total = %v with overflow %s", twins, overflow)
				}
			})
		}
	})
}
