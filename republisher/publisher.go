// Package republisher publishes rebound's copies to the broker and reports,
// for each one, whether the broker took responsibility for it.
//
// Every publish is mandatory and confirmed. The outcome of a publish is
// delivered exactly once to the callback given to Publish: Confirmed only
// when the broker acked the copy and did not return it. Returns and acks
// arrive on two notification channels; a basic.return always precedes the
// basic.ack of the same message on the wire, and amqp091-go's one reader
// goroutine hands the return over before it reads the ack. The Publisher
// reads both in one goroutine and, before it handles a confirm, takes
// every return already handed over, so a returned copy is never reported
// Confirmed. Both channels are buffered for the whole publish window, and
// that goroutine never waits on anything that waits on the broker: the
// library abandons a notification its listener does not take within 5s
// (amqp091-go v1.16, notifyAll), and an abandoned return would let the
// ack that follows it pass for a confirm. It waits for the broker once
// only: when it gives up on a confirm, it closes its channel, after it has
// reported every pending publish TimedOut. Callbacks run on that goroutine
// and must not block.
//
// A Publisher belongs to one connection generation. When its channel or
// connection closes, or a confirm does not come within the timeout, every
// pending publish is reported Closed or TimedOut and Done is closed; the
// owner then discards the Publisher and builds a new one on a new
// connection.
package republisher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/delayqueue"
	"github.com/rebound-mq/rebound/internal/topology"
)

// Outcome is what became of one publish.
type Outcome int

// Outcomes. Only Confirmed means the copy is safely on the broker.
const (
	Confirmed Outcome = iota
	Nacked            // the broker refused it (basic.nack)
	Returned          // unroutable: no queue took it (basic.return)
	TimedOut          // no confirm within the timeout
	Closed            // the channel or connection died first
)

func (o Outcome) String() string {
	switch o {
	case Confirmed:
		return "confirmed"
	case Nacked:
		return "nack"
	case Returned:
		return "return"
	case TimedOut:
		return "timeout"
	case Closed:
		return "closed"
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// Why says, for people, why a message whose copy ended with o stays where
// it was; "" for Confirmed, the one outcome that removes it.
func (o Outcome) Why() string {
	switch o {
	case Confirmed:
		return ""
	case Returned:
		return "returned by the broker: no queue took the copy (origin queue missing?)"
	case Nacked:
		return "broker refused the copy (nack)"
	}
	return "copy not confirmed in time (it may have been delivered too)"
}

// WhyInterrupted says why a message whose copy could not be sent, the run
// interrupted, stays where it was.
const WhyInterrupted = "interrupted before the copy was confirmed (it may have been delivered too)"

// routeKey identifies a destination as a basic.return describes it.
type routeKey struct {
	exchange, routingKey string
}

func keyOf(d topology.Destination) routeKey {
	return routeKey{d.Exchange, d.RoutingKey}
}

type pending struct {
	route    routeKey
	sent     time.Time
	returned bool
	done     func(Outcome, time.Duration)
	// confirm is the broker's word on this publish alone. NotifyPublish
	// is not: amqp091-go reports a nack that came before a multiple ack
	// covering it (a full classic origin refuses at once, a quorum delay
	// queue confirms later) as an ack.
	confirm *amqp.DeferredConfirmation
}

// Publisher publishes on one channel in confirm mode. Publish may be called
// from one goroutine at a time; Blocked, Done and Err from any.
type Publisher struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	topo    topology.Topology
	timeout time.Duration
	now     func() time.Time

	// delays declares the delay queues copies go through, on first use.
	// The confirm loop only ever calls its Forget, which never waits on
	// the broker.
	delays *delayqueue.Set

	mu       sync.Mutex // guards pending, blocked and returned; never held across I/O
	pending  map[uint64]*pending
	blocked  bool
	returned map[string]time.Time // queues a copy sent straight to was returned from, and when

	done chan struct{}
	err  error // set before done is closed
}

// New opens a confirming channel on conn. window is the most publishes
// that can be pending at once (rebound's prefetch); the confirmation
// buffer is sized from it so the library never waits on rebound. notice
// receives, for the log, what the Publisher worked around (a delay queue
// it could not use); nil drops it.
func New(conn *amqp.Connection, topo topology.Topology, window int, confirmTimeout time.Duration, notice func(msg string)) (*Publisher, error) {
	return newPublisher(conn, topo, window, confirmTimeout, notice, time.Now)
}

// newPublisher is New with the Publisher's clock, which its loop reads
// from the start: tests pass one they move.
func newPublisher(conn *amqp.Connection, topo topology.Topology, window int, confirmTimeout time.Duration, notice func(msg string), now func() time.Time) (*Publisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open publish channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	delays, err := delayqueue.New(conn, topo, notice, now)
	if err != nil {
		return nil, err
	}
	p := &Publisher{
		conn: conn, ch: ch, delays: delays, topo: topo, timeout: confirmTimeout, now: now,
		pending: map[uint64]*pending{}, returned: map[string]time.Time{},
		done: make(chan struct{}),
	}
	// At most window publishes are pending, each confirmed once and
	// returned at most once: neither buffer ever fills, so the library
	// never waits on rebound.
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window+16))
	returns := ch.NotifyReturn(make(chan amqp.Return, window+16))
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go p.loop(confirms, returns, blocks)
	return p, nil
}

