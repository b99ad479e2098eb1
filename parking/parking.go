// Package parking operates on rebound's parking queue from outside the
// sidecar: it lists, inspects, replays and purges parked messages, for the
// `rebound parked` command.
//
// Every operation reads the queue once, with basic.get and manual ack, up
// to the number of messages the queue held when the first was read. A message is
// removed only by an ack, and that ack is sent only once its fate is
// settled: for a replay, after the broker has confirmed the copy sent back
// to the origin queue and did not return it. Every other delivery is
// requeued with one nack at the end, or by the broker when the channel or
// connection goes away, so a command killed at any point loses nothing (at
// worst a message is both replayed and still parked). Messages stay
// unacked, and so are not handed out again, until the end of the run: each
// is seen once, and order in the queue may change.
//
// A Queue is not safe for concurrent use; run one operation at a time.
package parking

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/policy"
	"github.com/rebound-mq/rebound/republisher"
)

// Message is one parked message as read from the parking queue.
type Message struct {
	Delivery  amqp.Delivery
	Reason    string    // why it was parked; "" when unknown
	ParkedAt  time.Time // zero when unknown
	Origin    string    // queue a replay sends it to; "" when unknown
	Retries   int       // retries scheduled before it was parked
	StartedAt time.Time // task start, as rebound reads it
	Error     string    // the consumer's last error header, if any
	// FirstDeathReason and FirstDeathQueue say why and where the task was
	// first dead-lettered (rejected, expired, maxlen, delivery_limit).
	FirstDeathReason, FirstDeathQueue string
}

// ID returns the message id property.
func (m Message) ID() string { return m.Delivery.MessageId }

// Filter selects parked messages. The zero Filter selects every message.
type Filter struct {
	Reason    string        // parked reason equals this
	Origin    string        // origin queue equals this
	OlderThan time.Duration // parked more than this long ago (unknown parked-at never matches)
	ID        string        // message id equals this
	Limit     int           // act on at most this many matches; 0 = no limit
}

// Match reports whether m passes every condition of f except Limit.
func (f Filter) Match(m Message, now time.Time) bool {
	switch {
	case f.Reason != "" && m.Reason != f.Reason:
		return false
	case f.Origin != "" && m.Origin != f.Origin:
		return false
	case f.ID != "" && m.ID() != f.ID:
		return false
	case f.OlderThan > 0 && (m.ParkedAt.IsZero() || now.Sub(m.ParkedAt) < f.OlderThan):
		return false
	}
	return true
}

// Queue is the parking queue of a topology, reached through one
// connection.
type Queue struct {
	Conn     *amqp.Connection
	Topology republisher.Topology
	Codec    headers.Codec
	// OriginAllowed says whether a replay may send a message to a queue
	// (REBOUND_ORIGIN_QUEUES); nil allows any.
	OriginAllowed func(queue string) bool
	// ConfirmTimeout bounds the wait for the broker's confirms of one
	// batch of replayed copies; 0 means 30s.
	ConfirmTimeout time.Duration
}

// Name is the parking queue's name.
func (q Queue) Name() string { return q.Topology.ParkingQueue }

// Decode reads what rebound wrote on a parked delivery, or, for a message
// the broker moved there from rebound's quorum inbox after its delivery
// limit, what the broker wrote: reason delivery-limit, parked when the
// inbox dead-lettered it, origin the queue that dead-lettered it into the
// inbox before (else the origin header).
func (q Queue) Decode(d amqp.Delivery, now time.Time) Message {
	s, _ := q.Codec.Decode(d.Headers, d.Timestamp, now, nil)
	m := Message{Delivery: d, Origin: s.Origin, Retries: s.Retries, StartedAt: s.StartedAt,
		FirstDeathReason: s.FirstDeathReason, FirstDeathQueue: s.FirstDeathQueue}
	if reason, at, ok := q.Codec.Parked(d.Headers); ok {
		m.Reason, m.ParkedAt = string(reason), at
	} else if deaths := headers.Deaths(d.Headers); len(deaths) > 0 && deaths[0].Queue == q.Topology.InboxQueue && deaths[0].Reason == "delivery_limit" {
		m.Reason, m.ParkedAt = string(policy.DeliveryLimit), deaths[0].Time
		m.Origin = s.ClaimedOrigin // the origin header, rebound's own
		for _, earlier := range deaths[1:] {
			if earlier.Queue != "" && !q.Topology.Owns(earlier.Queue) {
				m.Origin = earlier.Queue
				break
			}
		}
	}
	switch v := d.Headers[q.Codec.Names.Error].(type) {
	case string:
		m.Error = v
	case []byte:
		m.Error = string(v)
	}
	return m
}

// ErrNoQueue means the parking queue does not exist.
var ErrNoQueue = errors.New("queue not found (rebound declares it when it starts, or run `rebound topology declare`)")

// reader takes messages off the parking queue on its own channel, keeping
// them unacked until settle.
type reader struct {
	q  Queue
	ch *amqp.Channel
	// remaining is how many messages are still to read, -1 until the
	// first basic.get, whose reply says how many the queue holds after it.
	// Not queue.declare-ok's count: for a few milliseconds after messages
	// are returned to a quorum queue it reports fewer (often none), and a
	// command run right after another would read nothing.
	remaining int
	unsettled int // deliveries neither acked nor nacked yet
}

func (q Queue) open() (*reader, error) {
	ch, err := q.Conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	// Only to tell a missing queue; its count is not to be trusted (see
	// reader.remaining).
	_, err = ch.QueueDeclarePassive(q.Name(), true, false, false, false, nil)
	if err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return nil, ErrNoQueue
		}
		return nil, fmt.Errorf("inspect queue %s: %w", q.Name(), err)
	}
	return &reader{q: q, ch: ch, remaining: -1}, nil
}

// next returns the next delivery, or false once the messages the queue
// held at the first read have been read, the queue is empty or ctx is
// done.
func (r *reader) next(ctx context.Context) (amqp.Delivery, bool, error) {
	if r.remaining == 0 || ctx.Err() != nil {
		return amqp.Delivery{}, false, nil
	}
	d, ok, err := r.ch.Get(r.q.Name(), false)
	if err != nil {
		return amqp.Delivery{}, false, fmt.Errorf("get from %s: %w", r.q.Name(), err)
	}
	if !ok {
		r.remaining = 0
		return amqp.Delivery{}, false, nil
	}
	if r.remaining < 0 {
		r.remaining = int(d.MessageCount)
	} else {
		r.remaining--
	}
	r.unsettled++
	return d, true, nil
}

func (r *reader) ack(d amqp.Delivery) error {
	if err := d.Ack(false); err != nil {
		return fmt.Errorf("ack message %q: %w", d.MessageId, err)
	}
	r.unsettled--
	return nil
}

// close requeues every delivery still unacked, in one nack, and closes
// the channel. Closing alone would requeue them too; the nack makes it
// explicit and reports a failure.
func (r *reader) close() error {
	var err error
	if r.unsettled > 0 {
		// Delivery tag 0 with multiple set means every outstanding delivery.
		if err = r.ch.Nack(0, true, true); err != nil {
			err = fmt.Errorf("requeue unsettled messages: %w", err)
		}
	}
	if cerr := r.ch.Close(); cerr != nil && err == nil && !errors.Is(cerr, amqp.ErrClosed) {
		err = fmt.Errorf("close channel: %w", cerr)
	}
	return err
}
