package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
)

// No-loss tests: N uniquely numbered messages are driven through the loop
// to the parking queue while a fault is injected; at the end every id must
// be parked. Duplicates are allowed and reported, and so is, for every
// fault that ends, how long rebound took to move messages again.

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

// proc is a rebound process started by launch or startBinary.
type proc struct {
	cmd     *exec.Cmd
	exited  chan error
	logs    *syncBuffer
	started time.Time // just before the process was started
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

// replica returns another rebound deployment on e's queues, with an HTTP
// address of its own: a second replica on the same inbox.
func (e *testEnv) replica() *testEnv {
	r := *e
	r.http = freeAddr(e.t)
	r.vars = maps.Clone(e.vars)
	r.vars["REBOUND_HTTP_ADDR"] = r.http
	return &r
}

// launch starts the rebound binary with the env's variables and returns at
// once. Its log is shown if the test fails.
func (e *testEnv) launch(bin string) *proc {
	e.t.Helper()
	cmd := exec.Command(bin, "run")
	cmd.Env = append(os.Environ(), e.environ()...)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	p := &proc{cmd: cmd, exited: make(chan error, 1), logs: logs, started: time.Now()}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { p.exited <- cmd.Wait() }()
	e.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if e.t.Failed() {
			e.t.Logf("rebound (pid %d) logs:\n%s", cmd.Process.Pid, logs.String())
		}
	})
	return p
}

// startBinary launches the rebound binary and waits until it is ready.
func (e *testEnv) startBinary(bin string) *proc {
	e.t.Helper()
	p := e.launch(bin)
	e.waitReady(p.exited)
	return p
}

// publishNumbered publishes messages with ids 0..n-1 to the application
// queue and waits for the broker's confirms.
func (e *testEnv) publishNumbered(n int) { e.publishNumberedFrom(0, n) }

// publishNumberedFrom publishes ids first..first+n-1.
func (e *testEnv) publishNumberedFrom(first, n int) {
	e.t.Helper()
	if err := e.tryPublishNumbered(first, n); err != nil {
		e.t.Fatal(err)
	}
}

// tryPublishNumbered is publishNumberedFrom returning its error instead of
// failing the test, so that a goroutine may call it.
func (e *testEnv) tryPublishNumbered(first, n int) error {
	conn, err := amqp.Dial(e.vars["REBOUND_AMQP_URL"])
	if err != nil {
		return fmt.Errorf("connect to publish: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel to publish: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("enable confirms to publish: %w", err)
	}
	body := make([]byte, 512)
	var confirms []*amqp.DeferredConfirmation
	for i := first; i < first+n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", e.app, false, false, amqp.Publishing{
			MessageId: strconv.Itoa(i), DeliveryMode: amqp.Persistent, Body: body,
			Headers: amqp.Table{"app": "orders", "seq": int64(i)},
		})
		if err != nil {
			return fmt.Errorf("publish %d: %w", i, err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			return fmt.Errorf("test publish not confirmed: %v", err)
		}
	}
	return nil
}

