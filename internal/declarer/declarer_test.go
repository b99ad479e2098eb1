package declarer_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/delayqueue"
)

// TestDeclareOnTheBroker: Declare makes every exchange, queue and binding
// the topology names, and declaring again changes nothing; a delay queue
// and its exchange are declared on first use; Origins tells a queue
// from a missing one; the other queue type over the same names is
// refused; the lock is one connection's at a time, and another's once
// released. Classic and quorum.
func TestDeclareOnTheBroker(t *testing.T) {
	b := brokertest.Require(t)
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		d := brokertest.NewDeployment(t, b, nil, nil)
		topo := d.Topology(queueType == "quorum")
		for i := range 2 {
			notices, err := declarer.Declare(d.Conn, topo)
			if err != nil || len(notices) != 0 {
				t.Fatalf("declaration %d: notices %q, %v", i+1, notices, err)
			}
		}
		delay := 10 * time.Minute // longer than the test: the message stays
		delays, err := delayqueue.New(d.Conn, topo, nil, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		defer delays.Close()
		if _, err := delays.Ensure(delay); err != nil {
			t.Fatal(err)
		}
		origins := declarer.NewOrigins(d.Conn, nil, nil, time.Now)
		delayQueue, _ := topo.DelayQueue(delay)
		for _, q := range append(topo.Queues(), delayQueue) {
			if exists, checked, err := origins.Exists(q.Name); err != nil || !exists || !checked {
				t.Errorf("queue %s: exists %v, %v", q.Name, exists, err)
			}
		}
		if exists, checked, err := origins.Exists(d.Prefix + "missing"); err != nil || exists || !checked {
			t.Errorf("a missing queue: exists %v, %v", exists, err)
		}
		// A message sent to the delay exchange reaches the delay queue.
		if err := d.Ch.Publish(topo.DelayExchangeFor(delay).Name, d.App, false, false, amqp.Publishing{MessageId: "m"}); err != nil {
			t.Fatal(err)
		}
		d.WaitQueueLen(delayQueue.Name, 1, 10*time.Second)

		other := topo
		other.Quorum = !topo.Quorum
		if _, err := declarer.Declare(b.Dial(t, d.URL()), other); err == nil {
			t.Error("the other queue type over the same names was declared without an error")
		}

		channel := func(conn *amqp.Connection) *amqp.Channel {
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			return ch
		}
		holder, rival := channel(d.Conn), b.Dial(t, d.URL())
		if err := delayqueue.Lock(holder, topo); err != nil {
			t.Fatal(err)
		}
		if err := delayqueue.Lock(channel(rival), topo); !errors.Is(err, delayqueue.ErrLocked) {
			t.Fatalf("a second connection took the lock: %v, want ErrLocked", err)
		}
		if err := delayqueue.Unlock(holder, topo); err != nil {
			t.Fatal(err)
		}
		if err := delayqueue.Lock(channel(rival), topo); err != nil {
			t.Errorf("the lock once released: %v", err)
		}
	})
}

// TestDeclareRunsOnWithoutTheLeaseQueue: the lease queue serves `rebound
// topology prune`, not the retries. One the broker will not give (here
// declared by someone else with other arguments; in a cluster, a classic
// queue whose node is down) is a notice, and everything else is declared.
func TestDeclareRunsOnWithoutTheLeaseQueue(t *testing.T) {
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	topo := d.Topology(false)
	d.Declare(topo.InUseQueue(), amqp.Table{"x-max-length": int64(1)})
	notices, err := declarer.Declare(d.Conn, topo)
	if err != nil || len(notices) != 1 || !strings.Contains(notices[0], topo.InUseQueue()) {
		t.Fatalf("notices %q, %v; want one about %s", notices, err, topo.InUseQueue())
	}
	origins := declarer.NewOrigins(d.Conn, nil, nil, time.Now)
	for _, q := range topo.Queues() {
		if exists, _, err := origins.Exists(q.Name); err != nil || !exists {
			t.Errorf("queue %s: exists %v, %v", q.Name, exists, err)
		}
	}
}
