package e2e

import (
	"context"
	"maps"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// No-loss scenarios: a fault is injected while N numbered messages go
// through the loop, and accounting_test.go checks that every one is
// parked. The faults here touch one test's deployment only, so they run
// in parallel with the rest; chaos_test.go has the ones that disturb the
// whole broker.

func TestNoLossWhenKilled(t *testing.T) {
	t.Parallel()
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) { killRepeatedly(t, queueType, 1, 2500, 0, nil) })
}

// TestNoLossWhenReplicaKilled is TestNoLossWhenKilled with three replicas
// competing for one inbox: each kill hits one of them at random, and the
// others go on meanwhile.
func TestNoLossWhenReplicaKilled(t *testing.T) {
	t.Parallel()
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) { killRepeatedly(t, queueType, 3, 2500, 0, nil) })
}

// TestNoLossWhenKilledWithLargeMessages is TestNoLossWhenKilled with
// messages of 512 KiB and a budget of 4 MiB: rebound is killed while its
// window holds large messages, on a classic and a quorum inbox (where each
// kill counts towards a delivery limit).
func TestNoLossWhenKilledWithLargeMessages(t *testing.T) {
	t.Parallel()
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		killRepeatedly(t, queueType, 1, 100, 512<<10, map[string]string{"REBOUND_INFLIGHT_BYTES": "4MiB"})
	})
}

// killRepeatedly runs replicas rebound processes on one inbox while n
// messages of body bytes (0 for the default) go through the loop, and kills
// one of them with SIGKILL five times, starting it again each time. vars
// are laid over the fast loop's. The first kill comes within a second of
// the first publish, while the n messages still flow; each later one
// meets the canaries fed until the restarted process moves one, so n
// needs only to outlast the first (2500 where 5000 were: half the broker
// work in a suite that shares two cores).
func killRepeatedly(t *testing.T, queueType string, replicas, n, body int, vars map[string]string) {
	settings := with(fastLoop, "REBOUND_QUEUE_TYPE", queueType)
	maps.Copy(settings, vars)
	e := newTestEnv(t, settings)
	e.body = body
	e.rejectAll(e.App)
	envs := []*testEnv{e}
	for len(envs) < replicas {
		envs = append(envs, e.replica())
	}
	procs := make([]*proc, replicas)
	for i, r := range envs {
		procs[i] = r.startBinary()
	}
	var canaries atomic.Int64 // confirmed, ids n, n+1, ...; one feeder at a time publishes them
	canary := func() error {
		if err := e.publishCanary(n + int(canaries.Load())); err != nil {
			return err
		}
		canaries.Add(1)
		return nil
	}
	published := make(chan error, 1)
	go func() { published <- e.tryPublishNumbered(0, n) }()
	const kills = 5
	var faults []recovery
	for range kills {
		time.Sleep(time.Duration(200+rand.IntN(600)) * time.Millisecond)
		i := rand.IntN(replicas)
		killed := time.Now()
		if err := procs[i].signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		procs[i].wait(10 * time.Second)
		// The fault ends when the process is started again; a fresh
		// process has moved nothing yet. Canaries keep coming until it
		// has moved one: the scenario's messages may all be parked by
		// then, and other replicas may take the first canaries.
		procs[i] = envs[i].launch()
		moving := feedUntil(envs[i].watchRecovery(progress{}, false, time.Minute), canary, t.Logf)
		faults = append(faults, envs[i].recovered("rebound-SIGKILL", killed, procs[i].started, moving))
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	e.accountRecovered(n+int(canaries.Load()), 0, faults, 3*time.Minute)
	for i, r := range envs {
		if got := r.metric("rebound_messages_received_total"); got == "" || got == "0" {
			t.Errorf("replica %d received %q messages since it last started, want some: the replicas do not share the inbox", i, got)
		}
	}
}

func TestNoLossWhenServerClosesConnections(t *testing.T) {
	t.Parallel()
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		url := brokertest.Require(t).PrivateVhost(t)
		e := newTestEnv(t, with(fastLoop, "REBOUND_AMQP_URL", url, "REBOUND_QUEUE_TYPE", queueType))
		e.rejectAll(e.App)
		e.startInProcess()
		const n = 3000
		e.publishNumbered(n)
		const closes = 3
		var faults []recovery
		for k := range closes {
			time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
			// The fault is over as soon as it happens: the moment the
			// server closes a probe connection in the same vhost. The
			// canary goes out then, not once rabbitmqctl has exited.
			closed := e.Broker.Dial(t, url).NotifyClose(make(chan *amqp.Error, 1))
			ended, canary := make(chan time.Time, 1), make(chan error, 1)
			go func() {
				<-closed
				ended <- time.Now()
				canary <- e.publishCanary(n + k)
			}()
			base, _ := e.progress()
			moving := e.watchRecovery(base, true, time.Minute)
			e.Broker.MustCtl(t, "-q", "close_all_connections", "-p", e.vhost(), "rebound no-loss test")
			at := <-ended
			if err := <-canary; err != nil {
				t.Fatal(err)
			}
			faults = append(faults, e.recovered("close_all_connections", at, at, moving))
		}
		e.accountRecovered(n+closes, 0, faults, 3*time.Minute)
		if got := e.metric("rebound_reconnects_total"); got == "" || got == "0" {
			t.Errorf("rebound_reconnects_total = %q, want at least 1", got)
		}
	})
}

