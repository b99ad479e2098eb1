package delayqueue

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/topology"
)

// testEnv is a deployment of its own for one test, with a clock the test
// moves.
type testEnv struct {
	*brokertest.Deployment
	topo  topology.Topology
	clock brokertest.Clock // the time the test's Sets see
}

func newEnv(t *testing.T, quorum bool) *testEnv {
	t.Helper()
	d := brokertest.NewDeployment(t, brokertest.Require(t), nil, nil)
	e := &testEnv{Deployment: d, topo: d.Topology(quorum)}
	if _, err := declarer.Declare(d.Conn, e.topo); err != nil {
		t.Fatal(err)
	}
	return e
}

// set returns a Set on a connection of its own, closed at cleanup, that
// has declared the delay queues of delays.
func (e *testEnv) set(delays ...time.Duration) *Set {
	e.T.Helper()
	s, err := New(e.Broker.Dial(e.T, e.Broker.URL), e.topo, nil, e.clock.Now)
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(s.Close)
	for _, d := range delays {
		if _, err := s.Ensure(d); err != nil {
			e.T.Fatal(err)
		}
	}
	return s
}

// TestForgetNeverWaitsForADeclaration: the Publisher's confirm/return
// loop calls Forget when a copy comes back from a delay queue, and must
// never wait on anything that waits on the broker (amqp091-go abandons a
// notification its listener does not take within 5 s: the ack after an
// abandoned return would pass for a confirm). Forget returns while the
// declaration lock is held, as it is during a declaration's round trip,
// and the next Ensure declares the queue again.
func TestForgetNeverWaitsForADeclaration(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	s := e.set(time.Second)
	q, _ := e.topo.DelayQueue(time.Second)
	if _, err := e.Ch.QueueDelete(q.Name, false, false, false); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.Forget(time.Second.Milliseconds())
	s.mu.Unlock()
	if _, err := s.Ensure(time.Second); err != nil {
		t.Fatal(err)
	}
	if n, err := brokertest.QueueLen(e.Broker.URL, q.Name); err != nil || n != 0 {
		t.Errorf("delay queue %s after Forget and Ensure: %d, %v; want declared again, empty", q.Name, n, err)
	}
}

func TestSweepIdleDeletesOnlyEmptyClassicQueues(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	// The busy queue's delay outlasts the test: its message must not
	// expire (and leave the queue empty) before the sweep looks.
	s := e.set(time.Second, 10*time.Minute)
	busy, _ := e.topo.DelayQueue(10 * time.Minute)
	// Confirmed, so the message is in the queue before the sweep looks.
	confirming, err := e.Broker.Dial(t, e.Broker.URL).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := confirming.Confirm(false); err != nil {
		t.Fatal(err)
	}
	brokertest.PublishConfirmed(t, confirming, busy.Name, amqp.Publishing{MessageId: "waiting", DeliveryMode: amqp.Persistent})
	e.clock.Advance(time.Hour)

	// While another connection holds the lock of the delay queues (a
	// `rebound delayed` command may hold messages of this one unacked,
	// which if-empty does not see), the sweep deletes nothing.
	other, err := e.Broker.Dial(t, e.Broker.URL).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := tryLock(other, e.topo); err != nil {
		t.Fatal(err)
	}
	if deleted, err := s.SweepIdle(time.Minute, true); err != nil || len(deleted) != 0 {
		t.Errorf("SweepIdle while another holds the lock = %v, %v; want nothing deleted", deleted, err)
	}
	if len(s.Names()) != 2 {
		t.Errorf("the Set forgot %v while it could not sweep", s.Names())
	}
	if err := unlock(other, e.topo); err != nil {
		t.Fatal(err)
	}

	deleted, err := s.SweepIdle(time.Minute, true)
	idle, _ := e.topo.DelayQueue(time.Second)
	if err != nil || len(deleted) != 1 || deleted[0] != idle.Name {
		t.Errorf("SweepIdle = %v, %v; want only %s", deleted, err, idle.Name)
	}
	if n, err := brokertest.QueueLen(e.Broker.URL, busy.Name); err != nil || n != 1 {
		t.Errorf("busy delay queue: %d, %v; want kept with its message", n, err)
	}
	// The busy one is still leased; the lock was released.
	if got := s.Names(); len(got) != 1 || got[0] != busy.Name {
		t.Errorf("DelayQueues after the sweep = %v, want [%s]", got, busy.Name)
	}
	if err := tryLock(other, e.topo); err != nil {
		t.Errorf("the sweep kept the lock: %v", err)
	}
}

