package parking

import (
	"context"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/policy"
	"github.com/rebound-mq/rebound/republisher"
)

// The harness of the package's broker tests: one test's parking queue,
// declared as rebound declares it, seeded with messages as rebound parks
// them.

// env is one test's rebound topology on the broker under test and the
// Queue the operations run on. Every queue and exchange it declares
// starts with prefix and is deleted at cleanup.
type env struct {
	t      *testing.T
	b      *brokertest.Broker
	prefix string
	ch     *amqp.Channel // the test's own, in confirm mode
	q      Queue
	app    string // an application queue
}

func newEnv(t *testing.T, quorum bool) *env {
	t.Helper()
	b := brokertest.Require(t)
	prefix := brokertest.Unique(t)
	conn := b.Dial(t, b.URL)
	ch, err := b.Dial(t, b.URL).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	topo := republisher.Topology{
		InboxQueue: prefix + "inbox", DeadLetterExchange: prefix + "dlx", DelayExchange: prefix + "delay",
		DelayQueuePrefix: prefix + "delay.", ParkingQueue: prefix + "parked", Quorum: quorum,
	}.ForServer(conn.Properties)
	e := &env{t: t, b: b, prefix: prefix, ch: ch, q: Queue{Conn: conn, Topology: topo, Codec: headers.NewCodec(headers.DefaultNames())}}
	b.CleanupPrefix(t, b.URL, prefix)
	if _, err := topo.Declare(conn); err != nil {
		t.Fatal(err)
	}
	e.app = e.queue("app", nil)
	return e
}

// queue declares a durable queue named prefix + suffix with args.
func (e *env) queue(suffix string, args amqp.Table) string {
	e.t.Helper()
	name := e.prefix + suffix
	if _, err := e.ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		e.t.Fatal(err)
	}
	return name
}

// parked is a message to seed into the parking queue.
type parked struct {
	id      string
	origin  string // "" for unknown
	reason  policy.Reason
	age     time.Duration // parked this long before now
	retries int
	errText string // the consumer's error header; "" for none
}

// seed parks the messages as the sidecar does: headers written by
// Codec.Park, published to the parking queue and confirmed.
func (e *env) seed(now time.Time, ps ...parked) {
	e.t.Helper()
	c := e.q.Codec
	msgs := make([]amqp.Publishing, 0, len(ps))
	for _, p := range ps {
		at := now.Add(-p.age)
		s := headers.State{
			State:  policy.State{Retries: p.retries, StartedAt: at.Add(-time.Hour), LastDelay: time.Second},
			Origin: p.origin, FirstDeathReason: "rejected", FirstDeathQueue: p.origin,
		}
		h := amqp.Table{"tenant": "acme"}
		if p.errText != "" {
			h[c.Names.Error] = p.errText
		}
		msgs = append(msgs, amqp.Publishing{
			MessageId: p.id, ContentType: "text/plain", DeliveryMode: amqp.Persistent,
			Headers: c.Park(h, s, p.reason, at), Body: []byte("body of " + p.id),
		})
	}
	brokertest.PublishConfirmed(e.t, e.ch, e.q.Name(), msgs...)
}

// publish sends msg to queue and waits for the broker's confirm.
func (e *env) publish(queue string, msg amqp.Publishing) {
	e.t.Helper()
	brokertest.PublishConfirmed(e.t, e.ch, queue, msg)
}

// queueLen returns how many ready messages queue holds; it must exist.
func (e *env) queueLen(queue string) int {
	e.t.Helper()
	n, err := brokertest.QueueLen(e.b.URL, queue)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// drain takes every message queue holds now.
func (e *env) drain(queue string) []amqp.Delivery {
	e.t.Helper()
	return brokertest.Drain(e.t, e.ch, queue)
}

// settled waits up to 10s until the broker reports n messages in the
// parking queue. The operations read as many messages as it reports when
// they start, and a quorum queue reports the messages an operation
// returned a few milliseconds late (see
// TestOperationRightAfterAnotherReadsEveryMessage): a test waits for the
// count before its next operation.
func (e *env) settled(n int) {
	e.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got := e.queueLen(e.q.Name())
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the parking queue holds %d messages, want %d", got, n)
		}
	}
}

// parkedIDs lists the ids in the parking queue, which must hold n
// messages, sorted, leaving it as it is.
func (e *env) parkedIDs(now time.Time, n int) []string {
	e.t.Helper()
	e.settled(n)
	l, err := e.q.List(context.Background(), Filter{}, now)
	if err != nil {
		e.t.Fatal(err)
	}
	return ids(l.Messages)
}

func ids(ms []Message) []string {
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.ID())
	}
	slices.Sort(out)
	return out
}

// kept returns why each message a replay left parked was kept, by id.
func kept(res ReplayResult) map[string]string {
	out := map[string]string{}
	for _, k := range res.Kept {
		out[k.Message.ID()] = k.Why
	}
	return out
}
