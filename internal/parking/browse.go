package parking

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/republisher"
)

// consumerCredit is how many unacked messages RabbitMQ 3.x hands one
// consumer with no prefetch limit on a quorum queue: once a consumer of
// browse's has been delivered that many, browse adds another.
const consumerCredit = 2000

// browseProbe is how long browse's consumers may go without a delivery
// before browse asks the queue, with one basic.get, whether it still
// holds messages for it: a delivery may take that long on a loaded broker
// or machine, and another reader may meanwhile have taken messages the
// first count included. A message the probe gets is read like any other.
const browseProbe = 300 * time.Millisecond

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
// prefetch limit until it has read that many (see consumeAll). Every
// message stays unacked until the end, so none is read twice, and one
// nack requeues them all (a requeue that on RabbitMQ 4.x does not count
// toward a quorum queue's delivery limit, where a closed channel would).
// unread is how many of those it did not read: having stopped early, or
// because another reader holds them.
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
	more, err := q.consumeAll(ctx, ch, total-read, visit)
	read += more
	return read, total - read, err
}

// consumeAll reads up to n messages on ch, unacked, handing each to visit
// until visit says stop, and returns how many it read. The broker has
// said the queue holds n more, so it waits for them without a deadline:
// a consumer that goes quiet on a loaded broker is not a sign that it is
// done. It ends early only when the queue has no message left for it
// (another reader took some since the count): when the consumers have
// been quiet for browseProbe, one basic.get asks, and an empty reply
// ends the reading, with whatever was already on its way to the
// consumers. A quorum queue on RabbitMQ 3.x stops delivering to a
// consumer after consumerCredit unacked messages, so every
// consumerCredit messages read adds a consumer (on other queues the
// extra consumers share the deliveries, which costs nothing).
func (q Queue) consumeAll(ctx context.Context, ch *amqp.Channel, n int, visit func(amqp.Delivery) bool) (read int, err error) {
	c := consumers{ch: ch, queue: q.Name(), merged: make(chan amqp.Delivery), ended: make(chan struct{})}
	defer func() { err = errors.Join(err, c.stop()) }()
	stopped := false
	take := func(d amqp.Delivery) {
		read++
		stopped = !visit(d)
	}
	if err := c.add(ctx); err != nil {
		return 0, err
	}
	probe := time.NewTimer(browseProbe)
	defer probe.Stop()
	consumed := 0
	for read < n && !stopped && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case d := <-c.merged:
			take(d)
			consumed++
			if consumed >= c.count*consumerCredit && read < n && !stopped {
				if err := c.add(ctx); err != nil {
					return read, err
				}
			}
			probe.Reset(browseProbe)
		case <-c.ended:
			c.live--
			return read, fmt.Errorf("consume %s: the broker ended the consumer, or the channel closed", q.Name())
		case <-probe.C:
			d, ok, err := ch.Get(q.Name(), false)
			if err != nil {
				return read, fmt.Errorf("get from %s: %w", q.Name(), err)
			}
			if !ok {
				// Nothing left in the queue: the rest is on its way to
				// the consumers, or another reader holds it.
				if err := c.cancel(); err != nil {
					return read, err
				}
				for d := range c.drain() {
					if read < n && !stopped {
						take(d)
					}
				}
				return read, ctx.Err()
			}
			take(d)
			probe.Reset(browseProbe)
		}
	}
	return read, ctx.Err()
}

// consumers are consumeAll's consumers on one channel, their deliveries
// merged. Only consumeAll's goroutine uses it.
type consumers struct {
	ch     *amqp.Channel
	queue  string
	tags   []string
	count  int                // consumers added
	live   int                // forwarders still running
	merged chan amqp.Delivery // every consumer's deliveries
	ended  chan struct{}      // a forwarder ended: its consumer's deliveries are all merged
}

// add starts one more consumer.
func (c *consumers) add(ctx context.Context) error {
	tag := fmt.Sprint("rebound-parked-browse-", c.count+1)
	ds, err := c.ch.ConsumeWithContext(ctx, c.queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", c.queue, err)
	}
	c.tags = append(c.tags, tag)
	c.count++
	c.live++
	go func() {
		for d := range ds {
			c.merged <- d
		}
		c.ended <- struct{}{}
	}()
	return nil
}

// cancel cancels the consumers still registered; their deliveries so far
// stay to be drained.
func (c *consumers) cancel() error {
	var err error
	for _, tag := range c.tags {
		if cerr := c.ch.Cancel(tag, false); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cancel the consumer: %w", cerr))
		}
	}
	c.tags = nil
	return err
}

// drain yields the deliveries made before the consumers were cancelled,
// until every forwarder has ended (a cancelled consumer's channel closes
// once the cancel is through, a closed channel's at once).
func (c *consumers) drain() func(yield func(amqp.Delivery) bool) {
	return func(yield func(amqp.Delivery) bool) {
		for c.live > 0 {
			select {
			case d := <-c.merged:
				if !yield(d) {
					return
				}
			case <-c.ended:
				c.live--
			}
		}
	}
}

// stop cancels the consumers and waits for their forwarders, dropping
// what they still hold: the final nack requeues it.
func (c *consumers) stop() error {
	err := c.cancel()
	if c.ch.IsClosed() {
		err = nil // the channel's end is the error the caller reports
	}
	for range c.drain() {
	}
	return err
}
