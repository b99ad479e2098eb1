package consumer

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// fakeChannel models the broker's side of acks: outstanding deliveries, a
// multiple ack settling every outstanding tag up to its own, and an error
// (a channel-closing PRECONDITION_FAILED on a real broker) for a tag that
// is not outstanding. ok says which deliveries' copies were confirmed.
type fakeChannel struct {
	mu          sync.Mutex
	outstanding map[uint64]bool
	ok          map[uint64]bool
	acked       map[uint64]bool
	requeued    map[uint64]bool
	calls       int
	violations  []string
}

var _ acknowledger = (*fakeChannel)(nil)

func newFakeChannel(n int) *fakeChannel {
	f := &fakeChannel{outstanding: map[uint64]bool{}, ok: map[uint64]bool{}, acked: map[uint64]bool{}, requeued: map[uint64]bool{}}
	for tag := uint64(1); tag <= uint64(n); tag++ {
		f.outstanding[tag] = true
	}
	return f
}

func (f *fakeChannel) Ack(tag uint64, multiple bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if !f.outstanding[tag] {
		return fmt.Errorf("PRECONDITION_FAILED - unknown delivery tag %d", tag)
	}
	for t := range f.outstanding {
		if t == tag || (multiple && t < tag) {
			if !f.ok[t] {
				f.violations = append(f.violations, fmt.Sprintf("ack of %d (multiple=%v) covers %d whose copy was not confirmed", tag, multiple, t))
			}
			delete(f.outstanding, t)
			f.acked[t] = true
		}
	}
	return nil
}

func (f *fakeChannel) Nack(tag uint64, multiple, requeue bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if !f.outstanding[tag] || multiple || !requeue {
		return fmt.Errorf("unexpected nack %d multiple=%v requeue=%v", tag, multiple, requeue)
	}
	delete(f.outstanding, tag)
	f.requeued[tag] = true
	return nil
}

// TestAckerSettlesEveryDeliveryOnceAndNeverAcksAFailure resolves random
// windows of deliveries in random order with random outcomes.
func TestAckerSettlesEveryDeliveryOnceAndNeverAcksAFailure(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		n := 1 + rng.IntN(300)
		f := newFakeChannel(n)
		for tag := uint64(1); tag <= uint64(n); tag++ {
			f.ok[tag] = rng.Float64() < 0.9
		}
		a := newAcker(f, nil)
		stop := make(chan struct{})
		errc := make(chan error, 1)
		go func() { errc <- a.run(stop) }()
		for tag := uint64(1); tag <= uint64(n); tag++ {
			a.add(tag, 100)
		}
		order := rng.Perm(n)
		for _, i := range order {
			tag := uint64(i + 1)
			a.resolve(tag, f.ok[tag])
		}
		deadline := time.Now().Add(5 * time.Second)
		for a.inflight.Load() != 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		close(stop)
		if err := <-errc; err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		f.mu.Lock()
		if len(f.violations) > 0 {
			t.Fatalf("round %d: %v", round, f.violations)
		}
		if len(f.outstanding) != 0 {
			t.Fatalf("round %d: %d deliveries never settled", round, len(f.outstanding))
		}
		for tag := uint64(1); tag <= uint64(n); tag++ {
			if f.ok[tag] != f.acked[tag] || f.ok[tag] == f.requeued[tag] {
				t.Fatalf("round %d: tag %d ok=%v acked=%v requeued=%v", round, tag, f.ok[tag], f.acked[tag], f.requeued[tag])
			}
		}
		f.mu.Unlock()
	}
}

// TestAckerUsesMultipleAcks checks that a run of confirms resolved before
// the acker looks is settled with fewer calls than deliveries.
func TestAckerUsesMultipleAcks(t *testing.T) {
	const n = 100
	f := newFakeChannel(n)
	a := newAcker(f, nil)
	for tag := uint64(1); tag <= n; tag++ {
		f.ok[tag] = true
		a.add(tag, 100)
		a.resolve(tag, true)
	}
	stop := make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- a.run(stop) }()
	for a.inflight.Load() != 0 {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if f.calls != 1 {
		t.Errorf("settled %d confirmed deliveries with %d calls, want 1 multiple ack", n, f.calls)
	}
}

// TestAckerHoldsAckBehindUnresolvedDelivery: a confirmed delivery behind
// one still waiting is not acked, because a multiple ack would cover it.
func TestAckerHoldsAckBehindUnresolvedDelivery(t *testing.T) {
	f := newFakeChannel(3)
	f.ok[1], f.ok[2], f.ok[3] = true, true, true
	a := newAcker(f, nil)
	stop := make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- a.run(stop) }()
	for tag := uint64(1); tag <= 3; tag++ {
		a.add(tag, 100)
	}
	a.resolve(2, true)
	a.resolve(3, true)
	time.Sleep(50 * time.Millisecond)
	f.mu.Lock()
	early := len(f.acked)
	f.mu.Unlock()
	if early != 0 {
		t.Fatalf("acked %d deliveries while delivery 1 was unresolved", early)
	}
	a.resolve(1, true)
	for a.inflight.Load() != 0 {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if len(f.acked) != 3 {
		t.Errorf("acked %d, want 3", len(f.acked))
	}
}

// TestAckerRequeuesDeliveriesTheSessionNeverSaw: deliveries the broker
// sent but the session never took (amqp091-go dropped them) are requeued,
// never covered by a multiple ack, and do not count as failed copies.
func TestAckerRequeuesDeliveriesTheSessionNeverSaw(t *testing.T) {
	const n = 10
	f := newFakeChannel(n)
	a := newAcker(f, nil)
	never := map[uint64]bool{3: true, 4: true, 8: true}
	for tag := uint64(1); tag <= n; tag++ {
		if never[tag] {
			a.requeue(tag)
			continue
		}
		f.ok[tag] = true
		a.add(tag, 100)
		a.resolve(tag, true)
	}
	if streak := a.failStreak.Load(); streak != 0 {
		t.Errorf("fail streak %d after requeueing deliveries that had no copy, want 0", streak)
	}
	stop := make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- a.run(stop) }()
	if !brokertest.Await(10*time.Second, func() bool { return a.inflight.Load() == 0 }) {
		t.Fatalf("%d deliveries still in flight", a.inflight.Load())
	}
	close(stop)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, v := range f.violations {
		t.Error(v)
	}
	for tag := uint64(1); tag <= n; tag++ {
		if got := f.requeued[tag]; got != never[tag] {
			t.Errorf("delivery %d requeued: %v, want %v", tag, got, never[tag])
		}
		if got := f.acked[tag]; got == never[tag] {
			t.Errorf("delivery %d acked: %v, want %v", tag, got, !never[tag])
		}
	}
}
