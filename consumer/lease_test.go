package consumer

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/delayed"
)

// TestRunLeasesTheDelayQueuesItUses: a running replica leases the delay
// queue it uses, so `rebound topology prune` keeps it; once the replica
// has not used it for REBOUND_DELAY_QUEUE_IDLE its lease no longer names
// it: a classic one it deletes itself, a quorum one prune then deletes.
// Classic and quorum.
func TestRunLeasesTheDelayQueuesItUses(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, qt string) {
		e := newEnv(t, qt)
		opt := e.options("REBOUND_DELAY_QUEUE_IDLE", "5s")
		e.start(opt)
		cfg, err := config.Load(e.Environ())
		if err != nil {
			t.Fatal(err)
		}
		dp := delayed.Deployment{Conn: e.b.Dial(t, e.URL()), Router: opt.Router}
		dp.Router.Topology = dp.Router.Topology.ForServer(dp.Conn.Properties)
		grid := delayed.Delays(cfg.DelayDigits, time.Second)
		delayQueue, _ := e.topo.DelayQueue(50 * time.Millisecond)

		e.Publish(e.app, amqp.Publishing{MessageId: "m1"})
		e.reject(e.app)
		e.take(e.app) // back from the delay queue
		leased := func() (replicas int, named bool) {
			l, err := dp.ReadLeases(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return len(l.Replicas), l.Queues[delayQueue.Name]
		}
		e.eventually("the replica's lease names the delay queue", func() bool { _, ok := leased(); return ok })
		res, err := dp.Prune(context.Background(), grid, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Leases.Replicas) != 1 || res.InboxConsumers != 1 || len(res.Queues) != 1 || res.Queues[0].Deleted || res.Queues[0].Why != "a running replica uses it (its lease names it)" {
			t.Fatalf("prune while the replica uses the queue: %+v", res)
		}

		e.eventually("the lease no longer names it", func() bool { replicas, named := leased(); return !named && replicas > 0 })
		if qt == "classic" {
			e.eventually("the replica deleted it", func() bool {
				_, err := brokertest.QueueLen(e.URL(), delayQueue.Name)
				return err != nil
			})
			return
		}
		res, err = dp.Prune(context.Background(), grid, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Queues) != 1 || !res.Queues[0].Deleted {
			t.Fatalf("prune once the replica no longer uses the queue: %+v", res)
		}
		if _, err := brokertest.QueueLen(e.URL(), delayQueue.Name); err == nil {
			t.Errorf("%s still exists", delayQueue.Name)
		}
		// The replica declares it again on its next use.
		e.Publish(e.app, amqp.Publishing{MessageId: "m2"})
		e.reject(e.app)
		e.take(e.app)
	})
}

// TestRunWithPermissionsFromBeforeLeases: a rebound whose user has the
// permissions of a rebound before leases (no configure on the in-use queue
// or the lock) runs on: it says what it cannot do, retries, and leaves its
// idle delay queues in place (forgotten, not deleted): without the lock it
// cannot know that no one (the console, as another user) holds their
// last copies.
func TestRunWithPermissionsFromBeforeLeases(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic")
	names := regexp.QuoteMeta(e.prefix) + `(dlx|inbox|parked|delay\.[0-9]+)`
	_, url := e.b.User(t, e.URL(), "pw", "^"+names+"$", `^(amq\.default|`+names+`)$`, "^"+names+"$")
	e.start(e.options("REBOUND_AMQP_URL", url, "REBOUND_DELAY_QUEUE_IDLE", "100ms"))
	e.Publish(e.app, amqp.Publishing{MessageId: "m1"})
	e.reject(e.app)
	e.take(e.app)
	noticed := func(want string) bool {
		for _, l := range e.logged("topology") {
			if strings.Contains(fmt.Sprint(l.ContextMap()["notice"]), want) {
				return true
			}
		}
		return false
	}
	// The sweep tried the lock: its notice says so, and deleted nothing.
	e.eventually("the sweep says it may not take the lock", func() bool { return noticed("no permission to take the lock") })
	if !noticed("forgotten, not deleted") {
		t.Error("the lock's notice does not say idle delay queues are left in place")
	}
	delayQueue, _ := e.topo.DelayQueue(50 * time.Millisecond)
	if _, err := brokertest.QueueLen(e.URL(), delayQueue.Name); err != nil {
		t.Errorf("the idle delay queue was deleted without the lock: %v", err)
	}
	if !noticed("cannot declare " + e.topo.InUseQueue()) {
		t.Errorf("no topology notice saying it cannot declare %s", e.topo.InUseQueue())
	}
	// It declares the queue again on its next use, and retries.
	e.Publish(e.app, amqp.Publishing{MessageId: "m2"})
	e.reject(e.app)
	e.take(e.app)
}
