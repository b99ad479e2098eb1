package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/cli"
)

// The test harness: one test's private rebound deployment on the broker
// under test, rebound run in-process or as a built binary, and the test's
// own clients (publisher, rejecting application, reader of queues).

// binPath is the rebound binary TestMain built for tests that need a real
// process to kill or signal; buildErr is why there is none.
var binPath, buildErr = "", error(nil)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rebound-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "rebound")
	if out, err := exec.Command("go", "build", "-o", binPath, "..").CombinedOutput(); err != nil {
		buildErr = fmt.Errorf("go build: %v\n%s", err, out)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// binary returns the rebound binary TestMain built.
func binary(t *testing.T) string {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// testEnv is one test's private rebound deployment on the broker under
// test (brokertest.Deployment), run in-process or as a binary, with its
// HTTP address. Every queue and exchange it declares starts with its
// prefix and is deleted at cleanup.
type testEnv struct {
	*brokertest.Deployment
	t       *testing.T
	http    string // rebound's HTTP address
	started time.Time
	body    int // bytes in each numbered message's body; 0 for 512
}

// newTestEnv requires the broker under test and sets up the deployment's
// variables (overrides win) and its application queue. REBOUND_AMQP_URL
// in overrides points the env at another virtual host.
func newTestEnv(t *testing.T, overrides map[string]string) *testEnv {
	t.Helper()
	return newTestEnvOn(t, brokertest.Require(t), overrides)
}

// newTestEnvOn is newTestEnv on node b, a node of a cluster say.
func newTestEnvOn(t *testing.T, b *brokertest.Broker, overrides map[string]string) *testEnv {
	t.Helper()
	addr := brokertest.FreeAddr(t)
	vars := map[string]string{
		"REBOUND_HTTP_ADDR":      addr,
		"REBOUND_LOG_LEVEL":      "warn",
		"REBOUND_JITTER":         "none",
		"REBOUND_SHUTDOWN_GRACE": "5s",
	}
	maps.Copy(vars, overrides)
	return &testEnv{Deployment: brokertest.NewDeployment(t, b, vars, nil), t: t, http: addr, started: time.Now()}
}

// vhost is the virtual host of the env's broker URL.
func (e *testEnv) vhost() string { return config.Config{AMQPURL: e.URL()}.Vhost() }

// cli runs a rebound command in-process with the env's variables.
func (e *testEnv) cli(args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	err = cli.Run(context.Background(), args, e.Environ(), &out, &errOut)
	return out.String(), errOut.String(), err
}

// startInProcess runs rebound in this process with the env's variables
// and waits until it is ready. It is stopped (as by SIGTERM) at cleanup.
func (e *testEnv) startInProcess() (stop func() error) {
	e.t.Helper()
	logs := &brokertest.SyncBuffer{}
	exited, stop := brokertest.RunInBackground("rebound", func(ctx context.Context) error {
		return cli.Run(ctx, []string{"run"}, e.Environ(), io.Discard, logs)
	}, 30*time.Second)
	e.t.Cleanup(func() {
		_ = stop()
		if e.t.Failed() {
			e.t.Logf("rebound logs:\n%s", logs.String())
		}
	})
	e.waitReady(exited)
	return stop
}

// proc is a rebound process started by launch or startBinary.
type proc struct {
	cmd     *exec.Cmd
	exited  chan error
	logs    *brokertest.SyncBuffer
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
	d := *e.Deployment
	r.Deployment = &d
	r.http = brokertest.FreeAddr(e.t)
	d.Vars = maps.Clone(e.Vars)
	d.Vars["REBOUND_HTTP_ADDR"] = r.http
	return &r
}

// launch starts the rebound binary with the env's variables and returns at
// once. Its log is shown if the test fails.
func (e *testEnv) launch() *proc {
	e.t.Helper()
	cmd := exec.Command(binary(e.t), "run")
	cmd.Env = append(os.Environ(), e.Environ()...)
	logs := &brokertest.SyncBuffer{}
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
// FreeAddr's port can be taken by another test's process between its
// check and rebound's bind (tests run in parallel, and killed replicas
// restart on their address): then it takes another address and launches
// again.
func (e *testEnv) startBinary() *proc {
	e.t.Helper()
	for try := 1; ; try++ {
		p := e.launch()
		exited, err := e.untilReady(p.exited)
		if !exited {
			return p
		}
		if try < 5 && strings.Contains(p.logs.String(), "address already in use") {
			e.http = brokertest.FreeAddr(e.t)
			e.Vars["REBOUND_HTTP_ADDR"] = e.http
			continue
		}
		e.t.Fatalf("rebound exited before it was ready: %v", err)
	}
}

func (e *testEnv) waitReady(exited <-chan error) {
	e.t.Helper()
	if early, err := e.untilReady(exited); early {
		e.t.Fatalf("rebound exited before it was ready: %v", err)
	}
}

// untilReady waits until rebound answers /readyz with 200 (early false),
// or it exits first (early true, with how it exited); not ready within
// 30 s fails the test.
func (e *testEnv) untilReady(exited <-chan error) (early bool, exitErr error) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return true, err
		default:
		}
		if resp, err := http.Get("http://" + e.http + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return false, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatal("rebound not ready within 30s")
	return false, nil
}

// metric returns the value of one sample line of /metrics, e.g.
// `rebound_messages_parked_total{reason="max-retries"}`.
func (e *testEnv) metric(series string) string {
	e.t.Helper()
	for _, line := range e.metricLines() {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

// metricTotal sums every series of the metric name (all label values)
// on the replica's /metrics, as integers.
func (e *testEnv) metricTotal(name string) int {
	e.t.Helper()
	total := 0
	for _, line := range e.metricLines() {
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			fields := strings.Fields(rest)
			n, _ := strconv.ParseFloat(fields[len(fields)-1], 64)
			total += int(n)
		}
	}
	return total
}

// metricLines returns the replica's /metrics, a line each.
func (e *testEnv) metricLines() []string {
	e.t.Helper()
	resp, err := http.Get("http://" + e.http + "/metrics")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return strings.Split(string(body), "\n")
}

// metricBecomes waits up to 10s until series (as metric takes it) reads
// want, and returns what it read last. A copy's outcome is counted once
// its confirm comes, which can be a moment after a test sees the copy
// where it went.
func (e *testEnv) metricBecomes(series, want string) string {
	e.t.Helper()
	got := ""
	brokertest.Await(10*time.Second, func() bool {
		got = e.metric(series)
		return got == want
	})
	return got
}

// metricSumBecomes waits up to 10 s for the sum of the series of name
// whose labels include every pair of labels (`reason="unknown-origin"`)
// to be want, and returns the last sum: for counters whose other labels
// (the origin, say) the test does not fix.
func (e *testEnv) metricSumBecomes(name string, want int, labels ...string) int {
	e.t.Helper()
	got := 0
	brokertest.Await(10*time.Second, func() bool {
		got = 0
		for _, line := range e.metricLines() {
			rest, ok := strings.CutPrefix(line, name+"{")
			if !ok {
				continue
			}
			set, value, _ := strings.Cut(rest, "} ")
			pairs := strings.Split(set, ",")
			if slices.ContainsFunc(labels, func(l string) bool { return !slices.Contains(pairs, l) }) {
				continue
			}
			n, _ := strconv.ParseFloat(value, 64)
			got += int(n)
		}
		return got == want
	})
	return got
}

// publish sends msg to the application queue.
func (e *testEnv) publish(msg amqp.Publishing) {
	e.t.Helper()
	e.PublishTo(e.App, msg)
}

// queueExists reports whether queue exists now.
func (e *testEnv) queueExists(queue string) bool {
	_, err := brokertest.QueueLen(e.URL(), queue)
	return err == nil
}

// extraQueue declares another durable queue with the test's prefix; the
// env's cleanup deletes it.
func (e *testEnv) extraQueue(suffix string) string {
	e.t.Helper()
	name := e.Prefix + suffix
	if _, err := e.Ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		e.t.Fatal(err)
	}
	return name
}

// with returns base plus the given key, value pairs.
func with(base map[string]string, extra ...string) map[string]string {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
	}
	for i := 0; i+1 < len(extra); i += 2 {
		out[extra[i]] = extra[i+1]
	}
	return out
}

// fastLoop is a policy that parks after two quick retries.
var fastLoop = map[string]string{"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "20ms", "REBOUND_MAX_RETRIES": "2"}
