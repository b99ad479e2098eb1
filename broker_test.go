package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Helpers for tests that need a real RabbitMQ. Each test declares its own
// uniquely named queues and exchanges and deletes them, so tests can run in
// parallel and again.

func brokerURL() string {
	if u := os.Getenv("REBOUND_TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// dialBroker connects to the test broker, or skips the test when none is
// reachable, unless CI or REBOUND_REQUIRE_BROKER is set: then it fails.
func dialBroker(t testing.TB, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		if os.Getenv("CI") != "" || os.Getenv("REBOUND_REQUIRE_BROKER") != "" {
			t.Fatalf("RabbitMQ required (CI or REBOUND_REQUIRE_BROKER set) but not reachable: %v", err)
		}
		t.Skipf("no RabbitMQ at 127.0.0.1:5672 (%v); run scripts/ensure-rabbitmq.sh or `make test`", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// testEnv is one test's private rebound deployment on the shared broker.
type testEnv struct {
	t       *testing.T
	conn    *amqp.Connection
	ch      *amqp.Channel
	prefix  string
	app     string // the application queue, dead-lettering to rebound
	http    string // rebound's HTTP address
	vars    map[string]string
	started time.Time
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9]+`)

func newTestEnv(t *testing.T, overrides map[string]string) *testEnv {
	t.Helper()
	url := brokerURL()
	if u, ok := overrides["REBOUND_AMQP_URL"]; ok {
		url = u
	}
	conn := dialBroker(t, url)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("rt.%s.%s.", strings.Trim(unsafeName.ReplaceAllString(t.Name(), "-"), "-"), randomSuffix())
	e := &testEnv{t: t, conn: conn, ch: ch, prefix: prefix, app: prefix + "app", http: freeAddr(t), started: time.Now()}
	e.vars = map[string]string{
		"REBOUND_AMQP_URL":             brokerURL(),
		"REBOUND_INBOX_QUEUE":          prefix + "inbox",
		"REBOUND_DEAD_LETTER_EXCHANGE": prefix + "dlx",
		"REBOUND_DELAY_EXCHANGE":       prefix + "delay",
		"REBOUND_DELAY_QUEUE_PREFIX":   prefix + "delay.",
		"REBOUND_PARKING_QUEUE":        prefix + "parked",
		"REBOUND_HTTP_ADDR":            e.http,
		"REBOUND_LOG_LEVEL":            "warn",
		"REBOUND_JITTER":               "none",
		"REBOUND_SHUTDOWN_GRACE":       "5s",
	}
	for k, v := range overrides {
		e.vars[k] = v
	}
	// The dead-letter exchange is declared here as rebound declares it, so
	// the application queue can point at it before rebound first starts.
	if err := ch.ExchangeDeclare(e.vars["REBOUND_DEAD_LETTER_EXCHANGE"], "fanout", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(e.app, true, false, false, false, amqp.Table{"x-dead-letter-exchange": e.vars["REBOUND_DEAD_LETTER_EXCHANGE"]}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.cleanup)
	return e
}

func (e *testEnv) environ() []string {
	out := make([]string, 0, len(e.vars))
	for k, v := range e.vars {
		out = append(out, k+"="+v)
	}
	return out
}

// quorumApp makes the application queue a quorum queue with at-least-once
// dead-lettering, so the broker confirms the hop from it to rebound's inbox.
func (e *testEnv) quorumApp() {
	e.t.Helper()
	if _, err := e.ch.QueueDelete(e.app, false, false, false); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.ch.QueueDeclare(e.app, true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-dead-letter-exchange": e.vars["REBOUND_DEAD_LETTER_EXCHANGE"],
		"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
	}); err != nil {
		e.t.Fatal(err)
	}
}

// cleanup deletes every queue and exchange with the test's prefix.
func (e *testEnv) cleanup() {
	conn, err := amqp.Dial(e.vars["REBOUND_AMQP_URL"])
	if err != nil {
		return
	}
	defer conn.Close()
	names := []string{e.app, e.vars["REBOUND_INBOX_QUEUE"], e.vars["REBOUND_PARKING_QUEUE"]}
	if out, err := exec.Command("rabbitmqctl", "-q", "list_queues", "-p", e.vhost(), "name", "--no-table-headers").Output(); err == nil {
		for _, name := range strings.Fields(string(out)) {
			if strings.HasPrefix(name, e.prefix+"delay.") {
				names = append(names, name)
			}
		}
	}
	for _, q := range names {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
			ch.Close()
		}
	}
	for _, x := range []string{e.vars["REBOUND_DEAD_LETTER_EXCHANGE"], e.vars["REBOUND_DELAY_EXCHANGE"]} {
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(x, false, false)
			ch.Close()
		}
	}
}

// vhost is the virtual host of the env's broker URL.
func (e *testEnv) vhost() string {
	u, err := amqp.ParseURI(e.vars["REBOUND_AMQP_URL"])
	if err != nil || u.Vhost == "" {
		return "/"
	}
	return u.Vhost
}

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startInProcess runs rebound in this process with the env's variables
// and waits until it is ready. It is stopped (as by SIGTERM) at cleanup.
func (e *testEnv) startInProcess() (stop func() error) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"run"}, e.environ(), io.Discard, logs) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(30 * time.Second):
				runErr = fmt.Errorf("rebound did not stop within 30s")
			}
			if e.t.Failed() {
				e.t.Logf("rebound logs:\n%s", logs.String())
			}
		})
		return runErr
	}
	e.t.Cleanup(func() { _ = stop() })
	e.waitReady(done)
	return stop
}

func (e *testEnv) waitReady(exited <-chan error) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			e.t.Fatalf("rebound exited before it was ready: %v", err)
		default:
		}
		if resp, err := http.Get("http://" + e.http + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatal("rebound not ready within 30s")
}

// metric returns the value of one sample line of /metrics, e.g.
// `rebound_messages_parked_total{reason="max-retries"}`.
func (e *testEnv) metric(series string) string {
	e.t.Helper()
	resp, err := http.Get("http://" + e.http + "/metrics")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

// publish sends msg to the application queue.
func (e *testEnv) publish(msg amqp.Publishing) {
	e.t.Helper()
	if err := e.ch.PublishWithContext(context.Background(), "", e.app, false, false, msg); err != nil {
		e.t.Fatal(err)
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
