package parking

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/republisher"
)

// browseIdle is how long browse waits for a delivery before it takes the
// queue as read: messages another command holds unacked never come.
const browseIdle = 2 * time.Second

// browse reads the messages the parking queue holds, once each, and hands
// them to visit until visit returns false; it removes none. It is how the
// commands that only read (list, groups, show) read: a consumer receives
// the messages without a round trip each, where basic.get, which the
// commands that move messages use (republisher.Mover), waits for one
// reply per message (10 000 parked messages take seconds that way).
//
// It asks for one message with basic.get first, whose reply says how many
// the queue holds (queue.declare-ok's count lags for a moment after
// messages are returned to a quorum queue), then consumes the rest with
// no prefetch limit: every message stays unacked until the end, so none
// is read twice, and one nack requeues them all (a requeue that on
// RabbitMQ 4.x does not count toward a quorum queue's delivery limit,
// where a closed channel would). unread is how many of those it did not
// read, having stopped early.
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
	first, ok, err := ch.Get(q.Name(), false)
	if err != nil || !ok {
		return 0, 0, err
	}
	total := int(first.MessageCount) + 1
	read = 1
	if !visit(first) || total == 1 {
		return read, total - read, nil
	}
	const tag = "rebound-parked-browse"
	deliveries, err := ch.ConsumeWithContext(ctx, q.Name(), tag, false, false, false, false, nil)
	if err != nil {
		return read, total - read, fmt.Errorf("consume %s: %w", q.Name(), err)
	}
	defer func() {
		if !ch.IsClosed() {
			if cerr := ch.Cancel(tag, false); cerr != nil {
				err = errors.Join(err, fmt.Errorf("cancel the consumer: %w", cerr))
			}
		}
	}()
	idle := time.NewTimer(browseIdle)
	defer idle.Stop()
	for read < total {
		select {
		case <-ctx.Done():
			return read, total - read, ctx.Err()
		case <-idle.C:
			return read, total - read, nil
		case d, ok := <-deliveries:
			if !ok {
				return read, total - read, fmt.Errorf("consume %s: channel closed", q.Name())
			}
			read++
			if !visit(d) {
				return read, total - read, nil
			}
			idle.Reset(browseIdle)
		}
	}
	return read, 0, nil
}
