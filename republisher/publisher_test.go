package republisher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/topology"
)

// Tests of the Publisher and Declare against the broker under test.

// testEnv is one test's topology on the broker, deleted at cleanup.
type testEnv struct {
	*brokertest.Deployment
	t      *testing.T
	broker *brokertest.Broker
	conn   *amqp.Connection // the publisher's
	admin  *amqp.Channel    // the test's own, in confirm mode
	topo   topology.Topology
	origin string // an application queue
	clock  clock  // the time e's publishers see

	mu      sync.Mutex
	notices []string // what e's publishers noticed
}

// clock is the real time plus an offset a test moves; the Publisher's
// loop reads it at any time, so the offset is atomic.
type clock struct{ offset atomic.Int64 }

func (c *clock) now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

func (c *clock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// notice is the notice function of e's publishers.
func (e *testEnv) notice(msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.notices = append(e.notices, msg)
}

func (e *testEnv) noticed() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.notices)
}

func newTestEnv(t *testing.T, quorum bool) *testEnv {
	t.Helper()
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	return &testEnv{Deployment: d, t: t, broker: b, conn: b.Dial(t, b.URL), admin: d.Ch, origin: d.App, topo: d.Topology(quorum)}
}

// publisher declares the topology and returns a Publisher on e's
// connection, closed at cleanup.
func (e *testEnv) publisher(window int) *Publisher {
	e.t.Helper()
	if _, err := e.topo.Declare(e.conn); err != nil {
		e.t.Fatal(err)
	}
	p, err := newPublisher(e.conn, e.topo, window, 30*time.Second, e.notice, e.clock.now)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = p.ch.Close()
		<-p.Done()
	})
	return p
}

// outcomes collects what became of each publish, by message id.
type outcomes struct {
	mu   sync.Mutex
	got  map[string]Outcome
	done chan string
}

func newOutcomes() *outcomes {
	return &outcomes{got: map[string]Outcome{}, done: make(chan string, 1024)}
}

func (o *outcomes) callback(id string) func(Outcome, time.Duration) {
	return func(out Outcome, _ time.Duration) {
		o.mu.Lock()
		o.got[id] = out
		o.mu.Unlock()
		o.done <- id
	}
}

