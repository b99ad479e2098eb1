package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// No-loss tests: N uniquely numbered messages are driven through the loop
// to the parking queue while a fault is injected; at the end every id must
// be parked. Duplicates are allowed and reported.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// buildBinary builds rebound once per test run, for tests that need a real
// process to kill or signal.
func buildBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "rebound-test-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "rebound")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// proc is a rebound process started by startBinary.
type proc struct {
	cmd    *exec.Cmd
	exited chan error
}

func (p *proc) signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// wait returns how the process ended, or false if it is still running
// after timeout.
func (p *proc) wait(timeout time.Duration) (error, bool) {
	select {
	case err := <-p.exited:
		return err, true
	case <-time.After(timeout):
		return nil, false
	}
}

// startBinary starts the rebound binary with the env's variables and waits
// until it is ready. Its log is shown if the test fails.
func (e *testEnv) startBinary(bin string) *proc {
	e.t.Helper()
	cmd := exec.Command(bin, "run")
	cmd.Env = append(os.Environ(), e.environ()...)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	p := &proc{cmd: cmd, exited: make(chan error, 1)}
	go func() { p.exited <- cmd.Wait() }()
	e.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if e.t.Failed() {
			e.t.Logf("rebound (pid %d) logs:\n%s", cmd.Process.Pid, logs.String())
		}
	})
	e.waitReady(p.exited)
	return p
}

// publishNumbered publishes messages with ids 0..n-1 to the application
// queue and waits for the broker's confirms.
func (e *testEnv) publishNumbered(n int) { e.publishNumberedFrom(0, n) }

// publishNumberedFrom publishes ids first..first+n-1.
func (e *testEnv) publishNumberedFrom(first, n int) {
	e.t.Helper()
	conn := dialBroker(e.t, e.vars["REBOUND_AMQP_URL"])
	ch, err := conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		e.t.Fatal(err)
	}
	body := make([]byte, 512)
	var confirms []*amqp.DeferredConfirmation
	for i := first; i < first+n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", e.app, false, false, amqp.Publishing{
			MessageId: strconv.Itoa(i), DeliveryMode: amqp.Persistent, Body: body,
			Headers: amqp.Table{"app": "orders", "seq": int64(i)},
		})
		if err != nil {
			e.t.Fatal(err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			e.t.Fatalf("test publish not confirmed: %v", err)
		}
	}
	conn.Close()
}

// account takes parked messages off the parking queue until want distinct
// ids are there (then a little longer, for duplicates) or timeout, and
// fails the test for every id that is missing. It uses its own
// connections, so it survives faults injected into the broker.
func (e *testEnv) account(n, operatorLost int, timeout time.Duration) (duplicates int) {
	e.t.Helper()
	seen := map[string]int{}
	total := 0
	want := n - operatorLost
	deadline := time.Now().Add(timeout)
	var settled time.Time
	for time.Now().Before(deadline) {
		got := e.takeParked(seen)
		total += got
		if len(seen) >= want {
			if settled.IsZero() {
				settled = time.Now()
			}
			if time.Since(settled) > time.Second {
				break
			}
		}
		if got == 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	duplicates = total - len(seen)
	// One line per scenario; scripts/chaos.sh turns these into a table.
	e.t.Logf("ACCOUNT scenario=%s N=%d parked=%d distinct=%d lost=%d duplicates=%d operator-lost=%d elapsed=%s",
		e.t.Name(), n, total, len(seen), max(0, want-len(seen)), duplicates, operatorLost, time.Since(e.started).Round(100*time.Millisecond))
	if len(seen) < want {
		var missing []int
		for i := range n {
			if seen[strconv.Itoa(i)] == 0 {
				missing = append(missing, i)
			}
		}
		e.t.Errorf("%d ids not parked (operator loss allowance %d), first %v; app queue holds %d, inbox %d",
			len(missing), operatorLost, missing[:min(len(missing), 20)], e.freshQueueLen(e.app), e.freshQueueLen(e.vars["REBOUND_INBOX_QUEUE"]))
	}
	return duplicates
}

func (e *testEnv) takeParked(seen map[string]int) int {
	conn, err := amqp.Dial(e.vars["REBOUND_AMQP_URL"])
	if err != nil {
		return 0
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0
	}
	got := 0
	for {
		d, ok, err := ch.Get(e.vars["REBOUND_PARKING_QUEUE"], true)
		if err != nil || !ok {
			return got
		}
		seen[d.MessageId]++
		got++
	}
}

func (e *testEnv) freshQueueLen(queue string) int {
	conn, err := amqp.Dial(e.vars["REBOUND_AMQP_URL"])
	if err != nil {
		return -1
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return -1
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return -1
	}
	return q.Messages
}

// rabbitmqctl runs the broker's control tool, skipping the test where the
// broker is not local (and failing where CI promises a local one).
func rabbitmqctl(t *testing.T, args ...string) {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("rabbitmqctl not found; CI runs against a local RabbitMQ")
		}
		t.Skip("rabbitmqctl not found: this test needs a local RabbitMQ")
	}
	if out, err := exec.Command("rabbitmqctl", args...).CombinedOutput(); err != nil {
		t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
	}
}

