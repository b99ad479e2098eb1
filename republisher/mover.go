package republisher

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/internal/tracing"
)

// ErrNoQueue means the queue a Mover was opened on does not exist.
var ErrNoQueue = errors.New("queue not found (rebound declares it when it starts, or run `rebound topology declare`)")

// Mover moves messages out of one queue for the commands that operate on
// rebound's queues from outside the sidecar (`rebound parked`, `rebound
// delayed`). It reads them one at a time with basic.get and manual acks,
// up to the number of messages the queue held at the first read, and
// removes a message only with an ack sent once its fate is settled: for a
// message moved, after a Publisher reported its copy Confirmed (acked and
// not returned), the sidecar's own rule. Every other message read is
// requeued by Close with one nack, or by the broker when the channel or
// connection goes away, so a command killed at any point loses nothing:
// at worst a message is both moved and still there. Messages stay unacked,
// and so are not handed out again, until the end of the run: each is read
// once, and the queue's order may change.
//
// A Mover is not safe for concurrent use.
type Mover struct {
	conn    *amqp.Connection
	pubConn *amqp.Connection // where copies go out; conn unless PublishThrough said otherwise
	topo    topology.Topology
	queue   string
	ch      *amqp.Channel // reads and acks
	window  int
	timeout time.Duration

	// remaining is how many messages are still to read, -1 until the
	// first basic.get, whose reply says how many the queue holds after it.
	// Not queue.declare-ok's count: for a few milliseconds after messages
	// are returned to a quorum queue it reports fewer (often none), and a
	// command run right after another would read nothing.
	remaining int
	unsettled int  // messages read and neither acked nor requeued
	acked     bool // acks sent since the last basic.get (see Close)

	pub      *Publisher   // opened by the first Move
	tracer   trace.Tracer // nil: no spans (see Trace)
	op       string
	inflight int // copies published whose outcome Settle has not taken
	outcomes chan moved
}

// moved is the outcome of one copy, as the Publisher reported it.
type moved struct {
	d       amqp.Delivery
	outcome Outcome
	report  func(Outcome)
}

// OpenMover opens a Mover on queue of topo (whose delay queues a copy may
// be sent through), reached through conn. At most window copies are in
// flight before Move waits for their confirms; confirmTimeout bounds that
// wait. It returns ErrNoQueue when queue does not exist.
func OpenMover(conn *amqp.Connection, topo topology.Topology, queue string, window int, confirmTimeout time.Duration) (*Mover, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	// Only to tell a missing queue; its count is not to be trusted (see
	// Mover.remaining).
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return nil, ErrNoQueue
		}
		return nil, fmt.Errorf("inspect queue %s: %w", queue, err)
	}
	return &Mover{
		conn: conn, pubConn: conn, topo: topo, queue: queue, ch: ch, window: max(window, 1), timeout: confirmTimeout,
		remaining: -1, outcomes: make(chan moved, max(window, 1)),
	}, nil
}

// PublishThrough has m publish its copies on a connection of their own,
// pub, instead of the one it reads on: the broker throttles a connection
// that publishes faster than the queues take the copies (flow control),
// and reads on it wait meanwhile (a move runs several times faster so).
// Call it before the first Move.
func (m *Mover) PublishThrough(pub *amqp.Connection) { m.pubConn = pub }

// Trace gives each message m moves a span of tr (package tracing),
// named for operation; a nil tr records none.
func (m *Mover) Trace(tr trace.Tracer, operation string) { m.tracer, m.op = tr, operation }

// Next returns the next message, or false once the messages the queue
// held at the first read have been read, the queue is empty or ctx is
// done.
func (m *Mover) Next(ctx context.Context) (amqp.Delivery, bool, error) {
	if m.remaining == 0 || ctx.Err() != nil {
		return amqp.Delivery{}, false, nil
	}
	d, ok, err := m.ch.Get(m.queue, false)
	if err != nil {
		return amqp.Delivery{}, false, fmt.Errorf("get from %s: %w", m.queue, err)
	}
	m.acked = false
	if !ok {
		m.remaining = 0
		return amqp.Delivery{}, false, nil
	}
	if m.remaining < 0 {
		m.remaining = int(d.MessageCount)
	} else {
		m.remaining--
	}
	m.unsettled++
	return d, true, nil
}