// wait returns the outcomes once n publishes have one.
func (o *outcomes) wait(t *testing.T, n int, timeout time.Duration) map[string]Outcome {
	t.Helper()
	deadline := time.After(timeout)
	for range n {
		select {
		case <-o.done:
		case <-deadline:
			t.Fatalf("outcomes after %s: %v, want %d", timeout, o.got, n)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.got
}

// waitOrigin waits up to 10 s for the origin queue to hold n messages.
func (e *testEnv) waitOrigin(n int, what string) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := brokertest.QueueLen(e.broker.URL, e.origin)
		if err != nil {
			e.t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("origin queue holds %d messages, want %d: %s", got, n, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func msg(id string) amqp.Publishing {
	return amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Headers: amqp.Table{}, Body: []byte(id)}
}

func TestPublishOutcomes(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, false)
	p := e.publisher(16)
	o := newOutcomes()
	ctx := context.Background()
	delayed := e.topo.Delayed(200*time.Millisecond, e.origin)
	// A delay queue's exchange without its queue: as another replica's
	// sweep leaves it.
	swept := e.topo.DelayExchangeFor(700 * time.Millisecond)
	if err := e.admin.ExchangeDeclare(swept.Name, swept.Kind, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for id, dest := range map[string]topology.Destination{
		"direct":     topology.Direct(e.origin),
		"parked":     topology.Direct(e.topo.ParkingQueue),
		"delayed":    delayed,
		"nowhere":    topology.Direct(brokertest.Unique(t) + "missing"),
		"no-binding": {Exchange: swept.Name, RoutingKey: e.origin},
	} {
		if err := p.Publish(ctx, dest, msg(id), o.callback(id)); err != nil {
			t.Fatal(err)
		}
	}
	got := o.wait(t, 5, 10*time.Second)
	want := map[string]Outcome{"direct": Confirmed, "parked": Confirmed, "delayed": Confirmed, "nowhere": Returned, "no-binding": Returned}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: %v, want %v", id, got[id], w)
		}
	}
	// The delayed copy waits its delay, then reaches the origin under its
	// routing key.
	e.waitOrigin(2, "the direct and the delayed one")
	if n, err := brokertest.QueueLen(e.broker.URL, e.topo.ParkingQueue); err != nil || n != 1 {
		t.Errorf("parking queue holds %d (%v), want 1", n, err)
	}
}

// TestUnusableDelayQueueIsDetoured: a delay queue that exists with other
// arguments (here a different TTL, as an operator's hand might leave it),
// or whose exchange exists of another type, answers every declaration
// with PRECONDITION_FAILED. The copies must still be confirmed and come
// back, through the next usable millisecond's queue, and what was there
// is left as it was.
func TestUnusableDelayQueueIsDetoured(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, false)
	p := e.publisher(4)
	const delay = 300 * time.Millisecond
	taken, _ := e.topo.DelayQueue(delay)
	if _, err := e.admin.QueueDeclare(taken.Name, true, false, false, false, amqp.Table{amqp.QueueMessageTTLArg: 60_000}); err != nil {
		t.Fatal(err)
	}
	direct := e.topo.DelayExchangeFor(delay + time.Millisecond).Name
	if err := e.admin.ExchangeDeclare(direct, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	o := newOutcomes()
	for _, id := range []string{"first", "second"} {
		dest := e.topo.Delayed(delay, e.origin)
		if err := p.Publish(context.Background(), dest, amqp.Publishing{MessageId: id, Body: []byte(id), Headers: amqp.Table{}}, o.callback(id)); err != nil {
			t.Fatal(err)
		}
	}
	for id, out := range o.wait(t, 2, 10*time.Second) {
		if out != Confirmed {
			t.Errorf("%s: %v, want Confirmed", id, out)
		}
	}
	if notices := e.noticed(); len(notices) != 2 {
		t.Errorf("notices = %q, want two, both for the first copy", notices)
	}
	detour, _ := e.topo.DelayQueue(delay + 2*time.Millisecond)
	if _, ok := p.declared[(delay + 2*time.Millisecond).Milliseconds()]; !ok {
		t.Errorf("%s was not declared", detour.Name)
	}
	e.waitOrigin(2, "both copies")
	if n, err := brokertest.QueueLen(e.broker.URL, taken.Name); err != nil || n != 0 {
		t.Errorf("the queue that was there holds %d (%v), want untouched and empty", n, err)
	}
	if err := e.admin.ExchangeDeclarePassive(direct, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		t.Errorf("the direct exchange that was there: %v, want it untouched", err)
	}

	// The detour's queue goes (another replica's sweep) and comes back
	// unusable: the next copy for the delay asked for detours once more,
	// and the one after goes straight to the new detour.
	if _, err := e.admin.QueueDelete(detour.Name, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.QueueDeclare(detour.Name, true, false, false, false, amqp.Table{amqp.QueueMessageTTLArg: 60_000}); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.stale[(delay + 2*time.Millisecond).Milliseconds()] = true // as a return from it marks it
	p.mu.Unlock()
	for _, id := range []string{"third", "fourth"} {
		dest := e.topo.Delayed(delay, e.origin)
		if err := p.Publish(context.Background(), dest, amqp.Publishing{MessageId: id, Body: []byte(id), Headers: amqp.Table{}}, o.callback(id)); err != nil {
			t.Fatal(err)
		}
	}
	if got := o.wait(t, 2, 10*time.Second); got["third"] != Confirmed || got["fourth"] != Confirmed {
		t.Errorf("outcomes after the second detour: %v", got)
	}
	if notices := e.noticed(); len(notices) != 3 {
		t.Errorf("notices = %q, want three: one more for the detour's queue, none for the fourth copy", notices)
	}
	if to := p.detours[delay.Milliseconds()]; to != delay+3*time.Millisecond {
		t.Errorf("the delay asked for detours to %s, want %s", to, delay+3*time.Millisecond)
	}
	e.waitOrigin(4, "all four copies")
}

// TestReturnIsNeverLostBehindADeclaration: the confirm/return loop must
// not take the declaration lock to forget a returned delay queue. The
// session holds that lock while it waits for a declaration's reply on
// the same connection, whose one reader goroutine may be stuck handing the
// loop the next return; amqp091-go abandons a notification after 5 s, and
// the ack that follows the abandoned return would pass for a confirm: the
// inbox delivery acked, its copy lost.
//
// The test holds the lock, as a declaration waiting for its reply does,
// for longer than those 5 s, while two copies come back unroutable: one
// from a delay queue that is gone (its return is what took the lock), one
// sent to a queue that does not exist. Both must be reported Returned.
func TestReturnIsNeverLostBehindADeclaration(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, false)
	p := e.publisher(16)
	o := newOutcomes()
	// A delay queue the publisher believes declared, and that is gone: its
	// copies come back from its exchange, which is left without a binding.
	gone := 300 * time.Millisecond
	if _, err := p.ensureDelayQueue(gone); err != nil {
		t.Fatal(err)
	}
	q, _ := e.topo.DelayQueue(gone)
	if _, err := e.admin.QueueDelete(q.Name, false, false, false); err != nil {
		t.Fatal(err)
	}
	p.declMu.Lock()
	// Publish would wait for the lock (it checks the delay queue first):
	// send the delayed copy as it does once the queue is known.
	delayed := e.topo.Delayed(gone, e.origin)
	entry := &pending{route: keyOf(delayed), sent: p.now(), done: o.callback("delayed")}
	seq := p.ch.GetNextPublishSeqNo()
	p.mu.Lock()
	p.pending[seq] = entry
	p.mu.Unlock()
	if err := p.ch.PublishWithContext(context.Background(), delayed.Exchange, delayed.RoutingKey, true, false,
		amqp.Publishing{MessageId: "delayed", Headers: amqp.Table{}}); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(context.Background(), topology.Direct(brokertest.Unique(t)+"missing"), msg("direct"), o.callback("direct")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second)
	p.declMu.Unlock()
	got := o.wait(t, 2, 10*time.Second)
	for _, id := range []string{"delayed", "direct"} {
		if got[id] != Returned {
			t.Errorf("copy %s: %v, want returned (a confirmed-but-returned copy is a lost message)", id, got[id])
		}
	}
	// And the publisher declares the delay queue again on next use.
	done := make(chan Outcome, 1)
	if err := p.Publish(context.Background(), delayed, amqp.Publishing{MessageId: "again", Headers: amqp.Table{}},
		func(out Outcome, _ time.Duration) { done <- out }); err != nil {
		t.Fatal(err)
	}
	if out := <-done; out != Confirmed {
		t.Errorf("copy after the queue came back: %v, want confirmed", out)
	}
}

// Many returns at once, more than any listener buffer of the library's
// default, while the publisher's goroutine is kept busy: none may be lost.
func TestReturnsOfAWholeWindow(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, false)
	const window = 200
	p := e.publisher(window)
	o := newOutcomes()
	dest := topology.Direct(brokertest.Unique(t) + "missing")
	for i := range window {
		id := string(rune('a'+i%26)) + time.Duration(i).String()
		if err := p.Publish(context.Background(), dest, msg(id), o.callback(id)); err != nil {
			t.Fatal(err)
		}
	}
	for id, out := range o.wait(t, window, 30*time.Second) {
		if out != Returned {
			t.Errorf("%s: %v, want returned", id, out)
		}
	}
}

