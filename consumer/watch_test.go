package consumer

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

func TestShareEvery(t *testing.T) {
	for _, tc := range []struct {
		consumers int
		want      time.Duration
	}{
		{0, inboxEvery}, {1, inboxEvery}, {5, inboxEvery}, {6, 2 * inboxEvery}, {10, 2 * inboxEvery}, {50, 10 * inboxEvery}, {51, 11 * inboxEvery},
	} {
		if got := shareEvery(tc.consumers); got != tc.want {
			t.Errorf("shareEvery(%d) = %s, want %s", tc.consumers, got, tc.want)
		}
	}
}

// replica is one more in-process sidecar of e's deployment, with a
// registry of its own.
func (e *env) replica() (*Sidecar, *prometheus.Registry, func() error) {
	e.t.Helper()
	opt := e.options()
	reg := prometheus.NewRegistry()
	opt.Metrics = NewMetrics(reg, opt.Router)
	s, stop := e.start(opt)
	return s, reg, stop
}

// leaders returns which of the registries report holding the watch token.
func leaders(t *testing.T, regs ...*prometheus.Registry) []int {
	var out []int
	for i, reg := range regs {
		if metricValue(t, reg, "rebound_watch_leader") == 1 {
			out = append(out, i)
		}
	}
	return out
}

// TestOneReplicaWatches: of two replicas of a vhost, one holds the watch
// token and reports the broker's counts, the other has no such series and
// checks no queue but the inbox (for its consumer count); when the first
// stops, the second takes over.
func TestOneReplicaWatches(t *testing.T) {
	e := newEnv(t, "classic")
	_, reg0, stop0 := e.replica()
	_, reg1, stop1 := e.replica()
	regs, stops := []*prometheus.Registry{reg0, reg1}, []func() error{stop0, stop1}
	var got []int
	e.eventually("one replica holds the watch token", func() bool { got = leaders(t, regs...); return len(got) == 1 })
	leader, follower := regs[got[0]], regs[1-got[0]]
	e.eventually("the leader reports the parking queue", func() bool {
		return hasSeries(t, leader, "rebound_parked_messages", "queue", e.topo.ParkingQueue)
	})
	if hasSeries(t, follower, "rebound_parked_messages", "queue", e.topo.ParkingQueue) {
		t.Error("the follower reports the parking queue too")
	}
	// Messages go through while the token is held: the watch's delivery
	// is no inbox delivery to the session (no session restarts).
	msgs := make([]amqp.Publishing, 20)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: fmt.Sprint(i), Headers: amqp.Table{"x-retry-origin-queue": e.app}}
	}
	e.Publish(e.topo.InboxQueue, msgs...)
	e.WaitQueueLen(e.app, len(msgs), 30*time.Second)
	for i, reg := range regs {
		if n := metricValue(t, reg, "rebound_reconnects_total"); n != 0 {
			t.Errorf("replica %d reconnected %g times", i, n)
		}
	}
	for _, kind := range []string{callParked, callDelayQueue} {
		if n := metricValue(t, follower, "rebound_broker_calls_total", "kind", kind); n != 0 {
			t.Errorf("the follower made %g %s checks", n, kind)
		}
	}
	if err := stops[got[0]](); err != nil {
		t.Fatal(err)
	}
	e.eventually("the other replica takes the token", func() bool { return len(leaders(t, follower)) == 1 })
	e.eventually("and reports the parking queue", func() bool {
		return hasSeries(t, follower, "rebound_parked_messages", "queue", e.topo.ParkingQueue)
	})
}

func hasSeries(t *testing.T, reg *prometheus.Registry, name, label, value string) bool {
	return len(matching(t, reg, name, label, value)) > 0
}

// TestAGoneDelayQueueIsNoLongerReported: a delay queue deleted under the
// replica that uses it (by `rebound topology prune`, or by hand) drops out
// of rebound_delay_queue_messages at the next reading, rather than
// reporting its last count for as long as the replica runs.
func TestAGoneDelayQueueIsNoLongerReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic")
	const every = 200 * time.Millisecond
	opt := e.options()
	opt.QueuesEvery = every
	reg := prometheus.NewRegistry()
	opt.Metrics = NewMetrics(reg, opt.Router)
	e.start(opt)
	e.Publish(e.app, amqp.Publishing{MessageId: "m1"})
	e.reject(e.app)
	e.take(e.app) // back from the delay queue
	delayQueue, _ := e.topo.DelayQueue(50 * time.Millisecond)
	reported := func() bool { return hasSeries(t, reg, "rebound_delay_queue_messages", "queue", delayQueue.Name) }
	// The leader reads the delay queues every QueuesEvery.
	if !brokertest.Await(30*time.Second, reported) {
		t.Fatalf("%s is not reported", delayQueue.Name)
	}
	ch, err := e.b.Dial(t, e.URL()).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(delayQueue.Name, false, false, false); err != nil {
		t.Fatal(err)
	}
	if !brokertest.Await(30*time.Second, func() bool { return !reported() }) {
		t.Errorf("%s is still reported 30s after it was deleted, with a reading every %s", delayQueue.Name, every)
	}
}
