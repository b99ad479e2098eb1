package sidecar

import (
	"fmt"
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
// confirmed. All acks happen on the acker's goroutine, in order.
type acker struct {
	ch     acknowledger
	events chan ackEvent
	queue  []*slot
	slots  map[uint64]*slot

	inflight   atomic.Int64 // registered and not yet settled
	failStreak atomic.Int64 // consecutive failed outcomes, for backing off
	onSettle   func(settled int, inflight int)
}

// acknowledger is the part of *amqp.Channel the acker uses.
type acknowledger interface {
	Ack(tag uint64, multiple bool) error
	Nack(tag uint64, multiple, requeue bool) error
}

var _ acknowledger = (*amqp.Channel)(nil)

type slot struct {
	tag      uint64
	resolved bool
	ok       bool
}

type ackEvent struct {
	tag      uint64
	resolved bool // false: register the tag
	ok       bool
}

// newAcker sizes the event buffer so that resolve never blocks: at most
// window deliveries are unacked, each producing one registration and one
// outcome.
func newAcker(ch acknowledger, window int, onSettle func(settled, inflight int)) *acker {
	return &acker{
		ch:       ch,
		events:   make(chan ackEvent, 2*window+16),
		slots:    make(map[uint64]*slot, window),
		onSettle: onSettle,
	}
}

// add registers a delivery before its copy is published.
func (a *acker) add(tag uint64) {
	a.inflight.Add(1)
	a.events <- ackEvent{tag: tag}
}

// resolve records the outcome of a delivery's copy. It never blocks.
func (a *acker) resolve(tag uint64, ok bool) {
	if ok {
		a.failStreak.Store(0)
	} else {
		a.failStreak.Add(1)
	}
	a.events <- ackEvent{tag: tag, resolved: true, ok: ok}
}

// run settles deliveries until stop is closed or an ack fails (the channel
// is gone; the broker requeues whatever was not acked).
func (a *acker) run(stop <-chan struct{}) error {
	for {
		select {
		case <-stop:
			return nil
		case ev := <-a.events:
			a.apply(ev)
			// Take whatever else is ready so that a run of confirms
			// shares one multiple ack.
			for more := true; more; {
				select {
				case ev := <-a.events:
					a.apply(ev)
				default:
					more = false
				}
			}
			if err := a.settle(); err != nil {
				return err
			}
		}
	}
}

func (a *acker) apply(ev ackEvent) {
	if !ev.resolved {
		s := &slot{tag: ev.tag}
		a.queue = append(a.queue, s)
		a.slots[ev.tag] = s
		return
	}
	if s, ok := a.slots[ev.tag]; ok {
		s.resolved, s.ok = true, ev.ok
	}
}

func (a *acker) settle() error {
	var ackUpTo uint64
	settled := 0
	for len(a.queue) > 0 && a.queue[0].resolved {
		s := a.queue[0]
		a.queue[0] = nil
		a.queue = a.queue[1:]
		delete(a.slots, s.tag)
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
	if settled > 0 {
		inflight := a.inflight.Add(int64(-settled))
		if a.onSettle != nil {
			a.onSettle(settled, int(inflight))
		}
	}
	if len(a.queue) == 0 && cap(a.queue) > 4096 {
		a.queue = nil // do not keep a large backing array alive
	}
	return nil
}