// Remove removes d, a message Next returned, without a copy.
func (m *Mover) Remove(d amqp.Delivery) error {
	if err := m.ch.Ack(d.DeliveryTag, false); err != nil {
		return fmt.Errorf("ack message %q: %w", d.MessageId, err)
	}
	m.unsettled--
	m.acked = true
	return nil
}

// Move publishes msg to dest as the copy of d, a message Next returned,
// and removes d once the broker has confirmed that copy and not returned
// it; report, if not nil, is called with the outcome from Settle. With
// window copies in flight it settles them first. An error means the copy
// was not sent (d stays): the publishing channel is gone.
func (m *Mover) Move(d amqp.Delivery, dest topology.Destination, msg amqp.Publishing, report func(Outcome)) error {
	if m.inflight >= m.window {
		if err := m.Settle(); err != nil {
			return err
		}
	}
	if m.pub == nil {
		pub, err := New(m.pubConn, m.topo, m.window, m.timeout, nil)
		if err != nil {
			return err
		}
		m.pub = pub
	}
	end := func(bool, string) {}
	if m.tracer != nil {
		end = tracing.Move(m.tracer, m.op, d, dest.Exchange, dest.RoutingKey)
	}
	err := m.pub.Publish(context.Background(), dest, msg, func(o Outcome, _ time.Duration) {
		end(o == Confirmed, o.String())
		m.outcomes <- moved{d: d, outcome: o, report: report} // never blocks: at most window in flight
	})
	if err != nil {
		end(false, err.Error())
		return err
	}
	m.inflight++
	return nil
}

// ReturnedSince reports whether a copy m sent straight to queue was
// returned after since (Publisher.ReturnedSince): for declarer.Origins.
func (m *Mover) ReturnedSince(queue string, since time.Time) bool {
	return m.pub != nil && m.pub.ReturnedSince(queue, since)
}

// Settle waits for the outcome of every copy in flight and removes each
// message whose copy was confirmed. A copy not confirmed within the
// confirm timeout is reported TimedOut by the Publisher, which then stops:
// its message stays, and the next Move fails.
func (m *Mover) Settle() error {
	var errs []error
	for ; m.inflight > 0; m.inflight-- {
		mv := <-m.outcomes
		if mv.outcome == Confirmed {
			if err := m.Remove(mv.d); err != nil {
				errs = append(errs, err)
			}
		}
		if mv.report != nil {
			mv.report(mv.outcome)
		}
	}
	return errors.Join(errs...)
}

// Close settles the copies in flight, requeues every message read and not
// removed, in one nack, and closes the channels. Closing alone would
// requeue them too; the nack makes it explicit, reports a failure, and on
// RabbitMQ 4.x does not count as a delivery of a quorum queue's message
// (a closed channel does).
//
// A quorum queue loses acks sent just before their channel closes
// (RabbitMQ 3.10 and 4.3 undo most of them: the messages come back, each
// a duplicate of a copy already moved). A
// basic.get reaches the queue after the acks sent before it, and waits
// for its answer: Close sends one after the last acks, and requeues what
// it returns with the rest.
func (m *Mover) Close() error {
	err := m.Settle()
	if m.acked && !m.ch.IsClosed() {
		if _, ok, gerr := m.ch.Get(m.queue, false); gerr != nil {
			err = errors.Join(err, fmt.Errorf("get from %s after the last acks: %w", m.queue, gerr))
		} else if ok {
			m.unsettled++
		}
		m.acked = false
	}
	if m.unsettled > 0 {
		// Delivery tag 0 with multiple set means every outstanding delivery.
		if nerr := m.ch.Nack(0, true, true); nerr != nil {
			err = errors.Join(err, fmt.Errorf("requeue unsettled messages: %w", nerr))
		}
		m.unsettled = 0
	}
	if cerr := m.ch.Close(); cerr != nil && !errors.Is(cerr, amqp.ErrClosed) {
		err = errors.Join(err, fmt.Errorf("close channel: %w", cerr))
	}
	if m.pub != nil {
		m.pub.Close()
	}
	return err
}
