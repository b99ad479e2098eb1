package parking

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/republisher"
)

// browseIdle is how long browse's consumer waits for a delivery before
// browse reads the rest with basic.get: a quorum queue on RabbitMQ 3.x
// hands a consumer with no prefetch limit at most 2000 unacked messages.
const browseIdle = 300 * time.Millisecond

// browse reads the messages the parking queue holds, once each, and hands
// them to visit until visit returns false; it removes none. It is how the
// commands that only read (list, groups, show) read: a consumer receives
// the messages without a round trip each, where basic.get, which the
// commands that move messages use (republisher.Mover), waits for one
// reply per message (10 000 parked messages take seconds that way).
//
// It asks for one message with basic.get first, whose reply says how many
// the queue holds (queue.declare-ok's count lags for a moment after
// messages are returned to a quorum queue), then consumes with no
// prefetch limit until the consumer goes quiet (all read, or a quorum
// queue's limit of unacked messages reached), and reads what is left with
// basic.get. Every message stays unacked until the end, so none is read
// twice, and one nack requeues them all (a requeue that on RabbitMQ 4.x
// does not count toward a quorum queue's delivery limit, where a closed
// channel would). unread is how many of those it did not read: having
// stopped early, or because another reader holds them.
func (q Queue) browse(ctx context.Context, visit func(amqp.Delivery) bool) (read, unread int, err error) {
	ch, err := q.Conn.Channel()
	if err != nil {
		return 0, 0, fmt.Errorf("open channel: %w", err)
	}
	defer func() {
		if read > 0 && !ch.IsClosed() {
			// Delivery tag 0 with multiple set: every delivery of the channel.
			if nerr := ch.Nack(0, true, true); nerr != nil {
				err = errors.Join(err, fmt.Errorf("requeue the messages read: %w", nerr))
			}
		}
		if cerr := ch.Close(); cerr != nil && !errors.Is(cerr, amqp.ErrClosed) {
			err = errors.Join(err, fmt.Errorf("close channel: %w", cerr))
		}
	}()
	if _, err := ch.QueueDeclarePassive(q.Name(), true, false, false, false, nil); err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return 0, 0, republisher.ErrNoQueue
		}
		return 0, 0, fmt.Errorf("inspect queue %s: %w", q.Name(), err)
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	first, ok, err := ch.Get(q.Name(), false)
	if err != nil || !ok {
		return 0, 0, err
	}
	total := int(first.MessageCount) + 1
	read = 1
	if !visit(first) || total == 1 {
		return read, total - read, nil
	}
	more, err := q.consumeQuietly(ctx, ch, total-read, visit)
	read += more.read
	if err != nil || more.stopped {
		return read, total - read, err
	}
	for read < total {
		if err := ctx.Err(); err != nil {
			return read, total - read, err
		}
		d, ok, err := ch.Get(q.Name(), false)
		if err != nil || !ok {
			return read, total - read, err
		}
		read++
		if !visit(d) {
			break
		}
	}
	return read, total - read, nil
}

// consumed is what consumeQuietly read.
type consumed struct {
	read    int
	stopped bool // visit said stop
}

// consumeQuietly consumes up to n messages on ch, unacked, handing each to
// visit, until visit says stop or no delivery came for browseIdle; it
// cancels its consumer and hands over what was delivered before the
// cancel, so that basic.get reads the rest.
func (q Queue) consumeQuietly(ctx context.Context, ch *amqp.Channel, n int, visit func(amqp.Delivery) bool) (c consumed, err error) {
	const tag = "rebound-parked-browse"
	deliveries, err := ch.ConsumeWithContext(ctx, q.Name(), tag, false, false, false, false, nil)
	if err != nil {
		return c, fmt.Errorf("consume %s: %w", q.Name(), err)
	}
	take := func(d amqp.Delivery) {
		if c.stopped {
			return // delivered after the stop: the final nack requeues it
		}
		c.read++
		c.stopped = !visit(d)
	}
	idle := time.NewTimer(browseIdle)
	defer idle.Stop()
	for quiet := false; !quiet && !c.stopped && c.read < n && ctx.Err() == nil; {
		select {
		case <-ctx.Done():
		case <-idle.C:
			quiet = true
		case d, ok := <-deliveries:
			if !ok {
				return c, fmt.Errorf("consume %s: channel closed", q.Name())
			}
			take(d)
			idle.Reset(browseIdle)
		}
	}
	if err := ch.Cancel(tag, false); err != nil {
		return c, fmt.Errorf("cancel the consumer: %w", err)
	}
	for d := range deliveries { // closed once the cancel is through
		if c.read < n {
			take(d)
		}
	}
	return c, ctx.Err()
}
