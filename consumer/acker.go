package consumer

import (
	"fmt"
	"sync"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"
)

// acker acknowledges inbox deliveries once their copies are confirmed.
//
// Deliveries are registered in delivery-tag order before their copy is
// published; outcomes arrive in any order. The acker keeps a FIFO of
// registered tags and settles it from the front only: a confirmed run is
// acked with one multiple ack, a failed delivery is nacked with requeue
// first, so a multiple ack never covers a delivery whose copy was not
// confirmed. All acks happen on the acker's goroutine, in order. It
// reports the bytes of the deliveries it settles, for the window.
//
// Registrations and outcomes reach that goroutine through a mailbox (a
// slice behind a mutex held only to append or swap), not a channel: the
// publisher's confirm loop reports outcomes and must never block, and the
// number of deliveries in flight is not fixed while the window changes.
type acker struct {
	ch acknowledger

	mu      sync.Mutex
	mailbox []ackEvent    // posted, not yet taken by run
	wake    chan struct{} // a post since run last looked
	spare   []ackEvent    // run's alone: the mailbox's other buffer

	queue   []*slot
	slots   map[uint64]*slot
	lastTag uint64 // the last delivery registered

	// settledThrough is the highest tag up to which every delivery
	// registered is settled.
	settledThrough atomic.Uint64

	inflight   atomic.Int64 // registered and not yet settled
	failStreak atomic.Int64 // consecutive failed outcomes, for backing off
	onSettle   func(settled, inflight int, bytes int64)
}

// acknowledger is the part of *amqp.Channel the acker uses.
type acknowledger interface {
	Ack(tag uint64, multiple bool) error
	Nack(tag uint64, multiple, requeue bool) error
}

var _ acknowledger = (*amqp.Channel)(nil)

type slot struct {
	tag      uint64
	size     int64
	resolved bool
	ok       bool
}

type ackEvent struct {
	tag      uint64
	size     int64
	resolved bool // false: register the tag
	ok       bool
}

// newAcker returns an acker for ch. onSettle, when not nil, hears on the
// acker's goroutine how many deliveries were settled, how many remain and
// the settled ones' bytes.
func newAcker(ch acknowledger, onSettle func(settled, inflight int, bytes int64)) *acker {
	return &acker{
		ch:       ch,
		wake:     make(chan struct{}, 1),
		slots:    make(map[uint64]*slot),
		onSettle: onSettle,
	}
}

// add registers a delivery of size bytes before its copy is published.
func (a *acker) add(tag uint64, size int64) {
	a.inflight.Add(1)
	a.post(ackEvent{tag: tag, size: size})
}

// requeue registers a delivery that never reached the session, to be
// nacked with requeue in its turn, so that no multiple ack covers it and
// the broker delivers it again. It is not a failed copy: the backing off
// does not count it.
func (a *acker) requeue(tag uint64) {
	a.inflight.Add(1)
	a.post(ackEvent{tag: tag})
	a.post(ackEvent{tag: tag, resolved: true})
}

// resolve records the outcome of a delivery's copy. It never blocks.
func (a *acker) resolve(tag uint64, ok bool) {
	if ok {
		a.failStreak.Store(0)
	} else {
		a.failStreak.Add(1)
	}
	a.post(ackEvent{tag: tag, resolved: true, ok: ok})
}

// refused records that a delivery's copy was refused by its origin queue:
// the delivery is requeued, like a failed one, but the backing off does
// not count it. The origin is backed off on its own (refusals), and the
// other origins' retries must not slow down for it.
func (a *acker) refused(tag uint64) {
	a.post(ackEvent{tag: tag, resolved: true})
}

func (a *acker) post(ev ackEvent) {
	a.mu.Lock()
	a.mailbox = append(a.mailbox, ev)
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default: // run has a wake-up pending already
	}
}

// run settles deliveries until stop is closed or an ack fails (the channel
// is gone; the broker requeues whatever was not acked). Everything posted
// since the last round is applied before settling, so that a run of
// confirms shares one multiple ack.
func (a *acker) run(stop <-chan struct{}) error {
	for {
		select {
		case <-stop:
			return nil
		case <-a.wake:
			a.mu.Lock()
			events := a.mailbox
			a.mailbox = a.spare[:0]
			a.mu.Unlock()
			for _, ev := range events {
				a.apply(ev)
			}
			a.spare = events
			if err := a.settle(); err != nil {
				return err
			}
		}
	}
}

func (a *acker) apply(ev ackEvent) {
	if !ev.resolved {
		s := &slot{tag: ev.tag, size: ev.size}
		a.queue = append(a.queue, s)
		a.slots[ev.tag] = s
		a.lastTag = ev.tag
		return
	}
	if s, ok := a.slots[ev.tag]; ok {
		s.resolved, s.ok = true, ev.ok
	}
}

func (a *acker) settle() error {
	var ackUpTo uint64
	settled := 0
	var bytes int64
	for len(a.queue) > 0 && a.queue[0].resolved {
		s := a.queue[0]
		a.queue[0] = nil
		a.queue = a.queue[1:]
		delete(a.slots, s.tag)
		bytes += s.size
		settled++
		if s.ok {
			ackUpTo = s.tag
			continue
		}
		if ackUpTo > 0 {
			if err := a.ch.Ack(ackUpTo, true); err != nil {
				return fmt.Errorf("ack inbox deliveries up to %d: %w", ackUpTo, err)
			}
			ackUpTo = 0
		}
		if err := a.ch.Nack(s.tag, false, true); err != nil {
			return fmt.Errorf("requeue inbox delivery %d: %w", s.tag, err)
		}
	}
	if ackUpTo > 0 {
		if err := a.ch.Ack(ackUpTo, true); err != nil {
			return fmt.Errorf("ack inbox deliveries up to %d: %w", ackUpTo, err)
		}
	}
	if len(a.queue) > 0 {
		a.settledThrough.Store(a.queue[0].tag - 1)
	} else {
		a.settledThrough.Store(a.lastTag)
	}
	if settled > 0 {
		inflight := a.inflight.Add(int64(-settled))
		if a.onSettle != nil {
			a.onSettle(settled, int(inflight), bytes)
		}
	}
	if len(a.queue) == 0 && cap(a.queue) > 4096 {
		a.queue = nil // do not keep a large backing array alive
	}
	return nil
}
