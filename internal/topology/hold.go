package topology

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The hold queue's delayed retry (RabbitMQ 4.3 quorum queues): a copy
// that a holder returns with the modified outcome and the message
// annotation x-opt-delivery-time is held until that time. Measured on
// 4.3.6: an explicit delivery time is honoured whatever the bounds (above
// the max, below the min); a return without one, or with one already
// past, waits the min; a return by a lost connection is not delayed.
const (
	// holdRetryMin is the wait of a copy returned with no delivery time,
	// or one already past by the broker's clock: it bounds how often a
	// copy can come back when rebound's clock runs behind the broker's.
	holdRetryMin = 100 * time.Millisecond
	// holdRetryMax is the longest wait the broker gives a returned copy
	// without a delivery time; the holder always gives one.
	holdRetryMax = 5 * time.Second
	// holdDeliveryLimit is -1, no limit. A return with the modified
	// outcome is not counted (delivery-failed false: x-delivery-count
	// stays absent), but a copy in flight when a holder's connection is
	// lost is, and a copy past the limit would be dead-lettered home at
	// once, before its time. Any finite limit is one crash loop away.
	holdDeliveryLimit = -1
)

// HoldQueue is the quorum queue that holds every delayed copy in hold
// mode: DelayQueuePrefix + "hold". A copy rejected by a holder is
// dead-lettered, at least once, to the default exchange under the routing
// key it was published with, its origin queue; a full queue refuses
// publishes (rebound sees a nack) rather than drop its oldest copy.
func (t Topology) HoldQueue() Queue {
	return Queue{Name: t.DelayQueuePrefix + "hold", Args: HoldQueueArgs()}
}

// HoldQueueArgs are the arguments of a hold queue, and of the queue that
// probes a broker for the capability.
func HoldQueueArgs() amqp.Table {
	return amqp.Table{
		amqp.QueueTypeArg:        amqp.QueueTypeQuorum,
		"x-delayed-retry-type":   "returned",
		"x-delayed-retry-min":    holdRetryMin.Milliseconds(),
		"x-delayed-retry-max":    holdRetryMax.Milliseconds(),
		"x-delivery-limit":       int64(holdDeliveryLimit),
		"x-dead-letter-exchange": "",
		"x-dead-letter-strategy": "at-least-once",
		amqp.QueueOverflowArg:    amqp.QueueOverflowRejectPublish,
	}
}

// HoldExchange is the fanout exchange bound to the hold queue alone:
// DelayExchange + ".hold".
func (t Topology) HoldExchange() Exchange {
	return Exchange{Name: t.DelayExchange + ".hold", Kind: amqp.ExchangeFanout}
}

// Held is the destination of a copy that waits in the hold queue and then
// goes back to origin.
func (t Topology) Held(origin string) Destination {
	return Destination{Exchange: t.HoldExchange().Name, RoutingKey: origin}
}

// HoldCommandsQueue is the stream that records `rebound delayed flush` and
// `cancel` for the holders: HoldQueue's name + ".commands". A stream,
// because every holder reads every command, from a point in time, without
// taking it from the others; a week of them is kept.
func (t Topology) HoldCommandsQueue() Queue {
	return Queue{Name: t.HoldQueue().Name + ".commands", Args: amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeStream, amqp.StreamMaxAgeArg: "7D"}}
}
