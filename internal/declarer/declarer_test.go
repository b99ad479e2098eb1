package declarer_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/delayqueue"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/republisher"
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

		rival := b.Dial(t, d.URL())
		release, err := delayqueue.Lock(context.Background(), d.Conn, topo, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := delayqueue.Lock(context.Background(), rival, topo, 0); err == nil || !strings.Contains(err.Error(), "holds the lock") {
			t.Fatalf("a second connection took the lock: %v, want it held by another", err)
		}
		if err := release(); err != nil {
			t.Fatal(err)
		}
		if _, err := delayqueue.Lock(context.Background(), rival, topo, 0); err != nil {
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

// TestOriginsExists: a queue seen to exist is trusted for a minute,
// then checked again; a missing one is checked every time.
func TestOriginsExists(t *testing.T) {
	t.Parallel()
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	var clock brokertest.Clock
	o := declarer.NewOrigins(b.Dial(t, b.URL), nil, nil, clock.Now)
	for queue, want := range map[string]bool{d.App: true, brokertest.Unique(t) + "missing": false} {
		got, checked, err := o.Exists(queue)
		if err != nil || got != want || !checked {
			t.Errorf("Exists(%s) = %v, %v, %v; want %v, checked", queue, got, checked, err, want)
		}
	}
	// Cached for a minute: the queue's deletion is not seen at once.
	if _, err := d.Ch.QueueDelete(d.App, false, false, false); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := o.Exists(d.App); !ok {
		t.Error("Exists rechecked within the minute")
	}
	clock.Advance(time.Hour)
	if ok, _, err := o.Exists(d.App); ok || err != nil {
		t.Errorf("Exists after the recheck = %v, %v; want false", ok, err)
	}
}

// TestOriginsWithoutPermission: RabbitMQ 4.2.6 and later refuse a passive
// declaration of a queue the user has no permission on (3.10 answers
// it). A refusal must not end the session: the origin counts as existing,
// unchecked, said once, until a copy sent straight to it comes back: the
// broker's own word, which Exists then goes by.
func TestOriginsWithoutPermission(t *testing.T) {
	t.Parallel()
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	topo := d.Topology(false)
	if _, err := declarer.Declare(d.Conn, topo); err != nil {
		t.Fatal(err)
	}
	// Publishing to the default exchange, as rebound's user does, and
	// nothing on the queues.
	_, url := b.User(t, b.URL, "pw", "^x$", `^amq\.default$`, "^x$")
	conn := b.Dial(t, url)
	p, err := republisher.New(conn, topo, 4, 30*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	var n brokertest.Notices
	o := declarer.NewOrigins(conn, p.ReturnedSince, n.Add, time.Now)
	refused := b.AtLeast(4, 2)
	for range 2 {
		if ok, checked, err := o.Exists(d.App); !ok || checked == refused || err != nil {
			t.Errorf("Exists on RabbitMQ %s = %v, checked %v, %v; want true, checked %v", b.Version(), ok, checked, err, !refused)
		}
	}
	if want := map[bool]int{true: 1, false: 0}[refused]; len(n.List()) != want {
		t.Errorf("notices %q, want %d", n.List(), want)
	}

	// Forged origin names, one per message: the refusals remembered stay
	// within the bound, and each still gets the answer it got before (a
	// refused check counts as existing until a copy comes back).
	o.SetUncheckedLimit(3)
	for i := range 5 {
		if ok, _, err := o.Exists(fmt.Sprintf("%sforged%d", brokertest.Unique(t), i)); ok != refused || err != nil {
			t.Errorf("Exists(forged %d) on RabbitMQ %s = %v, %v; want %v", i, b.Version(), ok, err, refused)
		}
	}
	if got, want := o.UncheckedLen(), map[bool]int{true: 3, false: 0}[refused]; got != want {
		t.Errorf("refusals remembered after 6 refused origins with a bound of 3: %d, want %d", got, want)
	}

	gone := brokertest.Unique(t) + "gone"
	outcome := make(chan republisher.Outcome, 1)
	if err := p.Publish(context.Background(), topology.Direct(gone), amqp.Publishing{MessageId: "straight"},
		func(o republisher.Outcome, _ time.Duration) { outcome <- o }); err != nil {
		t.Fatal(err)
	}
	if got := <-outcome; got != republisher.Returned {
		t.Fatalf("copy to a missing queue: %v, want Returned", got)
	}
	if ok, _, err := o.Exists(gone); ok || err != nil {
		t.Errorf("Exists(%s) after its copy came back = %v, %v; want false", gone, ok, err)
	}
}

// TestDeclareWithoutDefaultExchangeWrite: declaring a queue that
// dead-letters to the default exchange (a quorum inbox; the hold queue)
// needs write on amq.default. A user without it (hold mode's least
// privilege) is told what to declare or grant while the queue is
// missing, and uses the queue once an operator declared it.
func TestDeclareWithoutDefaultExchangeWrite(t *testing.T) {
	t.Parallel()
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	topo := d.Topology(true)
	own := "^" + regexp.QuoteMeta(d.Prefix) + ".*$"
	_, url := b.User(t, d.URL(), "pw", own, own, own)
	conn := b.Dial(t, url)
	_, err := declarer.Declare(conn, topo)
	if err == nil || !strings.Contains(err.Error(), topo.InboxQueue) || !strings.Contains(err.Error(), "amq.default") ||
		!strings.Contains(err.Error(), "have an operator declare it") {
		t.Fatalf("Declare without write on amq.default, the inbox missing: %v; want an error naming the inbox, amq.default and what to do", err)
	}
	if _, err := declarer.Declare(d.Conn, topo); err != nil { // the operator
		t.Fatal(err)
	}
	if notices, err := declarer.Declare(conn, topo); err != nil || len(notices) != 0 {
		t.Fatalf("Declare without write on amq.default, the operator having declared the inbox: notices %q, %v; want neither", notices, err)
	}
}
