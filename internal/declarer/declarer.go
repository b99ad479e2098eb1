// Package declarer declares what rebound needs on the broker, as
// topology.Topology names it: the fixed exchanges, queues and bindings
// (Declare), and, by passive declaration, whether a queue exists (Origins,
// the one check of an origin queue that the consumer and `rebound parked
// replay` share). The delay queues, declared on first use, are
// internal/delayqueue's; it declares them with Exchange, Queue and Binding.
package declarer

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/topology"
)

// Declare declares t's fixed exchanges, queues and bindings, each on a
// channel of its own from conn (a refused declaration closes its channel).
// It is idempotent, and it takes over what an earlier rebound declared:
//
//   - The shared delay exchange of rebound before per-delay exchanges (a
//     headers exchange named DelayExchange) is left alone: older replicas
//     still publish to it during a rolling upgrade, and the copies it
//     routed expire back to their origin by routing key, as copies do now.
//
//   - A fixed queue that exists without the arguments this version adds
//     (the quorum inbox's dead-lettering to the parking queue, the
//     parking queue's delivery limit) cannot be changed: it is used as it
//     is, and a notice says what it lacks and how to add it by policy.
//
//   - A fixed queue that dead-letters to the default exchange (the hold
//     queue, a quorum inbox) needs write on amq.default to be declared;
//     refused that (least privilege, in hold mode), rebound uses the
//     queue an operator declared, and without one says what to declare
//     or grant.
//
// Any other difference, a classic queue where a quorum one is configured
// say, is an error: PRECONDITION_FAILED. notices are for the log.
func Declare(conn *amqp.Connection, t topology.Topology) (notices []string, err error) {
	for _, e := range t.Exchanges() {
		if err := withChannel(conn, func(ch *amqp.Channel) error { return Exchange(ch, e) }); err != nil {
			return notices, err
		}
	}
	for _, q := range t.Queues() {
		notice, err := declareFixedQueue(conn, t, q)
		if err != nil {
			return notices, err
		}
		if notice != "" {
			notices = append(notices, notice)
		}
	}
	err = withChannel(conn, func(ch *amqp.Channel) error {
		for _, b := range t.Bindings() {
			if err := Binding(ch, b); err != nil {
				return err
			}
		}
		return nil
	})
	return notices, err
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

// Exchange declares e, durable, on ch.
func Exchange(ch *amqp.Channel, e topology.Exchange) error {
	if err := ch.ExchangeDeclare(e.Name, e.Kind, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", e.Name, err)
	}
	return nil
}

func declareFixedQueue(conn *amqp.Connection, t topology.Topology, q topology.Queue) (notice string, err error) {
	err = withChannel(conn, func(ch *amqp.Channel) error { return Queue(ch, q) })
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
	if isAccessRefused(err) && deadLettersToDefault(q) {
		return "", declaredByOperator(conn, q, err)
	}
	legacy, missing, policy := t.WithoutAdded(q)
	if err == nil || !inequivalentAdded(err, missing) {
		return "", err
	}
	if err := withChannel(conn, func(ch *amqp.Channel) error { return Queue(ch, legacy) }); err != nil {
		return "", err
	}
	return fmt.Sprintf("queue %s was declared by an earlier rebound without %s, which a queue's declaration cannot add: %s; "+
		"apply them by policy (%s: deploy/rabbitmq/setup.sh or `rebound topology print` has it) or see docs/upgrading.md",
		q.Name, formatArgs(q.Args, missing), why(t, q.Name), policy), nil
}

// deadLettersToDefault reports whether q dead-letters to the default
// exchange (the hold queue, a quorum inbox): RabbitMQ checks write on the
// dead-letter exchange when such a queue is declared, and rebound's user
// need not have it in hold mode.
func deadLettersToDefault(q topology.Queue) bool {
	dlx, ok := q.Args["x-dead-letter-exchange"].(string)
	return ok && dlx == ""
}

// declaredByOperator is what Declare makes of the broker refusing (refused)
// to declare q, which dead-letters to the default exchange, for want of
// write on that exchange: nil when q exists (an operator declared it, as
// deploy/rabbitmq/setup.sh does in hold mode), else an error naming what
// to declare or grant. The refusal closed its channel: the check takes
// another.
func declaredByOperator(conn *amqp.Connection, q topology.Queue, refused error) error {
	exists, err := QueueExists(conn, q.Name)
	if err != nil {
		return fmt.Errorf("%w; and checking whether an operator declared it: %w", refused, err)
	}
	if exists {
		return nil
	}
	return fmt.Errorf("%w: declaring queue %s, which dead-letters to the default exchange, needs write on amq.default, which rebound's user "+
		"lacks (least privilege), and the queue does not exist: have an operator declare it (deploy/rabbitmq/setup.sh with DELAY_MODE=hold, or "+
		"`rebound topology declare` as a user with write on amq.default), or grant rebound's user write on amq.default", refused, q.Name)
}

// formatArgs lists the arguments of args that names names as
// "name=value", sorted.
func formatArgs(args amqp.Table, names []string) string {
	parts := make([]string, 0, len(names))
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s=%v", name, args[name]))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// why says what a fixed queue's added arguments protect against.
func why(t topology.Topology, queue string) string {
	if queue == t.ParkingQueue {
		return "on RabbitMQ 4.x a `rebound parked` command killed 20 times while holding a parked message drops it"
	}
	return "on RabbitMQ 4.x a message delivered 20 times without being settled (rebound killed while it was in flight) is dropped instead of parked"
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
func isAccessRefused(err error) bool { return isCode(err, amqp.AccessRefused) }

// isCode reports whether err is the broker's refusal with code.
func isCode(err error, code int) bool {
	var aerr *amqp.Error
	return errors.As(err, &aerr) && aerr.Code == code
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
// declaration because the queue lacks one of the arguments added since an
// earlier rebound declared it.
func inequivalentAdded(err error, added []string) bool {
	for _, name := range added {
		if inequivalent(err, name, "none") {
			return true
		}
	}
	return false
}

// Queue declares q, durable, with its arguments on ch.
func Queue(ch *amqp.Channel, q topology.Queue) error {
	if _, err := ch.QueueDeclare(q.Name, true, false, false, false, q.Args); err != nil {
		return fmt.Errorf("declare queue %s: %w", q.Name, err)
	}
	return nil
}

// Binding binds b's queue to its exchange on ch.
func Binding(ch *amqp.Channel, b topology.Binding) error {
	if err := ch.QueueBind(b.Queue, b.Key, b.Exchange, false, b.Args); err != nil {
		return fmt.Errorf("bind queue %s to %s: %w", b.Queue, b.Exchange, err)
	}
	return nil
}