// publishCanary puts message id straight into rebound's inbox, as if
// dead-lettered from the application queue. Published as a fault ends, it
// makes sure rebound has something to move then, even when the scenario's
// own messages are all parked already; it is counted like them. It returns
// an error rather than failing the test, so that a goroutine may call it.
func (e *testEnv) publishCanary(id int) error {
	conn, err := amqp.Dial(e.vars["REBOUND_AMQP_URL"])
	if err != nil {
		return fmt.Errorf("canary %d: %w", id, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("canary %d: %w", id, err)
	}
	inbox := e.vars["REBOUND_INBOX_QUEUE"]
	if _, err := ch.QueueDeclarePassive(inbox, true, false, false, false, nil); err != nil {
		return fmt.Errorf("canary %d: %w", id, err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("canary %d: %w", id, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", inbox, false, false, amqp.Publishing{
		MessageId: strconv.Itoa(id), DeliveryMode: amqp.Persistent, Headers: amqp.Table{"x-retry-origin-queue": e.app},
	})
	if err != nil {
		return fmt.Errorf("canary %d: %w", id, err)
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		return fmt.Errorf("canary %d not confirmed: %v", id, err)
	}
	return nil
}

// account takes parked messages off the parking queue until want distinct
// ids are there (then a little longer, for duplicates) or timeout, and
// fails the test for every id that is missing. It uses its own
// connections, so it survives faults injected into the broker.
func (e *testEnv) account(n, operatorLost int, timeout time.Duration) (duplicates int) {
	e.t.Helper()
	return e.accountRecovered(n, operatorLost, nil, timeout)
}

// accountRecovered is account for a scenario whose faults end: it also
// reports the worst of their times to recover.
func (e *testEnv) accountRecovered(n, operatorLost int, faults []recovery, timeout time.Duration) (duplicates int) {
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
	if bound, ok := e.duplicateBound(faults); ok && duplicates > bound {
		e.t.Errorf("%d duplicates after %d faults, more than the in-flight window per fault allows (%d)", duplicates, len(faults), bound)
	}
	worst := "-" // no fault with an end
	if len(faults) > 0 {
		worst = seconds(slices.MaxFunc(faults, func(a, b recovery) int { return cmp.Compare(a.recover, b.recover) }).recover)
	}
	// One line per scenario; scripts/chaos.sh turns these into a table.
	e.t.Logf("ACCOUNT scenario=%s N=%d parked=%d distinct=%d lost=%d duplicates=%d operator-lost=%d elapsed=%s recover=%s faults=%d",
		e.t.Name(), n, total, len(seen), max(0, want-len(seen)), duplicates, operatorLost, time.Since(e.started).Round(100*time.Millisecond),
		worst, len(faults))
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

// duplicateBound is the most duplicates faults may cause: one in-flight
// window (REBOUND_PREFETCH) each. A fault that ends a rebound process or its
// connections does so at worst while a whole window of deliveries is unacked
// and every copy of them confirmed; each such delivery then comes back once
// and makes one extra copy, wherever in the loop it was. A fault that ends
// neither (a memory alarm) hands nothing back and makes none. There is no
// bound (ok is false) without faults recorded, nor with a broker restart:
// the broker's own at-least-once dead-lettering may hand on again what it
// held, which no window of rebound's limits.
func (e *testEnv) duplicateBound(faults []recovery) (bound int, ok bool) {
	if len(faults) == 0 {
		return 0, false
	}
	cfg, err := config.Load(e.environ())
	if err != nil {
		e.t.Fatalf("the test's configuration: %v", err)
	}
	for _, f := range faults {
		if strings.HasPrefix(f.fault, "broker-") {
			return 0, false
		}
	}
	return len(faults) * cfg.Prefetch, true
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

// recovery is one fault that ends, as a test measured it.
type recovery struct {
	fault   string        // what was done, one word: broker-SIGKILL, rebound-SIGTERM, ...
	outage  time.Duration // from the fault's start to its end
	recover time.Duration // from the fault's end to rebound moving messages again
}

// progress is what rebound shows of itself over HTTP.
type progress struct {
	ready      bool    // /readyz answered 200
	moved      float64 // copies the broker confirmed: every rebound_messages_retried_total and rebound_messages_parked_total series
	reconnects float64 // rebound_reconnects_total
}

var probeClient = &http.Client{Timeout: time.Second}

// progress reads rebound's /readyz and /metrics; ok is false when rebound
// does not answer. It never fails the test, so a goroutine may call it.
func (e *testEnv) progress() (p progress, ok bool) {
	resp, err := probeClient.Get("http://" + e.http + "/readyz")
	if err != nil {
		return p, false
	}
	resp.Body.Close()
	p.ready = resp.StatusCode == http.StatusOK
	resp, err = probeClient.Get("http://" + e.http + "/metrics")
	if err != nil {
		return p, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return p, false
	}
	for _, line := range strings.Split(string(body), "\n") {
		series, value, _ := strings.Cut(line, " ")
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(series, "rebound_messages_retried_total{"), strings.HasPrefix(series, "rebound_messages_parked_total{"):
			p.moved += v
		case series == "rebound_reconnects_total":
			p.reconnects = v
		}
	}
	return p, true
}

// watchRecovery polls rebound every 20 ms, from now on, until it moves
// messages again: /readyz answers 200 and the broker has confirmed a copy
// (a retry or a parked message) not counted in base. With newSession (the
// fault drops rebound's connections) only a session begun after base
// counts. The channel gets the moment that was first seen, or the zero
// time after timeout. Start it before the fault, so that a recovery
// faster than the test's own view of the fault's end is seen too.
func (e *testEnv) watchRecovery(base progress, newSession bool, timeout time.Duration) <-chan time.Time {
	seen := make(chan time.Time, 1)
	go func() {
		moved := base.moved
		for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			at := time.Now()
			p, ok := e.progress()
			switch {
			case !ok:
			case newSession && p.reconnects <= base.reconnects:
				moved = p.moved // the session the fault is to end still runs
			case p.ready && p.moved > moved:
				seen <- at
				return
			}
		}
		seen <- time.Time{}
	}()
	return seen
}

// recovered records a fault that started at start and ended at end, once
// moving (from watchRecovery) says when rebound moved messages again.
func (e *testEnv) recovered(fault string, start, end time.Time, moving <-chan time.Time) recovery {
	e.t.Helper()
	at := <-moving
	if at.IsZero() {
		e.t.Fatalf("%s: rebound did not move messages again after the fault ended", fault)
	}
	r := recovery{fault: fault, outage: end.Sub(start), recover: max(0, at.Sub(end))}
	// scripts/chaos.sh lists these lines under the table.
	e.t.Logf("RECOVER scenario=%s fault=%s outage=%s recover=%s", e.t.Name(), fault, seconds(r.outage), seconds(r.recover))
	return r
}

// seconds formats d for the reliability tables: 0.31s, 12.40s.
func seconds(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

// closedAt tells when the server closed conn.
func closedAt(conn *amqp.Connection) <-chan time.Time {
	at := make(chan time.Time, 1)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		<-closed
		at <- time.Now()
	}()
	return at
}

// rabbitmqctl runs the broker's control tool and returns what it printed,
// skipping the test where the broker is not local (and failing where CI
// promises a local one).
func rabbitmqctl(t *testing.T, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("rabbitmqctl not found; CI runs against a local RabbitMQ")
		}
		t.Skip("rabbitmqctl not found: this test needs a local RabbitMQ")
	}
	var stderr bytes.Buffer
	cmd := exec.Command("rabbitmqctl", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("rabbitmqctl %v: %v\n%s%s", args, err, out, stderr.Bytes())
	}
	return string(out)
}

