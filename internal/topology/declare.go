package topology

import (
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Declare declares the fixed exchanges, queues and bindings, each on a
// channel of its own from conn (a refused declaration closes its channel).
// It is idempotent, and it takes over what an earlier rebound declared:
//
//   - The shared delay exchange of rebound before per-delay exchanges (a
//     headers exchange named DelayExchange) is left alone: older replicas
//     still publish to it during a rolling upgrade, and the copies it
//     routed expire back to their origin by routing key, as copies do now.
//   - A fixed queue that exists without the arguments this version adds
//     (the quorum inbox's dead-lettering to the parking queue, the
//     parking queue's delivery limit) cannot be changed: it is used as it
//     is, and a notice says what it lacks and how to add it by policy.
//
// Any other difference, a classic queue where a quorum one is configured
// say, is an error: PRECONDITION_FAILED. notices are for the log.
func (t Topology) Declare(conn *amqp.Connection) (notices []string, err error) {
	for _, e := range t.Exchanges() {
		if err := withChannel(conn, e.Declare); err != nil {
			return notices, err
		}
	}
	for _, q := range t.Queues() {
		notice, err := t.declareFixedQueue(conn, q)
		if err != nil {
			return notices, err
		}
		if notice != "" {
			notices = append(notices, notice)
		}
	}
	err = withChannel(conn, func(ch *amqp.Channel) error {
		for _, b := range t.Bindings() {
			if err := b.Declare(ch); err != nil {
				return err
			}
		}
		return nil
	})
	return notices, err
}

// DeclareDelayQueue declares the delay queue for d and its exchange, and
// binds them.
func (t Topology) DeclareDelayQueue(ch *amqp.Channel, d time.Duration) error {
	q, b := t.DelayQueue(d)
	if err := t.DelayExchangeFor(d).Declare(ch); err != nil {
		return err
	}
	if err := q.Declare(ch); err != nil {
		return err
	}
	return b.Declare(ch)
}

// withChannel runs f on a new channel of conn and closes it.
func withChannel(conn *amqp.Connection, f func(*amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	return f(ch)
}

// Declare declares e, durable, on ch.
func (e Exchange) Declare(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(e.Name, e.Kind, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", e.Name, err)
	}
	return nil
}

// addedArgs are the queue arguments this version of rebound declares that
// earlier ones did not: a fixed queue that lacks only these is an earlier
// rebound's, and is kept.
var addedArgs = []string{"x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy", amqp.QueueOverflowArg, "x-delivery-limit"}

func (t Topology) declareFixedQueue(conn *amqp.Connection, q Queue) (notice string, err error) {
	err = withChannel(conn, q.Declare)
	if q.Name == t.InUseQueue() && isAccessRefused(err) {
		// Permissions from before leases: rebound runs on without them.
		return fmt.Sprintf("cannot declare %s (%v): this replica's leases of the delay queues it uses are lost, and `rebound topology prune` "+
			"refuses to delete any while it runs; grant rebound's user configure and read on it (deploy/rabbitmq/setup.sh)", q.Name, err), nil
	}
	if q.Name == t.InUseQueue() && isChannelError(err) {
		// Leases serve `rebound topology prune`, not the retries: a lease
		// queue the broker cannot give (a classic queue whose cluster
		// node is down) must not stop rebound from moving messages.
		return fmt.Sprintf("cannot declare %s (%v): this replica's leases of the delay queues it uses are lost until it reconnects, "+
			"and `rebound topology prune` refuses to delete any meanwhile", q.Name, err), nil
	}
	if err == nil || !inequivalentAdded(err) {
		return "", err
	}
	legacy := Queue{Name: q.Name, Args: maps.Clone(q.Args)}
	var missing []string
	for _, name := range addedArgs {
		if v, ok := legacy.Args[name]; ok {
			missing = append(missing, fmt.Sprintf("%s=%v", name, v))
			delete(legacy.Args, name)
		}
	}
	if err := withChannel(conn, legacy.Declare); err != nil {
		return "", err
	}
	sort.Strings(missing)
	return fmt.Sprintf("queue %s was declared by an earlier rebound without %s, which a queue's declaration cannot add: %s; "+
		"apply them by policy (%s: deploy/rabbitmq/setup.sh or `rebound topology print` has it) or see docs/upgrading.md",
		q.Name, strings.Join(missing, ", "), t.why(q.Name), t.policyFor(q.Name)), nil
}

// why says what a fixed queue's added arguments protect against.
func (t Topology) why(queue string) string {
	if queue == t.ParkingQueue {
		return "on RabbitMQ 4.x a `rebound parked` command killed 20 times while holding a parked message drops it"
	}
	return "on RabbitMQ 4.x a message delivered 20 times without being settled (rebound killed while it was in flight) is dropped instead of parked"
}

// policyFor names the policy that adds what a fixed queue lacks.
func (t Topology) policyFor(queue string) string {
	if queue == t.ParkingQueue {
		return ParkingNoDeliveryLimitPolicyName
	}
	return InboxDeadLetterPolicyName
}

// inequivalent reports whether err is the broker refusing a declaration
// because the existing object's arg differs, and its message holds
// current ("but current is 'headers'").
func inequivalent(err error, arg, current string) bool {
	var aerr *amqp.Error
	return errors.As(err, &aerr) && aerr.Code == amqp.PreconditionFailed &&
		strings.Contains(aerr.Reason, "inequivalent arg '"+arg+"'") && strings.Contains(aerr.Reason, "current is "+current)
}

// isAccessRefused reports whether err is the broker refusing an operation
// for want of a permission.
func isAccessRefused(err error) bool {
	var aerr *amqp.Error
	return errors.As(err, &aerr) && aerr.Code == amqp.AccessRefused
}

// isChannelError reports whether err is the broker refusing one
// operation on a channel (a queue not found, not equivalent, refused or
// locked), not the connection failing.
func isChannelError(err error) bool {
	var aerr *amqp.Error
	if !errors.As(err, &aerr) {
		return false
	}
	switch aerr.Code {
	case amqp.NotFound, amqp.PreconditionFailed, amqp.AccessRefused, amqp.ResourceLocked:
		return true
	}
	return false
}

// inequivalentAdded reports whether err is the broker refusing a queue
// declaration because the queue lacks one of addedArgs.
func inequivalentAdded(err error) bool {
	for _, name := range addedArgs {
		if inequivalent(err, name, "none") {
			return true
		}
	}
	return false
}

// Declare declares q, durable, with its arguments on ch.
func (q Queue) Declare(ch *amqp.Channel) error {
	if _, err := ch.QueueDeclare(q.Name, true, false, false, false, q.Args); err != nil {
		return fmt.Errorf("declare queue %s: %w", q.Name, err)
	}
	return nil
}

// Declare binds b's queue to its exchange on ch.
func (b Binding) Declare(ch *amqp.Channel) error {
	if err := ch.QueueBind(b.Queue, b.Key, b.Exchange, false, b.Args); err != nil {
		return fmt.Errorf("bind queue %s to %s: %w", b.Queue, b.Exchange, err)
	}
	return nil
}

func formatArgs(args amqp.Table) string {
	if len(args) == 0 {
		return ""
	}
	parts := make([]string, 0, len(args))
	for k, v := range args {
		parts = append(parts, fmt.Sprintf("%s=%v", k, v))
	}
	sort.Strings(parts)
	return ", " + strings.Join(parts, ", ")
}
