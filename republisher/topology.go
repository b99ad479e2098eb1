package republisher

import (
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DelayRouteHeader carries the delay, in milliseconds, that the delay
// exchange routes on. It must not start with "x-": RabbitMQ's headers
// exchange ignores binding arguments with that prefix, so a binding on an
// x- header would match every message and copy it into every delay queue.
const DelayRouteHeader = "rebound-delay-ms"

// Topology names everything rebound declares on the broker. It is the one
// description both the sidecar and `rebound topology` work from.
type Topology struct {
	InboxQueue         string
	DeadLetterExchange string // fanout, bound to InboxQueue
	DelayExchange      string // headers exchange, routes on DelayRouteHeader
	DelayQueuePrefix   string
	ParkingQueue       string
	Quorum             bool // declare quorum queues instead of classic ones
}

// Exchange is one exchange rebound declares.
type Exchange struct {
	Name string
	Kind string
}

// Queue is one queue rebound declares, with its arguments.
type Queue struct {
	Name string
	Args amqp.Table
}

// Binding binds a queue to an exchange.
type Binding struct {
	Exchange string
	Queue    string
	Key      string
	Args     amqp.Table
}

// Exchanges returns the exchanges rebound needs, all durable.
func (t Topology) Exchanges() []Exchange {
	return []Exchange{
		{Name: t.DeadLetterExchange, Kind: amqp.ExchangeFanout},
		{Name: t.DelayExchange, Kind: amqp.ExchangeHeaders},
	}
}

// Queues returns the fixed queues rebound needs, all durable. Delay queues
// are declared on first use; see DelayQueue.
func (t Topology) Queues() []Queue {
	return []Queue{
		{Name: t.InboxQueue, Args: t.queueArgs()},
		{Name: t.ParkingQueue, Args: t.queueArgs()},
	}
}

// Bindings returns the fixed bindings: the dead-letter exchange to the inbox.
func (t Topology) Bindings() []Binding {
	return []Binding{{Exchange: t.DeadLetterExchange, Queue: t.InboxQueue}}
}

func (t Topology) queueArgs() amqp.Table {
	if t.Quorum {
		return amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
	}
	return amqp.Table{}
}

// DelayQueue returns the queue that holds messages for delay d and its
// binding on the delay exchange. Messages expire after d and are
// dead-lettered to the default exchange under the routing key they were
// published with: the origin queue. There is deliberately no x-expires: a
// queue that expires is deleted with the messages it still holds.
func (t Topology) DelayQueue(d time.Duration) (Queue, Binding) {
	ms := d.Milliseconds()
	args := t.queueArgs()
	args[amqp.QueueMessageTTLArg] = ms
	args["x-dead-letter-exchange"] = ""
	if t.Quorum {
		// The hop back to the origin queue is confirmed inside the broker,
		// and a full delay queue refuses the publish (rebound sees a nack)
		// instead of dropping the oldest message.
		args["x-dead-letter-strategy"] = "at-least-once"
		args[amqp.QueueOverflowArg] = amqp.QueueOverflowRejectPublish
	}
	q := Queue{Name: t.DelayQueuePrefix + strconv.FormatInt(ms, 10), Args: args}
	b := Binding{Exchange: t.DelayExchange, Queue: q.Name, Args: amqp.Table{"x-match": "all", DelayRouteHeader: ms}}
	return q, b
}

// Declare declares the exchanges, fixed queues and bindings on ch. It is
// idempotent; a queue that exists with other arguments fails with a
// PRECONDITION_FAILED error that closes ch.
func (t Topology) Declare(ch *amqp.Channel) error {
	for _, e := range t.Exchanges() {
		if err := ch.ExchangeDeclare(e.Name, e.Kind, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", e.Name, err)
		}
	}
	for _, q := range t.Queues() {
		if err := declareQueue(ch, q); err != nil {
			return err
		}
	}
	for _, b := range t.Bindings() {
		if err := bind(ch, b); err != nil {
			return err
		}
	}
	return nil
}

// DeclareDelayQueue declares the delay queue for d and binds it.
func (t Topology) DeclareDelayQueue(ch *amqp.Channel, d time.Duration) error {
	q, b := t.DelayQueue(d)
	if err := declareQueue(ch, q); err != nil {
		return err
	}
	return bind(ch, b)
}

func declareQueue(ch *amqp.Channel, q Queue) error {
	if _, err := ch.QueueDeclare(q.Name, true, false, false, false, q.Args); err != nil {
		return fmt.Errorf("declare queue %s: %w", q.Name, err)
	}
	return nil
}

func bind(ch *amqp.Channel, b Binding) error {
	if err := ch.QueueBind(b.Queue, b.Key, b.Exchange, false, b.Args); err != nil {
		return fmt.Errorf("bind queue %s to %s: %w", b.Queue, b.Exchange, err)
	}
	return nil
}