func TestQueueExists(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, false)
	for queue, want := range map[string]bool{e.origin: true, brokertest.Unique(t) + "missing": false} {
		got, err := topology.QueueExists(e.conn, queue)
		if err != nil || got != want {
			t.Errorf("topology.QueueExists(%s) = %v, %v; want %v", queue, got, err, want)
		}
	}
	p := e.publisher(4)
	if ok, err := p.OriginExists(e.origin); !ok || err != nil {
		t.Errorf("OriginExists = %v, %v", ok, err)
	}
	// Cached for a minute: the queue's deletion is not seen at once.
	if _, err := e.admin.QueueDelete(e.origin, false, false, false); err != nil {
		t.Fatal(err)
	}
	if ok, _ := p.OriginExists(e.origin); !ok {
		t.Error("OriginExists rechecked within the minute")
	}
	e.clock.advance(2 * originRecheck)
	if ok, err := p.OriginExists(e.origin); ok || err != nil {
		t.Errorf("OriginExists after the recheck = %v, %v; want false", ok, err)
	}
}

// TestOriginExistsWithoutPermission: RabbitMQ 4.2.6 and later refuse a
// passive declaration of a queue the user has no permission on (3.10
// answers it). A refusal must not end the session: the origin counts as
// existing, said once.
func TestOriginExistsWithoutPermission(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, false)
	// Publishing to the default exchange, as rebound's user does, and
	// nothing on the queues.
	_, url := e.broker.User(t, e.broker.URL, "pw", "^x$", `^amq\.default$`, "^x$")
	conn := e.broker.Dial(t, url)

	exists, err := topology.QueueExists(conn, e.origin)
	if e.broker.AtLeast(4, 2) {
		if !errors.Is(err, topology.ErrCheckRefused) {
			t.Fatalf("QueueExists without permission on RabbitMQ %s = %v, %v; want topology.ErrCheckRefused", e.broker.Version(), exists, err)
		}
	} else if !exists || err != nil {
		t.Fatalf("QueueExists without permission on RabbitMQ %s = %v, %v; want true", e.broker.Version(), exists, err)
	}

	p, err := New(conn, e.topo, 4, 30*time.Second, e.notice)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if ok, err := p.OriginExists(e.origin); !ok || err != nil {
			t.Errorf("OriginExists = %v, %v; want true", ok, err)
		}
	}
	if want := map[bool]int{true: 1, false: 0}[e.broker.AtLeast(4, 2)]; len(e.noticed()) != want {
		t.Errorf("notices %q, want %d", e.noticed(), want)
	}

	// A copy sent straight to a queue that does not exist comes back:
	// the broker's own word, which OriginExists then goes by.
	gone := brokertest.Unique(t) + "gone"
	o := newOutcomes()
	if err := p.Publish(context.Background(), topology.Direct(gone), msg("straight"), o.callback("straight")); err != nil {
		t.Fatal(err)
	}
	if got := o.wait(t, 1, 10*time.Second); got["straight"] != Returned {
		t.Fatalf("copy to a missing queue: %v, want Returned", got["straight"])
	}
	if ok, err := p.OriginExists(gone); ok || err != nil {
		t.Errorf("OriginExists(%s) after its copy came back = %v, %v; want false", gone, ok, err)
	}
}

