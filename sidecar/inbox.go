package sidecar

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// inbox is a session's consumer of the inbox queue, whose prefetch
// follows the window. RabbitMQ fixes a consumer's prefetch when it starts,
// so a new prefetch means a new consumer: the inbox cancels the one it has
// and consumes again. The cancelled consumer's deliveries already sent
// are still read, first, then the new consumer's: delivery tags belong to
// the channel, so the acker settles both alike. While a resource alarm
// blocks publishing, the inbox consumes nothing (paused): amqp091-go
// buffers whatever the broker sends, whether rebound reads it or not, so
// only the broker holding messages back keeps them out of memory.
//
// An inbox is used by the session's goroutine only.
type inbox struct {
	ch    *amqp.Channel
	queue string
	win   *window
	// onPrefetch hears each new prefetch (0 while paused) and the bytes
	// held unacked then.
	onPrefetch func(prefetch int, held int64)
	// settledThrough is the acker's: every delivery up to this tag is
	// settled.
	settledThrough func() uint64

	tag      string // the live consumer, "" while paused
	prefetch int    // the live consumer's prefetch, 0 while paused
	live     <-chan amqp.Delivery
	// reading is the channel read now: the live consumer's, or a
	// cancelled one's until it has handed over every delivery it had.
	reading <-chan amqp.Delivery
	// idleReset is how long without a delivery before the window starts
	// over at one: the next messages may be of any size.
	idleReset time.Duration
	last      time.Time // the last delivery read
	lastTag   uint64    // and its tag
	// retiredThrough is the last delivery of the consumers cancelled so
	// far: once every delivery up to it is settled, only the live
	// consumer's are in flight.
	retiredThrough uint64
}

// start consumes with a prefetch of n.
func (in *inbox) start(n int) error {
	if err := in.ch.Qos(n, 0, false); err != nil {
		return fmt.Errorf("set prefetch %d: %w", n, err)
	}
	tag := fmt.Sprintf("rebound-%016x", rand.Uint64()) // unique, for basic.cancel
	deliveries, err := in.ch.Consume(in.queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", in.queue, err)
	}
	in.tag, in.prefetch, in.live = tag, n, deliveries
	if in.reading == nil {
		in.reading = deliveries
	}
	in.onPrefetch(n, in.win.bytes())
	return nil
}

// stop cancels the live consumer, if any; its deliveries sent already are
// still read.
func (in *inbox) stop() error {
	if in.tag == "" {
		return nil
	}
	tag := in.tag
	in.tag, in.prefetch, in.live = "", 0, nil
	in.onPrefetch(0, in.win.bytes())
	if err := in.ch.Cancel(tag, false); err != nil {
		return fmt.Errorf("cancel consumer %s: %w", tag, err)
	}
	return nil
}

// deliveries is the channel to read now; nil (never ready) while paused
// with nothing left to read.
func (in *inbox) deliveries() <-chan amqp.Delivery { return in.reading }

// ended is called when the channel being read is closed: a cancelled
// consumer has handed over its last delivery, and the live one's come
// next. The live consumer's channel closing is an error: the channel or
// the connection went away.
func (in *inbox) ended() error {
	if in.reading == in.live {
		return errors.New("inbox deliveries stopped")
	}
	in.reading = in.live
	in.retiredThrough = in.lastTag
	return nil
}

// read records a delivery that rebound now holds.
func (in *inbox) read(tag uint64, size int64, now time.Time) {
	in.win.received(size)
	in.last, in.lastTag = now, tag
}

// refit consumes again when the window has moved far enough from the live
// consumer's prefetch: at once to shrink it, and to grow it when it has
// doubled or reached the ceiling, so that slow start costs a few restarts,
// not one a delivery. It waits while a cancelled consumer still hands over
// deliveries; and it grows the window only once every delivery of the
// cancelled consumers is settled, so that the deliveries in flight (what a
// crash hands back to the broker, to deliver again) stay within two
// windows. After idleReset without a delivery, the window starts over at
// one.
func (in *inbox) refit(now time.Time) error {
	if in.tag == "" || in.reading != in.live {
		return nil
	}
	if in.prefetch > 1 && now.Sub(in.last) >= in.idleReset {
		in.win.idle()
	}
	want := in.win.want()
	if want >= in.prefetch && want < 2*in.prefetch && want < in.win.ceiling {
		return nil
	}
	if want == in.prefetch || (want > in.prefetch && in.settledThrough() < in.retiredThrough) {
		return nil
	}
	if err := in.stop(); err != nil {
		return err
	}
	return in.start(want)
}

// pause stops consuming while publishing is blocked; resume starts again
// with the window as it was.
func (in *inbox) pause() error { return in.stop() }

func (in *inbox) resume() error {
	if in.tag != "" {
		return nil
	}
	return in.start(in.win.want())
}
