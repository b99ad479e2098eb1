package republisher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/topology"
)

// Tests of the Publisher and Declare against the broker under test.

// testEnv is one test's topology on the broker, deleted at cleanup.
type testEnv struct {
	*brokertest.Deployment
	t       *testing.T
	broker  *brokertest.Broker
	conn    *amqp.Connection // the publisher's
	admin   *amqp.Channel    // the test's own, in confirm mode
	topo    topology.Topology
	origin  string             // an application queue
	notices brokertest.Notices // what e's publishers noticed
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
	if _, err := declarer.Declare(e.conn, e.topo); err != nil {
		e.t.Fatal(err)
	}
	p, err := newPublisher(e.conn, e.topo, window, 30*time.Second, e.notices.Add, time.Now)
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
	delayed := e.topo.Delayed(200 * time.Millisecond)
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
	// The delayed copy waits its delay, then comes back to the inbox under
	// its routing key (topology.Topology.Delayed).
	e.waitOrigin(1, "the direct one")
	e.WaitQueueLen(e.topo.InboxQueue, 1, 10*time.Second)
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
		dest := e.topo.Delayed(delay)
		if err := p.Publish(context.Background(), dest, amqp.Publishing{MessageId: id, Body: []byte(id), Headers: amqp.Table{}}, o.callback(id)); err != nil {
			t.Fatal(err)
		}
	}
	for id, out := range o.wait(t, 2, 10*time.Second) {
		if out != Confirmed {
			t.Errorf("%s: %v, want Confirmed", id, out)
		}
	}
	if notices := e.notices.List(); len(notices) != 2 {
		t.Errorf("notices = %q, want two, both for the first copy", notices)
	}
	detour, _ := e.topo.DelayQueue(delay + 2*time.Millisecond)
	if !slices.Contains(p.Delays().Names(), detour.Name) {
		t.Errorf("%s was not declared", detour.Name)
	}
	e.WaitQueueLen(e.topo.InboxQueue, 2, 10*time.Second) // both copies, back from their delay
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
	p.Delays().Forget((delay + 2*time.Millisecond).Milliseconds()) // as a return from it does
	for _, id := range []string{"third", "fourth"} {
		dest := e.topo.Delayed(delay)
		if err := p.Publish(context.Background(), dest, amqp.Publishing{MessageId: id, Body: []byte(id), Headers: amqp.Table{}}, o.callback(id)); err != nil {
			t.Fatal(err)
		}
	}
	if got := o.wait(t, 2, 10*time.Second); got["third"] != Confirmed || got["fourth"] != Confirmed {
		t.Errorf("outcomes after the second detour: %v", got)
	}
	if notices := e.notices.List(); len(notices) != 3 {
		t.Errorf("notices = %q, want three: one more for the detour's queue, none for the fourth copy", notices)
	}
	if to, err := p.Delays().Ensure(delay); err != nil || to != delay+3*time.Millisecond {
		t.Errorf("the delay asked for detours to %s (%v), want %s", to, err, delay+3*time.Millisecond)
	}
	e.WaitQueueLen(e.topo.InboxQueue, 4, 10*time.Second) // all four copies, back from their delay
}

// TestReturnIsNeverLostBehindADeclaration: the confirm/return loop must
// not take the declaration lock to forget a returned delay queue. The
// session holds that lock while it waits for a declaration's reply on
// the same connection, whose one reader goroutine may be stuck handing the
// loop the next return; amqp091-go abandons a notification after 5 s, and
// the ack that follows the abandoned return would pass for a confirm: the
// inbox delivery acked, its copy lost. The loop only calls
// delayqueue.Set.Forget, which takes no lock held across I/O (delayqueue's
// TestForgetNeverWaitsForADeclaration holds the declaration lock while it
// forgets).
//
// Two copies come back unroutable: one from a delay queue that is gone
// (its return is what the loop forgets), one sent to a queue that does
// not exist. Both must be reported Returned, and the delay queue is
// declared again on next use.
func TestReturnIsNeverLostBehindADeclaration(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, false)
	p := e.publisher(16)
	o := newOutcomes()
	// A delay queue the publisher believes declared, and that is gone: its
	// copies come back from its exchange, which is left without a binding.
	gone := 300 * time.Millisecond
	if _, err := p.Delays().Ensure(gone); err != nil {
		t.Fatal(err)
	}
	q, _ := e.topo.DelayQueue(gone)
	if _, err := e.admin.QueueDelete(q.Name, false, false, false); err != nil {
		t.Fatal(err)
	}
	delayed := e.topo.Delayed(gone)
	if err := p.Publish(context.Background(), delayed, amqp.Publishing{MessageId: "delayed", Headers: amqp.Table{}}, o.callback("delayed")); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(context.Background(), topology.Direct(brokertest.Unique(t)+"missing"), msg("direct"), o.callback("direct")); err != nil {
		t.Fatal(err)
	}
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
	start := time.Now()
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
	// What declarer.Origins goes by when the broker will not let rebound
	// check a queue.
	if !p.ReturnedSince(dest.RoutingKey, start) || p.ReturnedSince(dest.RoutingKey, time.Now().Add(time.Second)) || p.ReturnedSince(e.origin, start) {
		t.Errorf("ReturnedSince: want %s returned since the start, not later, and %s never", dest.RoutingKey, e.origin)
	}
}