// TestSweepIdleWithoutTheLockDeletesNothing: rebound's user may lack
// the permission to take the lock (permissions from before it) while a
// command run as another user holds it, with a delay queue's last copy
// read and unacked (a console flush), which if-empty does not see. The
// sweep forgets the idle queue and deletes nothing, so the copy the
// command hands back finds its queue.
func TestSweepIdleWithoutTheLockDeletesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	_, noLock := e.Broker.User(t, e.URL(), "", "^(?!"+regexp.QuoteMeta(e.topo.LockQueue())+"$).*", ".*", ".*")
	s, err := New(e.Broker.Dial(t, noLock), e.topo, nil, e.clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Ensure(10 * time.Minute); err != nil {
		t.Fatal(err)
	}
	q, _ := e.topo.DelayQueue(10 * time.Minute)

	console, err := e.Broker.Dial(t, e.URL()).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := console.Confirm(false); err != nil {
		t.Fatal(err)
	}
	brokertest.PublishConfirmed(t, console, q.Name, amqp.Publishing{MessageId: "last", DeliveryMode: amqp.Persistent})
	if err := tryLock(console, e.topo); err != nil {
		t.Fatal(err)
	}
	held, ok, err := console.Get(q.Name, false)
	if err != nil || !ok {
		t.Fatalf("get the delay queue's copy: %v, %v", ok, err)
	}

	e.clock.Advance(time.Hour)
	if deleted, err := s.SweepIdle(time.Minute, true); err != nil || len(deleted) != 0 {
		t.Errorf("SweepIdle without the lock = %v, %v; want nothing deleted", deleted, err)
	}
	if len(s.Names()) != 0 {
		t.Errorf("the Set still leases %v after the sweep; want the idle queue forgotten", s.Names())
	}
	if err := held.Nack(false, true); err != nil {
		t.Fatal(err)
	}
	if n, err := brokertest.QueueLen(e.Broker.URL, q.Name); err != nil || n != 1 {
		t.Errorf("delay queue %s after the held copy went back: %d, %v; want it there with the copy", q.Name, n, err)
	}
}

func TestSweepIdleLeavesQuorumQueues(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	s := e.set(time.Second)
	e.clock.Advance(time.Hour)
	if deleted, err := s.SweepIdle(time.Minute, true); err != nil || len(deleted) != 0 {
		t.Errorf("SweepIdle = %v, %v; quorum delay queues are never swept", deleted, err)
	}
	// Forgotten, so no longer leased, but still there.
	if got := s.Names(); len(got) != 0 {
		t.Errorf("DelayQueues after the sweep = %v, want none", got)
	}
	q, _ := e.topo.DelayQueue(time.Second)
	if _, err := brokertest.QueueLen(e.Broker.URL, q.Name); err != nil {
		t.Errorf("quorum delay queue %s: %v; want it kept", q.Name, err)
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

// TestLeaseReadsBack: a lease reads back as it was published, with an
// expiry the broker applies; one that is not JSON is an error.
func TestLeaseReadsBack(t *testing.T) {
	lease := Lease{Replica: "pod-a #0001", Queues: []string{"rebound.delay.1000", "rebound.delay.2000"}, Sequence: 3}
	msg := lease.publishing(3 * time.Minute)
	if msg.Expiration != "180000" || msg.DeliveryMode != amqp.Persistent {
		t.Errorf("lease published with expiration %q, delivery mode %d", msg.Expiration, msg.DeliveryMode)
	}
	got, err := ReadLease(msg.Body)
	if err != nil || got.Replica != lease.Replica || got.Sequence != lease.Sequence || !slices.Equal(got.Queues, lease.Queues) {
		t.Errorf("lease read back as %+v, %v; want %+v", got, err, lease)
	}
	if _, err := ReadLease([]byte("not json")); err == nil {
		t.Error("a lease that is not JSON was read without an error")
	}
}

// TestPublishLease: the lease a Set publishes waits in the in-use queue,
// naming the queues it was given.
func TestPublishLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	s := e.set()
	want := Lease{Replica: "pod-a", Queues: []string{"q1"}, Sequence: 1}
	if err := s.PublishLease(want, time.Hour); err != nil {
		t.Fatal(err)
	}
	got, err := ReadLease(e.Get(e.topo.InUseQueue(), 10*time.Second).Body)
	if err != nil || got.Replica != want.Replica || !slices.Equal(got.Queues, want.Queues) {
		t.Errorf("lease in %s: %+v, %v; want %+v", e.topo.InUseQueue(), got, err, want)
	}
}

// TestLockWaitsThenGivesUp: while one connection holds the lock of the
// delay queues, Lock on another tries again until its wait is over and
// then says who may hold it, or stops at once when its context ends; once
// released, the lock is the other's at the first try.
func TestLockWaitsThenGivesUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	holder, rival := e.Broker.Dial(t, e.Broker.URL), e.Broker.Dial(t, e.Broker.URL)
	release, err := Lock(t.Context(), holder, e.topo, 0)
	if err != nil {
		t.Fatal(err)
	}
	const wait = 500 * time.Millisecond
	start := time.Now()
	if _, err := Lock(t.Context(), rival, e.topo, wait); !errors.Is(err, errLocked) || time.Since(start) < wait {
		t.Errorf("Lock while held = %v after %s, want errLocked after %s", err, time.Since(start), wait)
	}
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Lock(cancelled, rival, e.topo, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("Lock with its context ended = %v, want context.Canceled", err)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	again, err := Lock(t.Context(), rival, e.topo, 0)
	if err != nil {
		t.Fatalf("Lock once released = %v", err)
	}
	if err := again(); err != nil {
		t.Error(err)
	}
}
