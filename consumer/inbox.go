package consumer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// inbox is a session's consumer of the inbox queue, whose prefetch
// follows the window. RabbitMQ fixes a consumer's prefetch when it starts,
// so a new prefetch means a new consumer: the inbox cancels the one it has
// and consumes again. The cancelled consumer's deliveries already sent
// are still read, first, then the new consumer's: delivery tags belong to
// the channel, so the acker settles both alike.
//
// The replacement runs on a goroutine of its own, and the session goes on
// reading deliveries meanwhile: basic.cancel-ok comes after every
// delivery the broker sent the cancelled consumer, and the meter may hold
// those back until the session has taken some (a session waiting for the
// reply would wait forever).
//
// An inbox is used by the session's goroutine only, but for the
// goroutines it starts, which it waits for in wait.
type inbox struct {
	ch    *amqp.Channel
	queue string
	win   *window
	// onPrefetch hears each new prefetch.
	onPrefetch func(prefetch int)
	// settledThrough is the acker's: every delivery up to this tag is
	// settled.
	settledThrough func() uint64
	// idleReset is how long without a delivery before the window starts
	// over at one: the next messages may be of any size.
	idleReset time.Duration

	tag      string // the live consumer; "" while being replaced, or stopped
	prefetch int    // the live consumer's prefetch
	live     <-chan amqp.Delivery
	// reading is the channel read now: the live consumer's, or a
	// cancelled one's until it has handed over every delivery it had; nil
	// while there is neither. readingTag is its consumer's tag.
	reading    <-chan amqp.Delivery
	readingTag string
	replaced   chan replacement // a replacement's outcome, when one runs
	running    sync.WaitGroup   // replacements and cancels under way

	last    time.Time // the last delivery taken
	lastTag uint64    // and its tag
	// retiredThrough is the last delivery of the consumers cancelled so
	// far: once every delivery up to it is settled, only the live
	// consumer's are in flight.
	retiredThrough uint64
}

// replacement is a new consumer, or why there is none.
type replacement struct {
	tag        string
	prefetch   int
	deliveries <-chan amqp.Delivery
	err        error
}

// consume starts a consumer with a prefetch of n.
func (in *inbox) consume(n int) replacement {
	if err := in.ch.Qos(n, 0, false); err != nil {
		return replacement{err: fmt.Errorf("set prefetch %d: %w", n, err)}
	}
	tag := fmt.Sprintf("rebound-%016x", rand.Uint64()) // unique, for basic.cancel
	deliveries, err := in.ch.Consume(in.queue, tag, false, false, false, false, nil)
	if err != nil {
		return replacement{err: fmt.Errorf("consume %s: %w", in.queue, err)}
	}
	return replacement{tag: tag, prefetch: n, deliveries: deliveries}
}

// start consumes with a prefetch of n, at the session's start.
func (in *inbox) start(n int) error {
	in.replaced = make(chan replacement, 1)
	return in.install(in.consume(n))
}

// install makes r the live consumer.
func (in *inbox) install(r replacement) error {
	if r.err != nil {
		return r.err
	}
	in.tag, in.prefetch, in.live = r.tag, r.prefetch, r.deliveries
	if in.reading == nil {
		in.reading, in.readingTag = r.deliveries, r.tag
	}
	in.onPrefetch(r.prefetch)
	return nil
}

// deliveries is the channel to read now; nil (never ready) while there is
// nothing to read.
func (in *inbox) deliveries() <-chan amqp.Delivery { return in.reading }

// ended is called when the channel being read is closed: a cancelled
// consumer has handed over its last delivery, and the live one's come
// next. It returns the cancelled consumer's tag: what the broker still
// sends it, amqp091-go drops (meter.end). The live consumer's channel
// closing is an error: the channel or the connection went away.
func (in *inbox) ended() (string, error) {
	if in.reading == in.live {
		return "", errors.New("inbox deliveries stopped")
	}
	cancelled := in.readingTag
	in.reading, in.readingTag = in.live, in.tag
	in.retiredThrough = in.lastTag
	return cancelled, nil
}

// took records a delivery the session took.
func (in *inbox) took(tag uint64, size int64, now time.Time) {
	in.win.received(size)
	in.last, in.lastTag = now, tag
}

// refit replaces the consumer when the window has moved far enough from
// its prefetch: at once to shrink it, and to grow it when it has doubled
// or reached the ceiling, so that slow start costs a few replacements, not
// one a delivery. One replacement at a time, and none while a cancelled
// consumer still hands over deliveries; and the window grows only once
// every delivery of the cancelled consumers is settled, so that the
// deliveries in flight (what a crash hands back to the broker, to deliver
// again) stay within two windows. After idleReset without a delivery, the
// window starts over at one.
func (in *inbox) refit(now time.Time) {
	if in.tag == "" || in.reading != in.live {
		return
	}
	if in.prefetch > 1 && now.Sub(in.last) >= in.idleReset {
		in.win.idle()
	}
	want := in.win.want()
	switch {
	case want == in.prefetch:
		return
	case want > in.prefetch && want < 2*in.prefetch && want < in.win.ceiling:
		return
	case want > in.prefetch && in.settledThrough() < in.retiredThrough:
		return
	}
	old := in.tag
	in.tag, in.live = "", nil // what old still hands over is read, then nothing until the new one
	in.running.Add(1)
	go func() {
		defer in.running.Done()
		if err := in.ch.Cancel(old, false); err != nil {
			in.replaced <- replacement{err: fmt.Errorf("cancel consumer %s: %w", old, err)}
			return
		}
		in.replaced <- in.consume(want)
	}()
}

// stop cancels the live consumer, if any, without waiting for the
// broker's reply: the session is ending, and what the consumer still
// hands over is left unacked, for the broker to requeue.
func (in *inbox) stop() {
	if in.tag == "" {
		return
	}
	tag := in.tag
	in.tag, in.live = "", nil
	in.running.Add(1)
	go func() {
		defer in.running.Done()
		_ = in.ch.Cancel(tag, false) // fails once the connection closes: nothing to do then
	}()
}

// wait waits for the goroutines the inbox started; they end once the
// connection is closed, if not before.
func (in *inbox) wait() { in.running.Wait() }
