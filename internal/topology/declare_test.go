package topology_test

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/topology"
)

// TestDeclareOnTheBroker: Declare makes every exchange, queue and binding
// the topology names, and declaring again changes nothing; a delay queue
// and its exchange are declared on first use; QueueExists tells a queue
// from a missing one; the other queue type over the same names is
// refused; the lock is one connection's at a time, and another's once
// released. Classic and quorum.
func TestDeclareOnTheBroker(t *testing.T) {
	b := brokertest.Require(t)
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		d := brokertest.NewDeployment(t, b, nil, nil)
		topo := d.Topology(queueType == "quorum")
		for i := range 2 {
			notices, err := topo.Declare(d.Conn)
			if err != nil || len(notices) != 0 {
				t.Fatalf("declaration %d: notices %q, %v", i+1, notices, err)
			}
		}
		delay := 10 * time.Minute // longer than the test: the message stays
		if err := topo.DeclareDelayQueue(d.Ch, delay); err != nil {
			t.Fatal(err)
		}
		delayQueue, _ := topo.DelayQueue(delay)
		for _, q := range append(topo.Queues(), delayQueue) {
			if exists, err := topology.QueueExists(d.Conn, q.Name); err != nil || !exists {
				t.Errorf("queue %s: exists %v, %v", q.Name, exists, err)
			}
		}
		if exists, err := topology.QueueExists(d.Conn, d.Prefix+"missing"); err != nil || exists {
			t.Errorf("a missing queue: exists %v, %v", exists, err)
		}
		// A message sent to the delay exchange reaches the delay queue.
		if err := d.Ch.Publish(topo.DelayExchangeFor(delay).Name, d.App, false, false, amqp.Publishing{MessageId: "m"}); err != nil {
			t.Fatal(err)
		}
		d.WaitQueueLen(delayQueue.Name, 1, 10*time.Second)

		other := topo
		other.Quorum = !topo.Quorum
		if _, err := other.Declare(b.Dial(t, d.URL())); err == nil {
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
		if err := topo.Lock(holder); err != nil {
			t.Fatal(err)
		}
		if err := topo.Lock(channel(rival)); !errors.Is(err, topology.ErrLocked) {
			t.Fatalf("a second connection took the lock: %v, want ErrLocked", err)
		}
		if err := topo.Unlock(holder); err != nil {
			t.Fatal(err)
		}
		if err := topo.Lock(channel(rival)); err != nil {
			t.Errorf("the lock once released: %v", err)
		}
	})
}

// TestAllowsAndLeases: the allowlist, when set, decides which queues
// rebound may send to; a lease reads back as it was published, with an
// expiry the broker applies.
func TestAllowsAndLeases(t *testing.T) {
	open := topology.Topology{}
	allowlisted := topology.Topology{OriginQueues: regexp.MustCompile(`^orders\.`)}
	for _, tc := range []struct {
		topo  topology.Topology
		queue string
		want  bool
	}{
		{open, "anything", true},
		{allowlisted, "orders.created", true},
		{allowlisted, "payments.capture", false},
	} {
		if got := tc.topo.Allows(tc.queue); got != tc.want {
			t.Errorf("Allows(%q) with %v = %v, want %v", tc.queue, tc.topo.OriginQueues, got, tc.want)
		}
	}

	lease := topology.Lease{Replica: "pod-a #0001", Queues: []string{"rebound.delay.1000", "rebound.delay.2000"}, Sequence: 3}
	msg := lease.Publishing(3 * time.Minute)
	if msg.Expiration != "180000" || msg.DeliveryMode != amqp.Persistent {
		t.Errorf("lease published with expiration %q, delivery mode %d", msg.Expiration, msg.DeliveryMode)
	}
	got, err := topology.ReadLease(msg.Body)
	if err != nil || got.Replica != lease.Replica || got.Sequence != lease.Sequence || !slices.Equal(got.Queues, lease.Queues) {
		t.Errorf("lease read back as %+v, %v; want %+v", got, err, lease)
	}
	if _, err := topology.ReadLease([]byte("not json")); err == nil {
		t.Error("a lease that is not JSON was read without an error")
	}
	if dest := topology.Direct("orders.created"); dest.RoutingKey != "orders.created" || dest.Exchange != "" {
		t.Errorf("Direct: %+v, want the default exchange with the queue as routing key", dest)
	}
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
	notices, err := topo.Declare(d.Conn)
	if err != nil || len(notices) != 1 || !strings.Contains(notices[0], topo.InUseQueue()) {
		t.Fatalf("notices %q, %v; want one about %s", notices, err, topo.InUseQueue())
	}
	for _, q := range topo.Queues() {
		if exists, err := topology.QueueExists(d.Conn, q.Name); err != nil || !exists {
			t.Errorf("queue %s: exists %v, %v", q.Name, exists, err)
		}
	}
}