// privateVhost creates a virtual host for one test, so that faults it
// injects (closing every connection) do not touch tests running beside it.
func privateVhost(t *testing.T) string {
	t.Helper()
	vhost := "rebound-test-" + randomSuffix()
	rabbitmqctl(t, "-q", "add_vhost", vhost)
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "-q", "delete_vhost", vhost).Run() })
	rabbitmqctl(t, "-q", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
	u, err := amqp.ParseURI(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Vhost = vhost
	return u.String()
}

var fastLoop = map[string]string{"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "20ms", "REBOUND_MAX_RETRIES": "2"}

func with(base map[string]string, extra ...string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(extra); i += 2 {
		out[extra[i]] = extra[i+1]
	}
	return out
}

// queueTypes runs a scenario once with classic and once with quorum queues.
func queueTypes(t *testing.T, scenario func(t *testing.T, queueType string)) {
	for _, qt := range []string{"classic", "quorum"} {
		t.Run(qt, func(t *testing.T) {
			t.Parallel()
			scenario(t, qt)
		})
	}
}

func TestNoLossWhenKilled(t *testing.T) {
	t.Parallel()
	queueTypes(t, func(t *testing.T, queueType string) {
		bin := buildBinary(t)
		e := newTestEnv(t, with(fastLoop, "REBOUND_QUEUE_TYPE", queueType))
		e.rejectAll(e.app)
		proc := e.startBinary(bin)
		const n = 5000
		published := make(chan struct{})
		go func() { defer close(published); e.publishNumbered(n) }()
		for range 5 {
			time.Sleep(time.Duration(200+rand.IntN(600)) * time.Millisecond)
			if err := proc.signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			proc.wait(10 * time.Second)
			proc = e.startBinary(bin)
		}
		<-published
		e.account(n, 0, 3*time.Minute)
	})
}

func TestNoLossWhenServerClosesConnections(t *testing.T) {
	t.Parallel()
	queueTypes(t, func(t *testing.T, queueType string) {
		url := privateVhost(t)
		e := newTestEnv(t, with(fastLoop, "REBOUND_AMQP_URL", url, "REBOUND_QUEUE_TYPE", queueType))
		e.rejectAll(e.app)
		e.startInProcess()
		const n = 3000
		e.publishNumbered(n)
		for range 3 {
			time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
			rabbitmqctl(t, "-q", "close_all_connections", "-p", e.vhost(), "rebound no-loss test")
		}
		e.account(n, 0, 3*time.Minute)
		if got := e.metric("rebound_reconnects_total"); got == "" || got == "0" {
			t.Errorf("rebound_reconnects_total = %q, want at least 1", got)
		}
	})
}

func TestNoLossWhenOperatorDeletesDelayQueue(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, map[string]string{"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "10s", "REBOUND_MAX_RETRIES": "1"})
	e.rejectAll(e.app)
	e.startInProcess()
	const half = 300
	e.publishNumbered(half)
	// Delete once the whole first batch waits in the delay queue: a copy
	// routed to a queue as it is being deleted is confirmed by the broker
	// and dropped with the queue, an operator's loss queue.delete does not
	// count.
	delayQueue := e.prefix + "delay.10000"
	deadline := time.Now().Add(8 * time.Second)
	for e.freshQueueLen(delayQueue) < half && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	lost, err := e.ch.QueueDelete(delayQueue, false, false, false)
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
	bin := buildBinary(t)
	e := newTestEnv(t, with(fastLoop, "REBOUND_PREFETCH", "200", "REBOUND_MAX_RETRIES", "1"))
	e.rejectAll(e.app)
	// Fill the inbox before rebound starts so that its first moments run
	// with a full prefetch window.
	inbox := e.vars["REBOUND_INBOX_QUEUE"]
	if _, err := e.ch.QueueDeclare(inbox, true, false, false, false, amqp.Table{}); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	for i := range n {
		if err := e.ch.PublishWithContext(context.Background(), "", inbox, false, false, amqp.Publishing{
			MessageId: strconv.Itoa(i), DeliveryMode: amqp.Persistent, Headers: amqp.Table{"x-retry-origin-queue": e.app},
		}); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 3 {
		proc := e.startBinary(bin)
		time.Sleep(time.Duration(50+rand.IntN(150)) * time.Millisecond)
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
	e.startBinary(bin)
	e.account(n, 0, 3*time.Minute)
}

// TestNoLossUnderMemoryAlarm raises a memory alarm while messages flow.
// Not parallel: the alarm blocks publishing on the whole broker.
func TestNoLossUnderMemoryAlarm(t *testing.T) {
	// Delays long enough that copies come back from the delay queues while
	// the alarm is on: RabbitMQ blocks a connection when it publishes.
	e := newTestEnv(t, with(fastLoop, "REBOUND_MIN_DELAY", "3s"))
	e.rejectAll(e.app)
	e.startInProcess()
	const n = 2000
	e.publishNumbered(n)
	rabbitmqctl(t, "-q", "set_vm_memory_high_watermark", "0")
	restore := func() { _ = exec.Command("rabbitmqctl", "-q", "set_vm_memory_high_watermark", "0.4").Run() }
	t.Cleanup(restore)

	deadline := time.Now().Add(15 * time.Second)
	for e.metric("rebound_connection_blocked") != "1" && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := e.metric("rebound_connection_blocked"); got != "1" {
		t.Fatalf("rebound_connection_blocked = %q during the alarm, want 1", got)
	}
	if resp, err := http.Get("http://" + e.http + "/readyz"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz during the alarm: %v %v, want 503", resp, err)
	}
	if resp, err := http.Get("http://" + e.http + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz during the alarm: %v %v, want 200 (an alarm is not a wedge)", resp, err)
	}
	time.Sleep(2 * time.Second)
	restore()
	e.account(n, 0, 3*time.Minute)
	if got := e.metric("rebound_connection_blocked"); got != "0" {
		t.Errorf("rebound_connection_blocked = %q after the alarm, want 0", got)
	}
}

func TestInboxDeletedIsReestablishedWithoutSpinning(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, fastLoop)
	e.rejectAll(e.app)
	e.startInProcess()
	if _, err := e.ch.QueueDelete(e.vars["REBOUND_INBOX_QUEUE"], false, false, false); err != nil {
		t.Fatal(err)
	}
	// The broker cancels rebound's consumer; rebound must come back,
	// declare the inbox again and carry on, backing off between attempts.
	deadline := time.Now().Add(20 * time.Second)
	for e.freshQueueLen(e.vars["REBOUND_INBOX_QUEUE"]) < 0 && time.Now().Before(deadline) {
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

// TestNoLossWhenBrokerRestarts stops and starts the broker application
// while messages flow. It disturbs every test using the broker, so it only
// runs when asked: `make test` runs it on its own after the rest.
func TestNoLossWhenBrokerRestarts(t *testing.T) {
	if os.Getenv("REBOUND_TEST_BROKER_RESTART") == "" {
		t.Skip("restarts the broker; set REBOUND_TEST_BROKER_RESTART=1 (make test does, in a step of its own)")
	}
	// Classic queues dead-letter at most once inside the broker (no
	// internal confirms), so a restart can drop a message in the app queue
	// -> inbox or delay queue -> app queue hop whatever rebound does. With
	// quorum queues and at-least-once dead-lettering every hop is confirmed,
	// and a loss could only be rebound's.
	e := newTestEnv(t, with(fastLoop, "REBOUND_MIN_DELAY", "200ms", "REBOUND_QUEUE_TYPE", "quorum"))
	e.quorumApp()
	// Whatever happens below, leave the broker running for what comes next.
	t.Cleanup(func() {
		_ = exec.Command("rabbitmqctl", "-q", "start_app").Run()
		_ = exec.Command("rabbitmqctl", "-q", "await_startup").Run()
	})
	e.rejectAll(e.app)
	e.startInProcess()
	const n = 3000
	e.publishNumbered(n)
	for _, pause := range []time.Duration{time.Second, 5 * time.Second} {
		time.Sleep(300 * time.Millisecond)
		rabbitmqctl(t, "-q", "stop_app")
		time.Sleep(pause)
		rabbitmqctl(t, "-q", "start_app")
		rabbitmqctl(t, "-q", "await_startup")
	}
	e.account(n, 0, 3*time.Minute)
}