func TestSweepIdleDeletesOnlyEmptyClassicQueues(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, false)
	p := e.publisher(4)
	for _, d := range []time.Duration{time.Second, 2 * time.Second} {
		if _, err := p.ensureDelayQueue(d); err != nil {
			t.Fatal(err)
		}
	}
	busy, _ := e.topo.DelayQueue(2 * time.Second)
	// Confirmed, so the message is in the queue before the sweep looks.
	confirming, err := e.broker.Dial(t, e.broker.URL).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := confirming.Confirm(false); err != nil {
		t.Fatal(err)
	}
	brokertest.PublishConfirmed(t, confirming, busy.Name, msg("waiting"))
	e.clock.advance(time.Hour)

	// While another connection holds the lock of the delay queues (a
	// `rebound delayed` command may hold messages of this one unacked,
	// which if-empty does not see), the sweep deletes nothing.
	other, err := e.broker.Dial(t, e.broker.URL).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.topo.Lock(other); err != nil {
		t.Fatal(err)
	}
	if deleted, err := p.SweepIdle(time.Minute, true); err != nil || len(deleted) != 0 {
		t.Errorf("SweepIdle while another holds the lock = %v, %v; want nothing deleted", deleted, err)
	}
	if len(p.DelayQueues()) != 2 {
		t.Errorf("the Publisher forgot %v while it could not sweep", p.DelayQueues())
	}
	if err := e.topo.Unlock(other); err != nil {
		t.Fatal(err)
	}

	deleted, err := p.SweepIdle(time.Minute, true)
	idle, _ := e.topo.DelayQueue(time.Second)
	if err != nil || len(deleted) != 1 || deleted[0] != idle.Name {
		t.Errorf("SweepIdle = %v, %v; want only %s", deleted, err, idle.Name)
	}
	if n, err := brokertest.QueueLen(e.broker.URL, busy.Name); err != nil || n != 1 {
		t.Errorf("busy delay queue: %d, %v; want kept with its message", n, err)
	}
	// The busy one is still leased; the lock was released.
	if got := p.DelayQueues(); len(got) != 1 || got[0] != busy.Name {
		t.Errorf("DelayQueues after the sweep = %v, want [%s]", got, busy.Name)
	}
	if err := e.topo.Lock(other); err != nil {
		t.Errorf("the sweep kept the lock: %v", err)
	}
}