// Close closes the Publisher's channels and waits for its goroutine to
// end; publishes still pending are reported Closed.
func (p *Publisher) Close() {
	_ = p.ch.Close()
	p.delays.Close()
	<-p.done
}

// Delays is the set of delay queues the Publisher declares on first use:
// the sidecar sweeps the idle ones and leases the others through it.
func (p *Publisher) Delays() *delayqueue.Set { return p.delays }

// Done is closed when the Publisher can no longer publish; Err says why.
func (p *Publisher) Done() <-chan struct{} { return p.done }

// Err is the reason the Publisher stopped; valid once Done is closed.
func (p *Publisher) Err() error { return p.err }

// Blocked reports whether the broker has blocked the connection for a
// resource alarm. While blocked, publishes would wait in the socket.
func (p *Publisher) Blocked() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blocked
}

// Publish sends msg to dest with the mandatory flag. done is called once,
// from the Publisher's goroutine, with the outcome and the time from
// publish to outcome; it must not block. When Publish returns an error,
// done is not called and nothing was sent.
func (p *Publisher) Publish(ctx context.Context, dest topology.Destination, msg amqp.Publishing, done func(Outcome, time.Duration)) error {
	if dest.Delay > 0 {
		d, err := p.delays.Ensure(dest.Delay)
		if err != nil {
			return err
		}
		if d != dest.Delay {
			dest.Exchange, dest.Delay = p.topo.DelayExchangeFor(d).Name, d
		}
	}
	entry := &pending{route: keyOf(dest), sent: p.now(), done: done}
	// The sequence number is read and registered before the frame is sent:
	// the confirm may otherwise arrive before the entry exists. Publish is
	// not called concurrently, so nothing else takes the number meanwhile.
	seq := p.ch.GetNextPublishSeqNo()
	p.mu.Lock()
	p.pending[seq] = entry
	p.mu.Unlock()
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, dest.Exchange, dest.RoutingKey, true, false, msg)
	if err != nil {
		p.mu.Lock()
		delete(p.pending, seq)
		p.mu.Unlock()
		return fmt.Errorf("publish to %q with routing key %q: %w", dest.Exchange, dest.RoutingKey, err)
	}
	p.mu.Lock()
	entry.confirm = dc
	p.mu.Unlock()
	return nil
}

func (p *Publisher) loop(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, blocks <-chan amqp.Blocking) {
	tick := time.NewTicker(p.tickInterval())
	defer tick.Stop()
	for {
		select {
		case r, ok := <-returns:
			if ok {
				p.markReturned(r)
			} else {
				returns = nil
			}
		case c, ok := <-confirms:
			if !ok {
				p.stop(Closed, errors.New("publish channel closed"))
				return
			}
			// The return of a copy, if any, was handed over before its
			// confirm: take it first.
			returns = p.takeReturns(returns)
			p.resolve(c)
		case b, ok := <-blocks:
			if ok {
				p.setBlocked(b.Active)
			} else {
				blocks = nil
			}
		case <-tick.C:
			if p.overdue() {
				p.stop(TimedOut, fmt.Errorf("no publisher confirm within %s", p.timeout))
				_ = p.ch.Close()
				// Drain until the library closes the confirmation channel.
				for range confirms {
				}
				return
			}
		}
	}
}