// brokerDownMarker exists while a test has the shared local broker down
// on purpose, so that benchmarks and suites run beside it by hand can wait.
const brokerDownMarker = "/tmp/rebound-broker-down"

// brokerGoesDown is called just before a test stops or kills the local
// broker. It creates brokerDownMarker and, whatever happens next, has the
// broker running again (and the marker gone) at cleanup.
func brokerGoesDown(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(brokerDownMarker, []byte(t.Name()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restoreBroker(t) })
}

// brokerBack removes brokerDownMarker once the broker answers again.
func brokerBack(t *testing.T) {
	t.Helper()
	if err := os.Remove(brokerDownMarker); err != nil && !os.IsNotExist(err) {
		t.Error(err)
	}
}

// restoreBroker starts the local broker again from wherever a test left it:
// the application stopped (start_app) or the node gone (rabbitmq-server).
func restoreBroker(t *testing.T) {
	t.Helper()
	if !brokerAnswers() && exec.Command("rabbitmqctl", "-q", "start_app").Run() != nil {
		if err := startBrokerNode(); err != nil {
			t.Error(err)
		}
	}
	if at := <-brokerAccepts(3 * time.Minute); at.IsZero() {
		t.Errorf("the local broker did not come back within 3 minutes; %s left in place", brokerDownMarker)
		return
	}
	_ = exec.Command("rabbitmqctl", "-q", "await_startup").Run()
	brokerBack(t)
}