func TestSweepIdleLeavesQuorumQueues(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, true)
	p := e.publisher(4)
	if _, err := p.ensureDelayQueue(time.Second); err != nil {
		t.Fatal(err)
	}
	e.clock.advance(time.Hour)
	if deleted, err := p.SweepIdle(time.Minute, true); err != nil || len(deleted) != 0 {
		t.Errorf("SweepIdle = %v, %v; quorum delay queues are never swept", deleted, err)
	}
	// Forgotten, so no longer leased, but still there.
	if got := p.DelayQueues(); len(got) != 0 {
		t.Errorf("DelayQueues after the sweep = %v, want none", got)
	}
	q, _ := e.topo.DelayQueue(time.Second)
	if _, err := brokertest.QueueLen(e.broker.URL, q.Name); err != nil {
		t.Errorf("quorum delay queue %s: %v; want it kept", q.Name, err)
	}
}

func TestPublisherReportsClosedChannel(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, false)
	p := e.publisher(4)
	o := newOutcomes()
	// Unconfirmed when the channel dies: published after the close.
	_ = p.ch.Close()
	select {
	case <-p.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after the channel closed")
	}
	if p.Err() == nil {
		t.Error("Err is nil after the channel closed")
	}
	err := p.Publish(context.Background(), topology.Direct(e.origin), msg("late"), o.callback("late"))
	if !errors.Is(err, amqp.ErrClosed) {
		t.Errorf("Publish on a closed channel: %v, want amqp.ErrClosed", err)
	}
}

// Only a refusal for good detours a delay: a declaration that exists with
// other arguments or of another type (PRECONDITION_FAILED), or a broken
// queue (NOT_FOUND). A refused permission or a connection error is not
// the delay queue's fault, and another delay would not fare better.
func TestUnusable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&amqp.Error{Code: amqp.PreconditionFailed, Recover: true}, true},
		{fmt.Errorf("declare queue q: %w", &amqp.Error{Code: amqp.NotFound, Recover: true}), true},
		{&amqp.Error{Code: amqp.AccessRefused, Recover: true}, false},
		{&amqp.Error{Code: amqp.ResourceLocked, Recover: true}, false},
		{&amqp.Error{Code: amqp.InternalError}, false},
		{amqp.ErrClosed, false},
		{errors.New("timeout"), false},
		{nil, false},
	} {
		if got := unusable(tc.err); got != tc.want {
			t.Errorf("unusable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