func (p *Publisher) tickInterval() time.Duration {
	return min(max(p.timeout/4, 10*time.Millisecond), time.Second)
}

// takeReturns marks every return waiting in returns, without blocking,
// and returns the channel, or nil once the library closed it.
func (p *Publisher) takeReturns(returns <-chan amqp.Return) <-chan amqp.Return {
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				return nil
			}
			p.markReturned(r)
		default:
			return returns
		}
	}
}

// maxReturnedQueues is how many queues Publisher.returned holds before
// markReturned forgets those older than returnMemory: names come from
// messages, so the map must not grow with them.
const maxReturnedQueues = 1024

// returnMemory is how long a return is kept for ReturnedSince: longer
// than the minute declarer.Origins asks about.
const returnMemory = 2 * time.Minute

func (p *Publisher) markReturned(r amqp.Return) {
	key := routeKey{exchange: r.Exchange, routingKey: r.RoutingKey}
	p.mu.Lock()
	defer p.mu.Unlock()
	if ms, ok := p.topo.DelayOfExchange(r.Exchange); ok {
		// The delay queue or its binding is gone: declare it again next
		// time.
		p.delays.Forget(ms)
	}
	if r.Exchange == "" {
		// The default exchange routes to the queue its key names when it
		// exists: a return says the queue does not (ReturnedSince tells
		// declarer.Origins, when the broker will not answer a passive
		// declaration).
		now := p.now()
		if len(p.returned) >= maxReturnedQueues {
			for q, at := range p.returned {
				if now.Sub(at) >= returnMemory {
					delete(p.returned, q)
				}
			}
		}
		p.returned[r.RoutingKey] = now
	}
	// A return does not name its sequence number. Every copy still pending
	// for the same destination is treated as returned: at worst a copy that
	// did arrive is published again (a duplicate), never the reverse.
	for _, e := range p.pending {
		if e.route == key {
			e.returned = true
		}
	}
}

func (p *Publisher) resolve(c amqp.Confirmation) {
	p.mu.Lock()
	e, ok := p.pending[c.DeliveryTag]
	delete(p.pending, c.DeliveryTag)
	var dc *amqp.DeferredConfirmation
	if ok {
		dc = e.confirm
	}
	p.mu.Unlock()
	if !ok {
		return
	}
	// Without dc the confirm came before Publish returned. Then c.Ack is
	// this publish's own word: NotifyPublish delivers confirms in tag
	// order, and it misreports a nack only under a multiple ack with a
	// higher tag, which needs a later publish, and Publish is not called
	// again before it returns and sets entry.confirm.
	acked := c.Ack
	if dc != nil {
		select {
		case <-dc.Done():
			acked = dc.Acked()
		default:
			// amqp091-go settles the deferred confirmation before it
			// notifies: not done means not confirmed this way.
			acked = false
		}
	}
	outcome := Confirmed
	switch {
	case !acked:
		outcome = Nacked
	case e.returned:
		outcome = Returned
	}
	e.done(outcome, p.now().Sub(e.sent))
}

func (p *Publisher) setBlocked(active bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = active
	if !active {
		// Confirms legitimately stall while blocked; restart their clocks.
		now := p.now()
		for _, e := range p.pending {
			e.sent = now
		}
	}
}

func (p *Publisher) overdue() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blocked {
		return false
	}
	now := p.now()
	for _, e := range p.pending {
		if now.Sub(e.sent) > p.timeout {
			return true
		}
	}
	return false
}

// stop reports every pending publish with outcome and closes Done.
func (p *Publisher) stop(outcome Outcome, err error) {
	p.mu.Lock()
	left := p.pending
	p.pending = map[uint64]*pending{}
	p.mu.Unlock()
	now := p.now()
	for _, e := range left {
		e.done(outcome, now.Sub(e.sent))
	}
	p.err = err
	close(p.done)
}

// ReturnedSince reports whether a copy sent straight to queue through
// the default exchange was returned after since: the broker's word that
// queue did not exist then (declarer.Origins asks it).
func (p *Publisher) ReturnedSince(queue string, since time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.returned[queue]
	return ok && at.After(since)
}