// brokerAnswers reports whether an AMQP connection to the broker opens now.
func brokerAnswers() bool {
	conn, err := amqp.DialConfig(brokerURL(), amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// brokerAccepts polls the broker every 20 ms, from now on, with a fresh
// AMQP connection. The channel gets the moment one first opened, or the
// zero time after timeout.
func brokerAccepts(timeout time.Duration) <-chan time.Time {
	up := make(chan time.Time, 1)
	go func() {
		for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if brokerAnswers() {
				up <- time.Now()
				return
			}
		}
		up <- time.Time{}
	}()
	return up
}

// killBroker kills the local broker node's Erlang VM with SIGKILL, as a
// crash or the OOM killer would, and waits until it is gone. The pid comes
// from the node itself (the one rabbitmqctl manages), so other RabbitMQ
// nodes on this host, a cluster test's, are left alone.
func killBroker(t *testing.T) {
	t.Helper()
	out := strings.Trim(strings.TrimSpace(rabbitmqctl(t, "-q", "eval", "os:getpid().")), `"`)
	pid, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("broker node's pid: %q: %v", out, err)
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || !bytes.Contains(cmdline, []byte("beam")) {
		t.Fatalf("pid %d, from the broker node, is not an Erlang VM (%q, %v)", pid, cmdline, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d (the broker node): %v", pid, err)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		// Gone, or a zombie nobody reaps: either way it holds no socket.
		if i := bytes.LastIndexByte(stat, ')'); err != nil || (i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z') {
			return
		}
	}
	t.Fatalf("the broker node (pid %d) still runs 30s after SIGKILL", pid)
}

// startBrokerNode starts the local broker node as scripts/ensure-rabbitmq.sh
// does. The node detaches; its output goes to a file rather than a pipe,
// so that nothing here waits for the node to exit.
func startBrokerNode() error {
	out, err := os.CreateTemp("", "rebound-rabbitmq-server-*.log")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.Command("rabbitmq-server", "-detached")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		text, _ := os.ReadFile(out.Name())
		return fmt.Errorf("rabbitmq-server -detached: %w\n%s", err, text)
	}
	return nil
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

// queueTypes runs a scenario once with classic and once with quorum
// queues, in parallel.
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
	queueTypes(t, func(t *testing.T, queueType string) { killRepeatedly(t, queueType, 1) })
}

// TestNoLossWhenReplicaKilled is TestNoLossWhenKilled with three replicas
// competing for one inbox: each kill hits one of them at random, and the
// others go on meanwhile.
func TestNoLossWhenReplicaKilled(t *testing.T) {
	t.Parallel()
	queueTypes(t, func(t *testing.T, queueType string) { killRepeatedly(t, queueType, 3) })
}

// killRepeatedly runs replicas rebound processes on one inbox while 5 000
// messages go through the loop, and kills one of them with SIGKILL five
// times, starting it again each time.
func killRepeatedly(t *testing.T, queueType string, replicas int) {
	bin := buildBinary(t)
	e := newTestEnv(t, with(fastLoop, "REBOUND_QUEUE_TYPE", queueType))
	e.rejectAll(e.app)
	envs := []*testEnv{e}
	for len(envs) < replicas {
		envs = append(envs, e.replica())
	}
	procs := make([]*proc, replicas)
	for i, r := range envs {
		procs[i] = r.startBinary(bin)
	}
	const n = 5000
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
		procs[i] = envs[i].launch(bin)
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

// feedUntil publishes a canary at once and then every 200 ms until moving
// reports, and passes the report on. No canary is published after that.
// A canary that fails is logged, not counted, and the next one is tried:
// if none gets through, moving reports that rebound did not move again.
func feedUntil(moving <-chan time.Time, canary func() error, logf func(format string, args ...any)) <-chan time.Time {
	out := make(chan time.Time, 1)
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			if err := canary(); err != nil {
				logf("%v", err)
			}
			select {
			case at := <-moving:
				out <- at
				return
			case <-tick.C:
			}
		}
	}()
	return out
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
		const closes = 3
		var faults []recovery
		for k := range closes {
			time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
			// The fault is over as soon as it happens: the moment the
			// server closes a probe connection in the same vhost. The
			// canary goes out then, not once rabbitmqctl has exited.
			closed := dialBroker(t, url).NotifyClose(make(chan *amqp.Error, 1))
			ended, canary := make(chan time.Time, 1), make(chan error, 1)
			go func() {
				<-closed
				ended <- time.Now()
				canary <- e.publishCanary(n + k)
			}()
			base, _ := e.progress()
			moving := e.watchRecovery(base, true, time.Minute)
			rabbitmqctl(t, "-q", "close_all_connections", "-p", e.vhost(), "rebound no-loss test")
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
	queueTypes(t, operatorDeletesDelayQueue)
}

func operatorDeletesDelayQueue(t *testing.T, queueType string) {
	// A delay long enough that the first batch is still waiting in the
	// delay queue when the test deletes it, on a loaded machine too.
	e := newTestEnv(t, map[string]string{"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "20s", "REBOUND_MAX_RETRIES": "1",
		"REBOUND_QUEUE_TYPE": queueType})
	e.rejectAll(e.app)
	e.startInProcess()
	const half = 300
	e.publishNumbered(half)
	// Delete once the whole first batch waits in the delay queue: a copy
	// routed to a queue as it is being deleted is confirmed by the broker
	// and dropped with the queue, an operator's loss queue.delete does not
	// count.
	delayQueue := e.prefix + "delay.20000"
	deadline := time.Now().Add(15 * time.Second)
	for e.freshQueueLen(delayQueue) < half {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d copies in the delay queue after 15s (-1: no queue), want all before deleting it",
				e.freshQueueLen(delayQueue), half)
		}
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
	queueTypes(t, sigtermWithFullWindow)
}

