package brokertest

import (
	"context"
	"maps"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/topology"
)

// Deployment is one test's private rebound deployment on a broker: a
// prefix no other test or run uses, the REBOUND_* variables that name
// rebound's queues and exchanges with it, the dead-letter exchange and an
// application queue dead-lettering to it (declared as an application team
// does, before rebound first starts), and the test's own connection and
// channel (in confirm mode). Everything whose name starts with the prefix,
// what rebound declares for the test included, is deleted at cleanup.
type Deployment struct {
	T      testing.TB
	Broker *Broker
	Prefix string
	App    string            // the application queue
	Vars   map[string]string // REBOUND_* variables; a test adds its own
	Conn   *amqp.Connection  // the test's own
	Ch     *amqp.Channel     // the test's own, in confirm mode
}

// NewDeployment sets up a deployment on b, in the virtual host of url,
// with vars laid over the naming variables (REBOUND_AMQP_URL in vars
// points it at another virtual host). queueArgs are the application
// queue's arguments besides its dead-lettering.
func NewDeployment(t testing.TB, b *Broker, vars map[string]string, queueArgs amqp.Table) *Deployment {
	t.Helper()
	prefix := Unique(t)
	d := &Deployment{T: t, Broker: b, Prefix: prefix, App: prefix + "app"}
	d.Vars = map[string]string{
		"REBOUND_AMQP_URL":             b.URL,
		"REBOUND_INBOX_QUEUE":          prefix + "inbox",
		"REBOUND_DEAD_LETTER_EXCHANGE": prefix + "dlx",
		"REBOUND_DELAY_EXCHANGE":       prefix + "delay",
		"REBOUND_DELAY_QUEUE_PREFIX":   prefix + "delay.",
		"REBOUND_PARKING_QUEUE":        prefix + "parked",
	}
	maps.Copy(d.Vars, vars)
	d.Conn = b.Dial(t, d.URL())
	ch, err := d.Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	d.Ch = ch
	b.CleanupPrefix(t, d.URL(), prefix)
	if err := ch.ExchangeDeclare(d.Vars["REBOUND_DEAD_LETTER_EXCHANGE"], amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	args := amqp.Table{"x-dead-letter-exchange": d.Vars["REBOUND_DEAD_LETTER_EXCHANGE"]}
	maps.Copy(args, queueArgs)
	d.Declare(d.App, args)
	return d
}

// URL is the deployment's broker URL.
func (d *Deployment) URL() string { return d.Vars["REBOUND_AMQP_URL"] }

// Environ returns the deployment's variables in os.Environ form.
func (d *Deployment) Environ() []string {
	out := make([]string, 0, len(d.Vars))
	for k, v := range d.Vars {
		out = append(out, k+"="+v)
	}
	return out
}

// Config is the configuration rebound loads from the deployment's
// variables; the test fails when they do not load.
func (d *Deployment) Config() config.Config {
	d.T.Helper()
	cfg, err := config.Load(d.Environ())
	if err != nil {
		d.T.Fatalf("the deployment's configuration: %v", err)
	}
	return cfg
}

// Topology returns the deployment's topology as rebound names it, for the
// broker of d's connection; quorum says which queue type.
func (d *Deployment) Topology(quorum bool) topology.Topology {
	return topology.Topology{
		InboxQueue:         d.Vars["REBOUND_INBOX_QUEUE"],
		DeadLetterExchange: d.Vars["REBOUND_DEAD_LETTER_EXCHANGE"],
		DelayExchange:      d.Vars["REBOUND_DELAY_EXCHANGE"],
		DelayQueuePrefix:   d.Vars["REBOUND_DELAY_QUEUE_PREFIX"],
		ParkingQueue:       d.Vars["REBOUND_PARKING_QUEUE"],
		Quorum:             quorum,
	}.ForServer(d.Conn.Properties)
}

// Declare declares a durable queue with args (a classic one unless they
// say otherwise).
func (d *Deployment) Declare(queue string, args amqp.Table) {
	d.T.Helper()
	if _, err := d.Ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		d.T.Fatal(err)
	}
}

// Publish sends msgs to queue through the default exchange and waits for
// the broker's confirm of each. Messages without a delivery mode are sent
// persistent.
func (d *Deployment) Publish(queue string, msgs ...amqp.Publishing) {
	d.T.Helper()
	for i := range msgs {
		if msgs[i].DeliveryMode == 0 {
			msgs[i].DeliveryMode = amqp.Persistent
		}
	}
	PublishConfirmed(d.T, d.Ch, queue, msgs...)
}

// QueueLen returns how many ready messages queue holds, on a connection of
// its own; the queue must exist.
func (d *Deployment) QueueLen(queue string) int {
	d.T.Helper()
	n, err := QueueLen(d.URL(), queue)
	if err != nil {
		d.T.Fatal(err)
	}
	return n
}

// QueueLenOr returns how many ready messages queue holds, or missing when
// it cannot be read (gone, or the broker down): for polling loops.
func (d *Deployment) QueueLenOr(queue string, missing int) int {
	n, err := QueueLen(d.URL(), queue)
	if err != nil {
		return missing
	}
	return n
}

// WaitQueueLen waits up to timeout until queue holds n ready messages.
func (d *Deployment) WaitQueueLen(queue string, n int, timeout time.Duration) {
	d.T.Helper()
	WaitQueueLen(d.T, d.URL(), queue, n, timeout)
}

// Drain takes every message queue holds now off it, acked.
func (d *Deployment) Drain(queue string) []amqp.Delivery {
	d.T.Helper()
	return Drain(d.T, d.Ch, queue)
}

// Get waits up to timeout for a message in queue and takes it, unacked.
func (d *Deployment) Get(queue string, timeout time.Duration) amqp.Delivery {
	d.T.Helper()
	var m amqp.Delivery
	var err error
	ok := false
	Await(timeout, func() bool {
		m, ok, err = d.Ch.Get(queue, false)
		return ok || err != nil
	})
	if err != nil {
		d.T.Fatalf("get from %s: %v", queue, err)
	}
	if !ok {
		d.T.Fatalf("no message in %s after %s", queue, timeout)
	}
	return m
}

// Reject takes the next message of queue, waiting up to timeout, and
// rejects it without requeue, as a failing consumer does: the broker
// dead-letters it to rebound.
func (d *Deployment) Reject(queue string, timeout time.Duration) amqp.Delivery {
	d.T.Helper()
	m := d.Get(queue, timeout)
	if err := m.Nack(false, false); err != nil {
		d.T.Fatal(err)
	}
	return m
}

// PublishTo sends msg to queue through the default exchange without
// waiting for the confirm, as a producer that does not care does.
func (d *Deployment) PublishTo(queue string, msg amqp.Publishing) {
	d.T.Helper()
	if err := d.Ch.PublishWithContext(context.Background(), "", queue, false, false, msg); err != nil {
		d.T.Fatal(err)
	}
}
