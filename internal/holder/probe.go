package holder

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"time"

	amqp10 "github.com/Azure/go-amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/dialer"
	"github.com/rebound-mq/rebound/internal/topology"
)

// probeWait is how long the probe asks the broker to hold its message.
const probeWait = time.Second

// errCannotHold says the broker cannot do hold mode.
var errCannotHold = errors.New("the broker cannot hold returned messages (hold mode needs RabbitMQ 4.3+ quorum queues with delayed retry, served over AMQP 1.0)")

// Probe finds out whether the broker can do hold mode by doing it once:
// a message published through an exchange of its own into a queue of its
// own, declared as the hold queue is, consumed over AMQP 1.0, returned
// with a delivery time probeWait ahead, must come back no sooner. A
// version check would lie in a mixed-version cluster, and RabbitMQ before
// 4.3 accepts the hold queue's arguments and ignores them. The probe's
// queue expires by itself if rebound dies before deleting it.
//
// A failure that says nothing of the capability (a quorum queue the broker
// could not create in time, on a busy node, say) is tried again, up to
// probeAttempts times, before it is returned.
func Probe(ctx context.Context, d *dialer.Dialer, topo topology.Topology) error {
	var err error
	for attempt := range probeAttempts {
		if err = probeOnce(ctx, d, topo); err == nil || errors.Is(err, errCannotHold) {
			return err
		}
		t := time.NewTimer(time.Duration(attempt+1) * 2 * time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
	return err
}

// probeAttempts is how many times Probe tries before it gives up.
const probeAttempts = 4

func probeOnce(ctx context.Context, d *dialer.Dialer, topo topology.Topology) error {
	suffix := fmt.Sprintf("probe.%08x", rand.Uint32())
	queue, exchange := topo.HoldQueue().Name+"."+suffix, topo.HoldExchange().Name+"."+suffix
	conn, err := d.Dial(ctx, "hold probe")
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	args := topology.HoldQueueArgs()
	args["x-expires"] = int64(10 * time.Minute / time.Millisecond)
	// The probe's message is never dead-lettered, and declaring a queue
	// that dead-letters to the default exchange needs write on it, which
	// hold mode does without.
	delete(args, "x-dead-letter-exchange")
	delete(args, "x-dead-letter-strategy")
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.PreconditionFailed {
			return fmt.Errorf("%w: declare %s: %v", errCannotHold, queue, err)
		}
		return fmt.Errorf("declare probe queue %s: %w", queue, err)
	}
	defer func() { cleanup(conn, queue, exchange) }()
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", exchange, err)
	}
	if err := ch.QueueBind(queue, "", exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s: %w", queue, err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, queue, true, false, amqp.Publishing{MessageId: suffix})
	if err != nil {
		return fmt.Errorf("publish the probe: %w", err)
	}
	if ok, err := confirm.WaitContext(ctx); err != nil || !ok {
		return fmt.Errorf("publish the probe: not confirmed (%v)", err)
	}

	c10, err := d.Dial10(ctx, "hold probe")
	if err != nil {
		return fmt.Errorf("%w: %v", errCannotHold, err)
	}
	defer c10.Close()
	sess, err := c10.NewSession(ctx, nil)
	if err != nil {
		return fmt.Errorf("%w: begin AMQP 1.0 session: %v", errCannotHold, err)
	}
	rcv, err := sess.NewReceiver(ctx, queueAddress(queue), &amqp10.ReceiverOptions{Credit: 1})
	if err != nil {
		return fmt.Errorf("%w: consume %s over AMQP 1.0: %v", errCannotHold, queue, err)
	}
	defer rcv.Close(context.WithoutCancel(ctx))
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msg, err := rcv.Receive(waitCtx, nil)
	if err != nil {
		return fmt.Errorf("receive the probe: %w", err)
	}
	returned := time.Now()
	due := returned.Add(probeWait)
	if err := rcv.ModifyMessage(ctx, msg, &amqp10.ModifyMessageOptions{
		Annotations: amqp10.Annotations{headers.XOptDeliveryTime: due.UnixMilli()}}); err != nil {
		return fmt.Errorf("return the probe: %w", err)
	}
	if msg, err = rcv.Receive(waitCtx, nil); err != nil {
		return fmt.Errorf("%w: the probe returned with a delivery time did not come back within 30s: %v", errCannotHold, err)
	}
	back := time.Since(returned)
	_ = rcv.AcceptMessage(ctx, msg)
	// A broker that cannot hold returns the message at once; some
	// margin for the clocks' millisecond rounding.
	if back < probeWait-100*time.Millisecond {
		return fmt.Errorf("%w: the probe returned with a delivery time %s ahead came back after %s", errCannotHold, probeWait, back.Round(time.Millisecond))
	}
	return nil
}

func cleanup(conn *amqp.Connection, queue, exchange string) {
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	_, _ = ch.QueueDelete(queue, false, false, false)
	_ = ch.ExchangeDelete(exchange, false, false)
}

// queueAddress is queue's AMQP 1.0 address on RabbitMQ 4 (address format
// v2): its name percent-encoded, so that a prefix with "/" or "%" in it
// names the queue and not another address.
func queueAddress(queue string) string { return "/queues/" + url.PathEscape(queue) }