func sigtermWithFullWindow(t *testing.T, queueType string) {
	bin := buildBinary(t)
	e := newTestEnv(t, with(fastLoop, "REBOUND_PREFETCH", "200", "REBOUND_MAX_RETRIES", "1", "REBOUND_QUEUE_TYPE", queueType))
	e.rejectAll(e.app)
	// Fill the inbox before rebound starts so that its first moments run
	// with a full prefetch window. It is declared as rebound declares it.
	inbox, args := e.vars["REBOUND_INBOX_QUEUE"], amqp.Table{}
	if queueType == "quorum" {
		args[amqp.QueueTypeArg] = amqp.QueueTypeQuorum
	}
	if _, err := e.ch.QueueDeclare(inbox, true, false, false, false, args); err != nil {
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
	// Each start after a SIGTERM ends a fault: rebound was down from the
	// signal until then.
	var faults []recovery
	var stopped time.Time
	restart := func() *proc {
		if err := e.publishCanary(n + len(faults)); err != nil {
			t.Fatal(err)
		}
		proc := e.launch(bin)
		faults = append(faults, e.recovered("rebound-SIGTERM", stopped, proc.started, e.watchRecovery(progress{}, false, time.Minute)))
		return proc
	}
	for round := range 3 {
		var proc *proc
		if round == 0 {
			proc = e.startBinary(bin)
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

// TestNoLossUnderMemoryAlarm raises a memory alarm while messages flow.
// Not parallel, and the queue types one after the other: the alarm blocks
// publishing on the whole broker.
func TestNoLossUnderMemoryAlarm(t *testing.T) {
	for _, queueType := range []string{"classic", "quorum"} {
		t.Run(queueType, func(t *testing.T) { memoryAlarm(t, queueType) })
	}
}

func memoryAlarm(t *testing.T, queueType string) {
	// Delays long enough that copies come back from the delay queues while
	// the alarm is on: RabbitMQ blocks a connection when it publishes.
	e := newTestEnv(t, with(fastLoop, "REBOUND_MIN_DELAY", "3s", "REBOUND_QUEUE_TYPE", queueType))
	e.rejectAll(e.app)
	e.startInProcess()
	const n = 2000
	e.publishNumbered(n)
	// A probe connection tells when the alarm ends: RabbitMQ blocks a
	// connection that publishes under an alarm and unblocks it when the
	// alarm clears.
	probe := dialBroker(t, brokerURL())
	blocking := probe.NotifyBlocked(make(chan amqp.Blocking, 4))
	probeCh, err := probe.Channel()
	if err != nil {
		t.Fatal(err)
	}
	rabbitmqctl(t, "-q", "set_vm_memory_high_watermark", "0")
	alarmed := time.Now()
	restore := func() { _ = exec.Command("rabbitmqctl", "-q", "set_vm_memory_high_watermark", "0.4").Run() }
	t.Cleanup(restore)
	// Routed nowhere: the default exchange drops it.
	if err := probeCh.PublishWithContext(context.Background(), "", e.prefix+"nowhere", false, false, amqp.Publishing{}); err != nil {
		t.Fatal(err)
	}
	awaitBlocking := func(active bool) time.Time {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case b := <-blocking:
				if b.Active == active {
					return time.Now()
				}
			case <-timeout:
				t.Fatalf("probe connection: no connection.blocked active=%v within 30s", active)
			}
		}
	}
	awaitBlocking(true)

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
	base, _ := e.progress()
	moving := e.watchRecovery(base, false, 3*time.Minute)
	restore()
	lifted := awaitBlocking(false)
	if err := e.publishCanary(n); err != nil {
		t.Fatal(err)
	}
	faults := []recovery{e.recovered("memory-alarm", alarmed, lifted, moving)}
	e.accountRecovered(n+1, 0, faults, 3*time.Minute)
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

// TestNoLossWhenBrokerRestarts takes the broker down while messages flow,
// once briefly (the application stopped for 5 s) and once for longer than
// rebound's reconnect backoff cap of 30 s (the node's Erlang VM killed
// with SIGKILL, started again 35 s later). It disturbs every test using
// the broker, so it only runs when asked: `make test` runs it on its own
// after the rest.
func TestNoLossWhenBrokerRestarts(t *testing.T) {
	if os.Getenv("REBOUND_TEST_BROKER_RESTART") == "" {
		t.Skip("restarts the broker; set REBOUND_TEST_BROKER_RESTART=1 (make test does, in a step of its own)")
	}
	for _, sc := range []struct {
		name, fault string
		down        time.Duration // from the stop or kill (once done) to the start
		stop, start func(t *testing.T)
	}{
		{
			name: "stop_app-5s", fault: "broker-stop_app", down: 5 * time.Second,
			stop:  func(t *testing.T) { rabbitmqctl(t, "-q", "stop_app") },
			start: func(t *testing.T) { rabbitmqctl(t, "-q", "start_app") },
		},
		{
			name: "SIGKILL-35s", fault: "broker-SIGKILL", down: 35 * time.Second,
			stop: killBroker,
			start: func(t *testing.T) {
				if err := startBrokerNode(); err != nil {
					t.Fatal(err)
				}
			},
		},
	} {
		t.Run(sc.name, func(t *testing.T) {
			brokerRestart(t, sc.fault, sc.down, sc.stop, sc.start)
		})
	}
}

// brokerRestart runs one broker outage of about down while messages flow.
// Classic queues dead-letter at most once inside the broker (no internal
// confirms), so a restart can drop a message in the app queue -> inbox or
// delay queue -> app queue hop whatever rebound does. With quorum queues
// and at-least-once dead-lettering every hop is confirmed, and a loss
// could only be rebound's.
func brokerRestart(t *testing.T, fault string, down time.Duration, stop, start func(t *testing.T)) {
	bin := buildBinary(t)
	e := newTestEnv(t, with(fastLoop, "REBOUND_MIN_DELAY", "200ms", "REBOUND_QUEUE_TYPE", "quorum"))
	e.quorumApp()
	e.rejectAll(e.app)
	proc := e.startBinary(bin)
	const n = 3000
	e.publishNumbered(n)
	time.Sleep(300 * time.Millisecond)

	base, _ := e.progress()
	moving := e.watchRecovery(base, true, down+5*time.Minute)
	// The outage starts when the broker drops a probe connection, as every
	// client sees it (stop_app takes seconds to get there).
	dropped := closedAt(dialBroker(t, brokerURL()))
	brokerGoesDown(t)
	stop(t)
	var stopped time.Time
	select {
	case stopped = <-dropped:
	case <-time.After(30 * time.Second):
		t.Fatal("the broker did not drop the probe connection within 30s of the stop")
	}
	time.Sleep(down - time.Second)
	// A broker outage is not a wedge: rebound is not ready, stays
	// healthy (a liveness probe must not restart it) and keeps trying to
	// connect, backing off up to its cap, without spinning.
	into := time.Since(stopped).Round(time.Second)
	during, ok := e.progress()
	if !ok || during.ready {
		t.Errorf("%s into the outage: rebound answers %v, ready %v; want /readyz 503", into, ok, during.ready)
	}
	healthz := 0
	if resp, err := probeClient.Get("http://" + e.http + "/healthz"); err == nil {
		resp.Body.Close()
		healthz = resp.StatusCode
	}
	if healthz != http.StatusOK {
		t.Errorf("/healthz %s into the outage: %d, want 200", into, healthz)
	}
	attempts := during.reconnects - base.reconnects
	t.Logf("OUTAGE %s in: ready=%v /healthz %d, %v reconnect attempts", into, during.ready, healthz, attempts)
	if attempts < 1 || attempts > 10 {
		t.Errorf("%v reconnect attempts in %s of outage, want 1 to 10 (trying, with backoff)", attempts, into)
	}
	time.Sleep(time.Second)

	// The fault ends when the broker accepts a connection again.
	up := brokerAccepts(3 * time.Minute)
	start(t)
	upAt := <-up
	if upAt.IsZero() {
		t.Fatal("the broker did not accept connections within 3 minutes of its start")
	}
	brokerBack(t)
	if err := e.publishCanary(n); err != nil {
		t.Fatal(err)
	}
	faults := []recovery{e.recovered(fault, stopped, upAt, moving)}
	// Recovery takes at most one capped backoff (30 s) plus connecting.
	if faults[0].recover > 45*time.Second {
		t.Errorf("rebound moved messages again %s after the broker came back, want within 45s", faults[0].recover)
	}
	rabbitmqctl(t, "-q", "await_startup")
	e.accountRecovered(n+1, 0, faults, 3*time.Minute)
	for _, line := range strings.Split(proc.logs.String(), "\n") {
		if strings.Contains(line, "reconnecting") {
			t.Log(line)
		}
	}
}
