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
	"github.com/rebound-mq/rebound/internal/delayqueue"
)

// Tests of what rebound does with a copy its origin queue refuses: an
// application queue with x-max-length and an overflow that refuses
// publishes (reject-publish, reject-publish-dlx), held full.

// overflows are the overflow settings that make a full queue refuse a
// publish rather than drop its oldest message.
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

// declareDelayQueue declares the delay queue of d, as rebound does.
func (e *env) declareDelayQueue(d time.Duration) {
	e.t.Helper()
	delays, err := delayqueue.New(e.Conn, e.topo, nil, time.Now)
	if err != nil {
		e.t.Fatal(err)
	}
	defer delays.Close()
	if _, err := delays.Ensure(d); err != nil {
		e.t.Fatal(err)
	}
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
				// A copy may have just begun the longest wait when the
				// origin was freed.
				times, retries := e.collect(full, copies, refusedLongest+30*time.Second)
				arrived, distinct := 0, len(times)
				for _, n := range times {
					arrived += n
				}
				parked := len(e.drain(e.topo.ParkingQueue))
				missing := max(copies-distinct-parked, 0)
				t.Logf("%s delay queues, origin %s, RabbitMQ %s: while the origin was full at most %d of %d copies were visible; "+
					"after it was freed %d arrived (%d distinct), %d parked, %d missing (lost, or still held) 60s later; retry counts %v",
					queueType, overflow, e.b.Version(), seen, copies, arrived, distinct, parked, missing, retries)
				if seen < copies {
					t.Errorf("while the origin was full at most %d of %d copies were visible in rebound's queues", seen, copies)
				}
				if distinct != copies {
					t.Errorf("%d of %d copies arrived once the origin had room (%d parked, %d missing)", distinct, copies, parked, missing)
				}
				// With reject-publish-dlx a twin rebound does not know for one
				// (docs/origin-refused.md, Twins) is retried as a failure of
				// its own: a duplicate, counted once more, never a loss.
				for id, n := range retries {
					if overflow == "reject-publish" && times[id] != 1 {
						t.Errorf("copy %s arrived %d times, want once", id, times[id])
					}
					if overflow == "reject-publish" && n != int64(1) {
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

// TestRunParksACopyItsFullOriginKeepsRefusing holds an origin queue full
// for good: its copy waits in delay queues (its inbox delivery acked),
// the origin is tried a few times a second at most, other origins' retries
// go on meanwhile, and the copy is parked origin-refused once its policy's
// budget is spent: its duration, or with none its retry count.
func TestRunParksACopyItsFullOriginKeepsRefusing(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		for _, budget := range []struct {
			name    string
			vars    []string
			retries int64 // the parked copy's count
		}{
			{"max-duration", []string{"REBOUND_MAX_DURATION", "3s", "REBOUND_MAX_RETRIES", "0"}, 1},
			{"max-retries", []string{"REBOUND_MAX_DURATION", "0", "REBOUND_MAX_RETRIES", "3"}, 3},
		} {
			t.Run(budget.name, func(t *testing.T) {
				e := newEnv(t, queueType)
				full := e.declareFull("full", "reject-publish")
				e.start(e.options(append(budget.vars, "REBOUND_IMMEDIATE_RETRIES", "5")...))
				started := time.Now()
				e.Publish(e.topo.InboxQueue, amqp.Publishing{MessageId: "m1", Headers: amqp.Table{names.OriginQueue: full}})

				e.eventually("the refused copy waits in a delay queue, its delivery acked", func() bool {
					return e.metric("rebound_origin_refused_waits_total") >= 1 && e.metric("rebound_inflight_deliveries") == 0 &&
						e.metric("rebound_messages_parked_total", "reason", "origin-refused") == 0
				})
				e.eventually("the origin is reported backing off", func() bool { return e.metric("rebound_origins_refusing") == 1 })
				others := make([]amqp.Publishing, 10)
				for i := range others {
					others[i] = amqp.Publishing{MessageId: fmt.Sprintf("o%d", i), Headers: amqp.Table{names.OriginQueue: e.app}}
				}
				e.Publish(e.topo.InboxQueue, others...)
				e.WaitQueueLen(e.app, len(others), 15*time.Second)

				parked := e.get(e.topo.ParkingQueue)
				elapsed := time.Since(started)
				if err := parked.Ack(false); err != nil {
					t.Fatal(err)
				}
				if parked.MessageId != "m1" || parked.Headers[names.ParkedReason] != "origin-refused" || parked.Headers[names.OriginQueue] != full ||
					parked.Headers[names.RetryCount] != budget.retries {
					t.Errorf("parked %q reason %v origin %v count %v; want m1, origin-refused, %s, %d", parked.MessageId, parked.Headers[names.ParkedReason],
						parked.Headers[names.OriginQueue], parked.Headers[names.RetryCount], full, budget.retries)
				}
				refused := e.metric("rebound_origin_refused_total")
				t.Logf("%s queues, budget %s, RabbitMQ %s: parked origin-refused after %s, %v refusals, %v waits in a delay queue; %d other copies arrived meanwhile",
					queueType, budget.name, e.b.Version(), elapsed.Round(time.Millisecond), refused, e.metric("rebound_origin_refused_waits_total"), len(others))
				if most := 2 + 4*elapsed.Seconds(); refused > most {
					t.Errorf("the origin refused %v copies in %s: more than %v, a few a second", refused, elapsed, most)
				}
				if d := e.take(full); d.MessageId != "filler" {
					t.Errorf("the full queue held %q, want only the filler", d.MessageId)
				}
				if n := e.metric("rebound_publish_failures_total", "kind", "nack"); n != 0 {
					t.Errorf("rebound_publish_failures_total{kind=nack} = %v: an origin's refusals are not publish failures", n)
				}
			})
		}
	})
}

// TestRunSendsWhatAFullOriginRefusedOnceItHasRoom frees a full origin
// while copies wait for it: every copy arrives, once, and nothing is
// parked.
func TestRunSendsWhatAFullOriginRefusedOnceItHasRoom(t *testing.T) {
	const copies = 3
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType)
		full := e.declareFull("full", "reject-publish")
		e.start(e.options("REBOUND_MAX_DURATION", "10m", "REBOUND_IMMEDIATE_RETRIES", "1"))
		for i := range copies {
			e.Publish(e.topo.InboxQueue, amqp.Publishing{MessageId: fmt.Sprintf("m%d", i), Headers: amqp.Table{names.OriginQueue: full}})
		}
		e.eventually("every copy waits for the origin", func() bool {
			return e.metric("rebound_origin_refused_waits_total") >= copies
		})
		if d := e.take(full); d.MessageId != "filler" {
			t.Fatalf("the full queue held %q, want the filler", d.MessageId)
		}
		times, _ := e.collect(full, copies, 60*time.Second)
		parked := len(e.drain(e.topo.ParkingQueue))
		t.Logf("%s queues, RabbitMQ %s: origin freed after %v refusals; %d of %d arrived, %d parked", queueType, e.b.Version(),
			e.metric("rebound_origin_refused_total"), len(times), copies, parked)
		if len(times) != copies || parked != 0 {
			t.Errorf("%d of %d copies arrived and %d were parked, want all arrived and none parked", len(times), copies, parked)
		}
		for id, n := range times {
			if n != 1 {
				t.Errorf("copy %s arrived %d times, want once", id, n)
			}
		}
	})
}

