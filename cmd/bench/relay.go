package main

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The bare relay is the floor any amqp091-go client can reach: it consumes
// the source, publishes each delivery unchanged (same properties, headers
// and body) to the destination through the default exchange, acks the
// source once the broker confirmed the copy, and does nothing else: no
// decoding, no decision, no mandatory flag, no returns. rebound does
// everything it does, and more; what the relay cannot beat on a broker,
// no amqp091-go client can.

// relayPrefetch is the relay's prefetch: rebound's default ceiling
// (REBOUND_PREFETCH), which rebound's window reaches with these small
// messages, so that the two hold as many copies unconfirmed and their CPU
// per message compares.
const relayPrefetch = 1024

// startRelay runs the relay from src to dst (a queue name), with one
// consume and one publish connection as rebound has; stop closes them,
// leaving unacked deliveries to be requeued.
func startRelay(ctx context.Context, url, src, dst string, prefetch int) (stop func() error, err error) {
	var conns []*amqp.Connection
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	fail := func(format string, a ...any) (func() error, error) {
		closeAll()
		return nil, fmt.Errorf("relay: "+format, a...)
	}
	for _, name := range []string{"bench relay consume", "bench relay publish"} {
		conn, err := amqp.DialConfig(url, amqp.Config{Properties: amqp.Table{"connection_name": name}})
		if err != nil {
			return fail("connect: %w", err)
		}
		conns = append(conns, conn)
	}
	r := &relay{dst: dst}
	if r.pub, err = conns[1].Channel(); err != nil {
		return fail("open channel: %w", err)
	}
	if err := r.pub.Confirm(false); err != nil {
		return fail("enable confirms: %w", err)
	}
	if r.ch, err = conns[0].Channel(); err != nil {
		return fail("open channel: %w", err)
	}
	if err := r.ch.Qos(prefetch, 0, false); err != nil {
		return fail("set prefetch: %w", err)
	}
	deliveries, err := r.ch.Consume(src, "", false, false, false, false, nil)
	if err != nil {
		return fail("consume %s: %w", src, err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.loop(runCtx, deliveries) }()
	return func() error {
		cancel()
		err := <-done
		closeAll()
		return err
	}, nil
}

// relay is the running relay's state, owned by its loop. A copy's outcome
// is its DeferredConfirmation: amqp091-go v1.16.0's NotifyPublish reports
// a nack followed by a multiple ack covering its tag as an ack.
type relay struct {
	ch      *amqp.Channel // the consume channel, where acks go
	pub     *amqp.Channel
	dst     string
	unacked []copied // in publish order, which is delivery order
}

// copied is a copy sent and the delivery it was made from.
type copied struct {
	tag uint64
	dc  *amqp.DeferredConfirmation
}

func (r *relay) loop(ctx context.Context, deliveries <-chan amqp.Delivery) error {
	for {
		var oldest <-chan struct{} // nil, never ready, when none is pending
		if len(r.unacked) > 0 {
			oldest = r.unacked[0].dc.Done()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-oldest:
			if err := r.ack(); err != nil {
				return err
			}
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("relay: deliveries stopped")
			}
			if err := r.publish(ctx, d); err != nil {
				return err
			}
		}
	}
}

func (r *relay) publish(ctx context.Context, d amqp.Delivery) error {
	msg := amqp.Publishing{
		Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: d.DeliveryMode, Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo,
		Expiration: d.Expiration, MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, UserId: d.UserId,
		AppId: d.AppId, Body: d.Body,
	}
	dc, err := r.pub.PublishWithDeferredConfirmWithContext(ctx, "", r.dst, false, false, msg)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("relay: publish: %w", err)
	}
	r.unacked = append(r.unacked, copied{d.DeliveryTag, dc})
	return nil
}

// ack acks, with one multiple ack, every delivery whose copy and whose
// predecessors' copies are confirmed.
func (r *relay) ack() error {
	n := 0
	for ; n < len(r.unacked) && isDone(r.unacked[n].dc); n++ {
		if c := r.unacked[n]; !c.dc.Acked() { // a nack, or the channel closed
			return fmt.Errorf("relay: copy of delivery %d not confirmed (publish channel closed: %t)", c.tag, r.pub.IsClosed())
		}
	}
	if err := r.ch.Ack(r.unacked[n-1].tag, true); err != nil {
		return fmt.Errorf("relay: ack: %w", err)
	}
	r.unacked = r.unacked[n:]
	return nil
}

func isDone(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return true
	default:
		return false
	}
}