func TestNoLossWhenOperatorDeletesDelayQueue(t *testing.T) {
	t.Parallel()
	brokertest.EachQueueType(t, operatorDeletesDelayQueue)
}

func operatorDeletesDelayQueue(t *testing.T, queueType string) {
	// A delay long enough that the first batch is still waiting in the
	// delay queue when the test deletes it, on a loaded machine too.
	e := newTestEnv(t, map[string]string{"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "20s", "REBOUND_MAX_RETRIES": "1",
		"REBOUND_QUEUE_TYPE": queueType})
	e.rejectAll(e.App)
	e.startInProcess()
	const half = 300
	e.publishNumbered(half)
	// Delete once the whole first batch waits in the delay queue: a copy
	// routed to a queue as it is being deleted is confirmed by the broker
	// and dropped with the queue, an operator's loss queue.delete does not
	// count.
	delayQueue := e.Prefix + "delay.20000"
	deadline := time.Now().Add(15 * time.Second)
	for e.QueueLenOr(delayQueue, -1) < half {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d copies in the delay queue after 15s (-1: no queue), want all before deleting it",
				e.QueueLenOr(delayQueue, -1), half)
		}
		time.Sleep(20 * time.Millisecond)
	}
	lost, err := e.Ch.QueueDelete(delayQueue, false, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if lost != half {
		t.Fatalf("deleted the delay queue with %d messages, want all %d", lost, half)
	}
	// Copies published after the deletion are returned (no binding left);
	// rebound must requeue them, declare the queue again and carry on.
	e.publishNumberedFrom(half, half)
	e.account(2*half, lost, 2*time.Minute)
	if got := e.metric(`rebound_publish_failures_total{kind="return"}`); got == "" || got == "0" {
		t.Errorf("returns metric = %q, want at least 1", got)
	}
}

func TestNoLossOnSIGTERMWithFullWindow(t *testing.T) {
	t.Parallel()
	brokertest.EachQueueType(t, sigtermWithFullWindow)
}

func sigtermWithFullWindow(t *testing.T, queueType string) {
	e := newTestEnv(t, with(fastLoop, "REBOUND_PREFETCH", "200", "REBOUND_MAX_RETRIES", "1", "REBOUND_QUEUE_TYPE", queueType))
	e.rejectAll(e.App)
	// Fill the inbox before rebound starts so that its first moments run
	// with a full prefetch window. It is declared as rebound declares it.
	inbox, args := e.Vars["REBOUND_INBOX_QUEUE"], amqp.Table{}
	if queueType == "quorum" {
		args[amqp.QueueTypeArg] = amqp.QueueTypeQuorum
	}
	if _, err := e.Ch.QueueDeclare(inbox, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	for i := range n {
		if err := e.Ch.PublishWithContext(context.Background(), "", inbox, false, false, amqp.Publishing{
			MessageId: strconv.Itoa(i), DeliveryMode: amqp.Persistent, Headers: amqp.Table{"x-retry-origin-queue": e.App},
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Each start after a SIGTERM ends a fault: rebound was down from the
	// signal until then.
	var faults []recovery
	var stopped time.Time
	restart := func() *proc {
		if err := e.publishCanary(n + len(faults)); err != nil {
			t.Fatal(err)
		}
		proc := e.launch()
		faults = append(faults, e.recovered("rebound-SIGTERM", stopped, proc.started, e.watchRecovery(progress{}, false, time.Minute)))
		return proc
	}
	for round := range 3 {
		var proc *proc
		if round == 0 {
			proc = e.startBinary()
		} else {
			proc = restart()
		}
		time.Sleep(time.Duration(50+rand.IntN(150)) * time.Millisecond)
		stopped = time.Now()
		if err := proc.signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		err, exited := proc.wait(15 * time.Second)
		if !exited {
			t.Fatalf("round %d: rebound did not exit within 15s of SIGTERM (grace 5s)", round)
		}
		if err != nil {
			t.Fatalf("round %d: rebound exited with %v after SIGTERM, want status 0", round, err)
		}
	}
	restart()
	e.accountRecovered(n+len(faults), 0, faults, 3*time.Minute)
}

func TestInboxDeletedIsReestablishedWithoutSpinning(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, fastLoop)
	e.rejectAll(e.App)
	e.startInProcess()
	if _, err := e.Ch.QueueDelete(e.Vars["REBOUND_INBOX_QUEUE"], false, false, false); err != nil {
		t.Fatal(err)
	}
	// The broker cancels rebound's consumer; rebound must come back,
	// declare the inbox again and carry on, backing off between attempts.
	deadline := time.Now().Add(20 * time.Second)
	for !e.queueExists(e.Vars["REBOUND_INBOX_QUEUE"]) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	reconnects, _ := strconv.Atoi(e.metric("rebound_reconnects_total"))
	if reconnects < 1 || reconnects > 3 {
		t.Errorf("rebound_reconnects_total = %d two seconds after the inbox came back, want 1 to 3 (no spinning)", reconnects)
	}
	const n = 200
	e.publishNumbered(n)
	e.account(n, 0, time.Minute)
}