// TestOutcomeWords: every outcome names itself, and every one but
// Confirmed says why its message stays where it was.
func TestOutcomeWords(t *testing.T) {
	for _, tc := range []struct {
		o     Outcome
		name  string
		stays bool
	}{
		{Confirmed, "confirmed", false},
		{Nacked, "nack", true},
		{Returned, "return", true},
		{TimedOut, "timeout", true},
		{Closed, "closed", true},
		{Outcome(9), "outcome(9)", true},
	} {
		if got := tc.o.String(); got != tc.name {
			t.Errorf("String() = %q, want %q", got, tc.name)
		}
		if why := tc.o.Why(); (why != "") != tc.stays {
			t.Errorf("%s: Why() = %q, want a reason: %v", tc.name, why, tc.stays)
		}
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

// TestRefusedCopyIsNeverConfirmedByALaterAck: on one confirm channel, a
// copy to a full origin (x-max-length 0, reject-publish) is nacked at
// once, while the quorum delay queue copies on either side of it are
// acked later, by one basic.ack with multiple=true that covers its tag.
// amqp091-go v1.16.0's NotifyPublish then reports the nacked tag as acked
// (confirms.Multiple); each publish's DeferredConfirmation keeps the nack.
// A refused copy reported Confirmed has its inbox delivery acked: the
// message is lost. Without the deferred confirmations most rounds show it
// on 3.10 and 4.3 alike (scripts/probenack).
func TestRefusedCopyIsNeverConfirmedByALaterAck(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, true)
	p := e.publisher(64)
	full := e.Prefix + "full"
	e.Declare(full, amqp.Table{amqp.QueueMaxLenArg: int64(0), amqp.QueueOverflowArg: amqp.QueueOverflowRejectPublish})
	delayed := e.topo.Delayed(10 * time.Minute)
	// Each round sends its copies in one burst, a refused one between
	// every two delayed ones, and then waits for every outcome: the nacks
	// come at once, the acks when the quorum queue has written a batch.
	const rounds, refusedPerRound = 10, 10
	misreported := 0
	for r := range rounds {
		o := newOutcomes()
		ids := map[string]topology.Destination{}
		for i := range 2*refusedPerRound + 1 {
			id, dest := fmt.Sprintf("%d-%d", r, i), delayed
			if i%2 == 1 {
				dest = topology.Direct(full)
			}
			ids[id] = dest
			if err := p.Publish(context.Background(), dest, msg(id), o.callback(id)); err != nil {
				t.Fatal(err)
			}
		}
		got := o.wait(t, len(ids), 30*time.Second)
		for id, dest := range ids {
			want := Confirmed
			if dest.RoutingKey == full {
				want = Nacked
			}
			switch {
			case got[id] == want:
			case want == Nacked && got[id] == Confirmed:
				misreported++
			default:
				t.Errorf("round %d, copy %s to %q/%q: %v, want %v", r, id, dest.Exchange, dest.RoutingKey, got[id], want)
			}
		}
	}
	if misreported > 0 {
		t.Errorf("%d of %d copies the full queue refused were reported confirmed: their messages would be lost", misreported, rounds*refusedPerRound)
	}
}
