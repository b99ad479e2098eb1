package delayed

import (
	"context"
	"maps"
	"regexp"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/delayqueue"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
)

// The harness of the package's broker tests: one test's rebound
// deployment, its fixed queues declared as the sidecar declares them, and
// copies seeded into delay queues as the sidecar writes them.

type env struct {
	*brokertest.Deployment
	t      *testing.T
	dp     Deployment
	topo   topology.Topology
	quorum bool
}

// newEnv sets up a deployment of the queue type named, with vars laid
// over its naming variables, and declares its fixed queues.
func newEnv(t *testing.T, queueType string, vars map[string]string) *env {
	t.Helper()
	b := brokertest.Require(t)
	all := map[string]string{"REBOUND_QUEUE_TYPE": queueType}
	maps.Copy(all, vars)
	d := brokertest.NewDeployment(t, b, all, nil)
	cfg, err := config.Load(d.Environ())
	if err != nil {
		t.Fatal(err)
	}
	conn := b.Dial(t, d.URL())
	router := cfg.Router()
	router.Topology = router.Topology.ForServer(conn.Properties)
	if _, err := declarer.Declare(conn, router.Topology); err != nil {
		t.Fatal(err)
	}
	dp := Deployment{Conn: conn, PubConn: b.Dial(t, d.URL()), Router: router}
	return &env{Deployment: d, t: t, dp: dp, topo: router.Topology, quorum: queueType == "quorum"}
}

// waiting is a copy to seed into a delay queue.
type waiting struct {
	id     string
	origin string
	delay  time.Duration // its delay queue's
	due    time.Time     // zero: no due header (a copy of a rebound before it)
}

// declareDelays declares the delay queues of ds, as a replica does on
// first use.
func (e *env) declareDelays(ds ...time.Duration) {
	e.t.Helper()
	delays, err := delayqueue.New(e.Conn, e.topo, nil, time.Now)
	if err != nil {
		e.t.Fatal(err)
	}
	defer delays.Close()
	for _, d := range ds {
		if _, err := delays.Ensure(d); err != nil {
			e.t.Fatal(err)
		}
	}
}

// seed publishes the copies into their delay queues as the sidecar does
// (through the delay queue's exchange, routing key the origin, headers by
// Codec.Retry), declaring the queues, and waits for the broker's confirms.
func (e *env) seed(ws ...waiting) {
	e.t.Helper()
	codec := e.dp.Router.Codec
	label := e.dp.Router.Policies.Default().Label()
	declared := map[time.Duration]bool{}
	confirms := make([]*amqp.DeferredConfirmation, 0, len(ws))
	now := time.Now()
	for _, w := range ws {
		if !declared[w.delay] {
			e.declareDelays(w.delay)
			declared[w.delay] = true
		}
		s := headers.State{State: policy.State{Retries: 2, StartedAt: now.Add(-time.Hour), LastDelay: w.delay}, Origin: w.origin, Policy: label}
		h := codec.Retry(amqp.Table{"tenant": "acme"}, s, w.delay, w.due)
		dest := e.topo.Delayed(w.delay)
		dc, err := e.Ch.PublishWithDeferredConfirmWithContext(context.Background(), dest.Exchange, dest.RoutingKey, true, false,
			amqp.Publishing{MessageId: w.id, Headers: h, DeliveryMode: amqp.Persistent, Body: []byte("body of " + w.id)})
		if err != nil {
			e.t.Fatal(err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			e.t.Fatalf("seeded copy not confirmed: %v", err)
		}
	}
}

// app declares an application queue named prefix + suffix.
func (e *env) app(suffix string) string {
	e.t.Helper()
	name := e.Prefix + suffix
	e.Declare(name, nil)
	return name
}

// delayQueue is the name of d's delay queue.
func (e *env) delayQueue(d time.Duration) string {
	q, _ := e.topo.DelayQueue(d)
	return q.Name
}

// delays is the grid the tests look for delay queues on: two digits up to
// an hour, as the default configuration.
func delays() []time.Duration { return Delays(2, time.Hour) }

// find is Find over delays(), failing the test on an error.
func (e *env) find() []Queue {
	e.t.Helper()
	qs, err := e.dp.Find(context.Background(), delays())
	if err != nil {
		e.t.Fatal(err)
	}
	return qs
}

// take drains queue and returns what it held, by message id, flagging a
// copy held twice. The caller first waits for the count it expects.
func (e *env) take(queue string) map[string]amqp.Delivery {
	e.t.Helper()
	out := map[string]amqp.Delivery{}
	for _, d := range e.Drain(queue) {
		if _, dup := out[d.MessageId]; dup {
			e.t.Errorf("%s holds %s twice", queue, d.MessageId)
		}
		out[d.MessageId] = d
	}
	return out
}

// matching is Options for op on the origin queues re matches.
func matching(op Op, re string) Options {
	return Options{Op: op, Origins: regexp.MustCompile(re)}
}
