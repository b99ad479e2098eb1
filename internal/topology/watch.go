package topology

// Which replica reads the broker's counts for the gauges. Every replica of
// a vhost sees the same inbox, parking queue and delay queues, so one
// reading is enough: the replica that holds the watch token reads them,
// and the others read nothing (apart from the inbox's consumer count,
// which a replica needs for its share of a retry rate).
//
// The token is a message in the watch queue, a classic queue with a
// single active consumer: every replica consumes it with a prefetch of
// one, the broker delivers only to the active consumer, and that one
// holds the token unacknowledged for as long as its connection lives.
// When it goes, the broker requeues the token and hands it to the next
// active consumer. Each replica publishes a token when it joins, so there
// is always one; the queue keeps at most one ready (x-max-length 1, the
// oldest dropped), so the tokens of restarts do not pile up. Electing
// costs each replica three calls when it connects and none afterwards.

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// WatchQueue is the queue of the watch token.
func (t Topology) WatchQueue() string { return t.DelayQueuePrefix + "watch" }

// ErrWatchRefused means the broker refuses the watch queue for want of a
// permission (configure and read on it, and in hold mode write, for its
// exchange): permissions from before it.
var ErrWatchRefused = errors.New("no permission on the watch queue: grant rebound's user configure and read on it, and in hold mode write (deploy/rabbitmq/setup.sh); every replica reads the broker's counts meanwhile")

// JoinWatch declares the watch queue on ch, consumes it as one of its
// single-active-consumer candidates and publishes a token (in hold mode
// through the watch queue's own exchange, watchExchange); a
// delivery on the returned channel makes this connection the one that
// reads the counts, until ch or its connection closes. It returns
// ErrWatchRefused when the broker refuses a permission (and closes ch).
func (t Topology) JoinWatch(ch *amqp.Channel, consumer string) (<-chan amqp.Delivery, error) {
	_, err := ch.QueueDeclare(t.WatchQueue(), true, false, false, false, amqp.Table{
		"x-queue-type": "classic", "x-single-active-consumer": true,
		"x-max-length": int64(1), "x-overflow": "drop-head",
	})
	if refused(err) {
		return nil, fmt.Errorf("%w: %w", ErrWatchRefused, err)
	}
	if err != nil {
		return nil, fmt.Errorf("declare watch queue: %w", err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		return nil, fmt.Errorf("watch queue prefetch: %w", err)
	}
	d, err := ch.Consume(t.WatchQueue(), consumer, false, false, false, false, nil)
	if refused(err) {
		return nil, fmt.Errorf("%w: %w", ErrWatchRefused, err)
	}
	if err != nil {
		return nil, fmt.Errorf("consume watch queue: %w", err)
	}
	exchange, err := t.watchExchange(ch)
	if refused(err) {
		return nil, fmt.Errorf("%w: %w", ErrWatchRefused, err)
	}
	if err != nil {
		return nil, err
	}
	// Last, and not waited on: a connection that publishes during a
	// resource alarm is blocked, and every call after this one that waits
	// for the broker's answer would wait out the alarm.
	if err := ch.PublishWithContext(context.Background(), exchange, t.WatchQueue(), false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("watch")}); err != nil {
		return nil, fmt.Errorf("publish watch token: %w", err)
	}
	return d, nil
}

// refused reports whether err is the broker refusing an operation for want
// of a permission.
func refused(err error) bool {
	var aerr *amqp.Error
	return errors.As(err, &aerr) && aerr.Code == amqp.AccessRefused
}

// watchExchange returns the exchange the watch token is published
// through: the default exchange in queues mode, and in hold mode, where
// rebound's user need not write there, a fanout exchange named as the
// watch queue and bound to it alone, which it declares and binds on ch.
func (t Topology) watchExchange(ch *amqp.Channel) (string, error) {
	if !t.Hold {
		return "", nil
	}
	name := t.WatchQueue()
	if err := ch.ExchangeDeclare(name, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return "", fmt.Errorf("declare watch exchange: %w", err)
	}
	if err := ch.QueueBind(name, "", name, false, nil); err != nil {
		return "", fmt.Errorf("bind watch queue: %w", err)
	}
	return name, nil
}