// TestRunLetsCopiesOfAnEarlierReboundArrive publishes a copy as a rebound
// before this one did, with its origin as routing key, into a delay queue:
// it goes straight to its origin when its delay ends, as it did; a copy of
// this rebound's, published beside it, comes back through the inbox.
func TestRunLetsCopiesOfAnEarlierReboundArrive(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType)
		e.options() // the topology of queueType
		delay := 300 * time.Millisecond
		e.declareDelayQueue(delay)
		dc, err := e.Ch.PublishWithDeferredConfirmWithContext(context.Background(), e.topo.DelayExchangeFor(delay).Name, e.app, true, false,
			amqp.Publishing{MessageId: "old", DeliveryMode: amqp.Persistent, Headers: amqp.Table{names.OriginQueue: e.app, names.RetryCount: int64(1)}})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			t.Fatalf("old-style copy not confirmed: %v", err)
		}
		e.start(e.options("REBOUND_MIN_DELAY", delay.String()))
		e.Publish(e.topo.InboxQueue, amqp.Publishing{MessageId: "new", Headers: amqp.Table{names.OriginQueue: e.app}})
		times, _ := e.collect(e.app, 2, 30*time.Second)
		t.Logf("%s delay queues, RabbitMQ %s: arrived %v; %v returned through the inbox", queueType, e.b.Version(), times, e.metric("rebound_messages_returned_total"))
		if times["old"] != 1 || times["new"] != 1 {
			t.Errorf("arrived %v, want old and new once each", times)
		}
		if n := e.metric("rebound_messages_returned_total"); n != 1 {
			t.Errorf("rebound_messages_returned_total = %v, want 1: the new copy came back through the inbox, the old one went straight", n)
		}
	})
}
