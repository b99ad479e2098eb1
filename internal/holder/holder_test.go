package holder

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/dialer"
	"github.com/rebound-mq/rebound/policy"
)

// TestProbe: RabbitMQ 4.3 holds a returned message, and hold mode is
// allowed; RabbitMQ 3.10 accepts the hold queue's arguments but serves no
// AMQP 1.0 (and holds nothing): refused, saying why.
func TestProbe(t *testing.T) {
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	err := Probe(context.Background(), dialer.New([]string{d.URL()}, nil, dialer.Client{Name: t.Name()}), d.Topology(true))
	if b.AtLeast(4, 3) {
		if err != nil {
			t.Fatalf("RabbitMQ %s refused: %v", b.Version(), err)
		}
		return
	}
	if !errors.Is(err, errCannotHold) {
		t.Fatalf("RabbitMQ %s: Probe = %v, want errCannotHold", b.Version(), err)
	}
	t.Logf("refused as it should be: %v", err)
}

// holdEnv is a deployment in hold mode with its topology declared and a
// way to run holders on it.
type holdEnv struct {
	*brokertest.Deployment
	rules Rules
	sent  int // copies published, which number them
}

func newHoldEnv(t *testing.T) *holdEnv {
	b := brokertest.Require(t)
	if !b.AtLeast(4, 3) {
		t.Skipf("RabbitMQ %s cannot hold (TestProbe checks that it is refused)", b.Version())
	}
	d := brokertest.NewDeployment(t, b, nil, nil)
	topo := d.Topology(true)
	topo.Hold = true
	if _, err := declarer.Declare(d.Conn, topo); err != nil {
		t.Fatal(err)
	}
	p := policy.Policy{Backoff: policy.Constant, MinDelay: time.Second, MaxDelay: time.Hour, Jitter: policy.NoJitter, MaxRetries: 5, Deadline: "clamp"}
	return &holdEnv{Deployment: d, rules: Rules{Topology: topo, Policies: policy.NewSet(p),
		Codec: headers.NewCodec(headers.DefaultNames()), Slice: 2 * time.Second}}
}

// start runs a holder until the returned stop is called; stop returns
// once it has ended.
func (e *holdEnv) start(t *testing.T) (m *metrics, stop func()) {
	return e.startWith(t, Options{})
}

// startWith is start with opt's Drain and Rules.Topology.Hold, and its
// Dialer, Logger and Credit when set (else the test's log and a credit
// of 64).
func (e *holdEnv) startWith(t *testing.T, opt Options) (m *metrics, stop func()) {
	m = NewMetrics(prometheus.NewRegistry(), time.Now, e.rules.Slice)
	rules := e.rules
	rules.Topology.Hold = !opt.Drain
	if opt.Dialer == nil {
		opt.Dialer = dialer.New([]string{e.URL()}, nil, dialer.Client{Name: t.Name()})
	}
	if opt.Logger == nil {
		opt.Logger = zaptest.NewLogger(t)
	}
	if opt.Credit == 0 {
		opt.Credit = 64
	}
	h := New(Options{Dialer: opt.Dialer,
		Rules: rules, Logger: opt.Logger, Metrics: m, Credit: opt.Credit, Drain: opt.Drain})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("holder: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return m, stop
}

// publish sends copies through the hold exchange to origin, due at due,
// and waits for the broker to confirm them all: published at once, not
// one round trip after the other, so that a loaded machine's publishing
// does not eat into the time before they are due.
func (e *holdEnv) publish(t *testing.T, origin string, n int, due time.Time, extra amqp.Table) {
	t.Helper()
	ex := e.rules.Topology.HoldExchange().Name
	confirms := make([]*amqp.DeferredConfirmation, 0, n)
	for range n {
		i := e.sent
		e.sent++
		h := amqp.Table{"x-retry-due-at": due.UnixMilli(), "tenant": amqp.Table{"id": int32(i), "tags": []any{"a", int64(2)}}}
		for k, v := range extra {
			h[k] = v
		}
		headers.HoldTables(h) // as the sidecar writes a copy
		c, err := e.Ch.PublishWithDeferredConfirm(ex, origin, true, false, amqp.Publishing{MessageId: fmt.Sprint(origin, "#", i), Headers: h, Body: []byte("body"), DeliveryMode: amqp.Persistent})
		if err != nil {
			t.Fatal(err)
		}
		confirms = append(confirms, c)
	}
	for _, c := range confirms {
		if !c.Wait() {
			t.Fatal("copy not confirmed")
		}
	}
}

// TestHoldRoundTrip: copies published to the hold exchange come back to
// their origin queue at their due time, never before, with their headers
// intact (nested tables and arrays included); one whose origin is one of
// rebound's queues, or that carries CC queues, is parked; one due already
// goes home at once.
//
// The holder runs, and has sent the due copy home, before the others are
// published: their due time is then counted from when a running holder
// can take them, not from before a loaded machine's setup (a due time
// taken before it passed before the holder saw a copy, once at load 23,
// and nothing was held).
func TestHoldRoundTrip(t *testing.T) {
	e := newHoldEnv(t)
	m, _ := e.start(t)
	e.publish(t, e.App, 1, time.Now().Add(-time.Second), amqp.Table{"kind": "due"})
	if !brokertest.Await(60*time.Second, func() bool { return e.QueueLen(e.App) == 1 }) {
		t.Fatal("the copy due already is not home")
	}
	due := time.Now().Add(4 * time.Second) // past a slice: held twice
	e.publish(t, e.App, 20, due, nil)
	e.publish(t, e.rules.Topology.InboxQueue, 1, due, nil)
	e.publish(t, e.App, 1, due, amqp.Table{"CC": []any{e.rules.Topology.ParkingQueue}})

	arrived := map[string]time.Time{}
	var late []float64
	if !brokertest.Await(60*time.Second, func() bool {
		for _, d := range brokertest.Drain(t, e.Ch, e.App) {
			arrived[d.MessageId] = time.Now()
			if d.Headers["kind"] == nil {
				if time.Now().Before(due.Add(-50 * time.Millisecond)) {
					t.Errorf("copy %s home at %v, before its due time %v", d.MessageId, time.Now(), due)
				}
				late = append(late, time.Since(due).Seconds())
				tenant, _ := d.Headers["tenant"].(amqp.Table)
				if tags, _ := tenant["tags"].([]any); len(tags) != 2 {
					t.Errorf("copy %s: nested header %v, want it intact", d.MessageId, d.Headers["tenant"])
				}
			}
		}
		return len(arrived) >= 21
	}) {
		t.Fatalf("%d copies home, want 21", len(arrived))
	}
	parked := brokertest.Drain(t, e.Ch, e.rules.Topology.ParkingQueue)
	for !brokertest.Await(10*time.Second, func() bool {
		parked = append(parked, brokertest.Drain(t, e.Ch, e.rules.Topology.ParkingQueue)...)
		return len(parked) >= 2
	}) {
		t.Fatalf("%d copies parked, want 2", len(parked))
	}
	for _, p := range parked {
		if p.Headers["x-retry-parked-reason"] == nil || string(p.Body) != "body" {
			t.Errorf("parked copy %s: headers %v body %q", p.MessageId, p.Headers, p.Body)
		}
	}
	if n := e.QueueLen(e.App); n != 0 {
		t.Errorf("%d more copies home, want none (the CC copy went nowhere)", n)
	}
	if got := testutil.ToFloat64(m.Settled.WithLabelValues("held")); got < 20 {
		t.Errorf("held settlements %v, want at least 20", got)
	}
	t.Logf("lateness of %d copies (s): %v", len(late), late)
}

// TestHolderStoppedMidHold: a holder stopped while it holds copies, and
// another stopped while copies are being handed to it, lose none: every
// settlement reaches the broker before its connection closes, and the
// next holder sends every copy home.
func TestHolderStoppedMidHold(t *testing.T) {
	e := newHoldEnv(t)
	const n = 500
	m, stop := e.start(t)
	// Due after both holders below have held copies and stopped: each
	// waits on its own count of holds, not on the clock, so the due time
	// only needs to outlast those two waits on a loaded machine.
	due := time.Now().Add(20 * time.Second)
	e.publish(t, e.App, n, due, nil)
	if !brokertest.Await(60*time.Second, func() bool { return testutil.ToFloat64(m.Settled.WithLabelValues("held")) >= n/2 }) {
		t.Fatal("the first holder held nothing")
	}
	stop() // mid-stream: some held, some in flight
	m2, stop2 := e.start(t)
	// The held copies come back every slice: the second holder holds
	// them again, and is stopped while it does.
	if !brokertest.Await(60*time.Second, func() bool { return testutil.ToFloat64(m2.Settled.WithLabelValues("held")) >= n/10 }) {
		t.Fatal("the second holder held nothing")
	}
	stop2()
	if time.Now().After(due) {
		t.Logf("the second holder stopped %s after the copies were due: they were sent home, not held", time.Since(due))
	}
	e.start(t)
	got := map[string]bool{}
	if !brokertest.Await(90*time.Second, func() bool {
		for _, d := range brokertest.Drain(t, e.Ch, e.App) {
			got[d.MessageId] = true
		}
		return len(got) == n
	}) {
		t.Fatalf("%d of %d copies home", len(got), n)
	}
}

// TestHoldOriginRefuses: a due copy whose origin refuses it (full, with
// reject-publish) is seen refused by the holder, which publishes the
// first copies for an origin home itself: it stays held, with backoff,
// and goes home once the origin has room; one whose budget is spent
// (here its retry count: the policy has no duration budget) is parked
// origin-refused. None is left in the broker's dead-letter retry.
func TestHoldOriginRefuses(t *testing.T) {
	e := newHoldEnv(t)
	const n = 3
	full, freed := e.Prefix+"full", e.Prefix+"freed"
	for _, q := range []string{full, freed} {
		e.Declare(q, amqp.Table{"x-max-length": int64(n), amqp.QueueOverflowArg: amqp.QueueOverflowRejectPublish})
		for i := range n {
			e.Publish(q, amqp.Publishing{MessageId: fmt.Sprint("filler", i), Headers: amqp.Table{"kind": "filler"}})
		}
	}
	// Ten waits, over a minute, for the copies of the origin that is
	// freed; one for those of the origin that stays full: parked at their
	// second refusal.
	e.rules.Policies = policy.NewSet(policy.Policy{Backoff: policy.Constant, MinDelay: time.Second, MaxDelay: time.Hour,
		Jitter: policy.NoJitter, MaxRetries: 10, Deadline: "clamp"})
	e.publish(t, freed, n, time.Now(), amqp.Table{"x-retry-count": int64(0)})
	e.publish(t, full, n, time.Now(), amqp.Table{"x-retry-count": int64(9)})
	m, _ := e.start(t)
	parking := e.rules.Topology.ParkingQueue
	e.WaitQueueLen(parking, n, 60*time.Second)
	for _, p := range brokertest.Drain(t, e.Ch, parking) {
		if p.Headers["x-retry-parked-reason"] != string(policy.OriginRefused) || p.Headers["x-retry-origin-queue"] != full {
			t.Errorf("parked copy %s: reason %v origin %v, want origin-refused from %s", p.MessageId, p.Headers["x-retry-parked-reason"], p.Headers["x-retry-origin-queue"], full)
		}
	}
	if got := testutil.ToFloat64(m.OriginRefused); got < n {
		t.Errorf("refusals seen %v, want at least %d", got, n)
	}
	for _, q := range []string{full, freed} {
		for i := range n {
			if d := e.Get(q, 10*time.Second); d.Headers["kind"] != "filler" {
				t.Fatalf("message %d of %s: %s, want a filler", i, q, d.MessageId)
			} else if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := map[string]bool{}
	if !brokertest.Await(60*time.Second, func() bool {
		for _, d := range brokertest.Drain(t, e.Ch, freed) {
			got[d.MessageId] = true
			if d.Headers["kind"] == "filler" {
				t.Errorf("filler %s again", d.MessageId)
			}
		}
		return len(got) == n
	}) {
		t.Fatalf("%d of %d refused copies reached their origin once it had room", len(got), n)
	}
	hold := e.rules.Topology.HoldQueue().Name
	if !brokertest.Await(30*time.Second, func() bool { return e.brokerMessages(t, hold) == 0 }) {
		t.Errorf("the hold queue keeps %d copies", e.brokerMessages(t, hold))
	}
	if n := e.QueueLen(full); n != 0 {
		t.Errorf("%d copies reached %s after they were parked", n, full)
	}
	t.Logf("published home %v, dead-lettered %v, refused %v", testutil.ToFloat64(m.Released.WithLabelValues("published")),
		testutil.ToFloat64(m.Released.WithLabelValues("dead-lettered")), testutil.ToFloat64(m.OriginRefused))
}

// brokerMessages is every message queue holds, held ones included, as
// rabbitmqctl reports it (AMQP 0-9-1 counts only the ready ones).
func (e *holdEnv) brokerMessages(t *testing.T, queue string) int {
	t.Helper()
	out := e.Broker.MustCtl(t, "-q", "list_queues", "-p", vhost(e.URL()), "name", "messages")
	for _, line := range strings.Split(out, "\n") {
		if fields := strings.Fields(line); len(fields) == 2 && fields[0] == queue {
			n, err := strconv.Atoi(fields[1])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("queue %s not listed:\n%s", queue, out)
	return 0
}

func vhost(url string) string {
	u, err := amqp.ParseURI(url)
	if err != nil || u.Vhost == "" {
		return "/"
	}
	return u.Vhost
}

// TestHoldFlushAndCancel: a flush recorded in the commands stream sends
// the held copies of its origin home within a slice, and a cancel parks
// those of its origin (reason cancelled), whichever holder holds them;
// copies of other origins stay held.
func TestHoldFlushAndCancel(t *testing.T) {
	e := newHoldEnv(t)
	other, untouched := e.Prefix+"other", e.Prefix+"untouched"
	e.Declare(other, nil)
	e.Declare(untouched, nil)
	const n = 20
	due := time.Now().Add(10 * time.Minute)
	e.publish(t, e.App, n, due, amqp.Table{"x-retry-last-delay-ms": int64(10 * time.Minute / time.Millisecond)})
	e.publish(t, other, n, due, amqp.Table{"x-retry-last-delay-ms": int64(10 * time.Minute / time.Millisecond)})
	e.publish(t, untouched, n, due, amqp.Table{"x-retry-last-delay-ms": int64(10 * time.Minute / time.Millisecond)})
	m1, _ := e.start(t)
	m2, _ := e.start(t)
	held := func() float64 {
		return testutil.ToFloat64(m1.Settled.WithLabelValues("held")) + testutil.ToFloat64(m2.Settled.WithLabelValues("held"))
	}
	if !brokertest.Await(60*time.Second, func() bool { return held() >= 3*n }) {
		t.Fatalf("%v copies held, want %d", held(), 3*n)
	}
	now := time.Now()
	if _, err := Flush(context.Background(), e.Conn, e.rules.Topology, regexp.MustCompile("^"+regexp.QuoteMeta(e.App)+"$"), now, e.rules.Slice); err != nil {
		t.Fatal(err)
	}
	if _, err := Cancel(context.Background(), e.Conn, e.rules.Topology, regexp.MustCompile("^"+regexp.QuoteMeta(other)+"$"), now, e.rules.Slice); err != nil {
		t.Fatal(err)
	}
	e.WaitQueueLen(e.App, n, 60*time.Second)
	parking := e.rules.Topology.ParkingQueue
	e.WaitQueueLen(parking, n, 60*time.Second)
	for _, p := range brokertest.Drain(t, e.Ch, parking) {
		if p.Headers["x-retry-parked-reason"] != "cancelled" || p.Headers["x-retry-origin-queue"] != other {
			t.Errorf("parked copy %s: reason %v origin %v, want cancelled from %s", p.MessageId, p.Headers["x-retry-parked-reason"], p.Headers["x-retry-origin-queue"], other)
		}
	}
	if got := e.QueueLen(untouched); got != 0 {
		t.Errorf("%d copies of an origin no command named went home", got)
	}
}

// TestDrainLeftHoldQueue: a holder of a deployment back in queues mode
// drains the hold queue it finds: the copies held there still come home.
func TestDrainLeftHoldQueue(t *testing.T) {
	e := newHoldEnv(t)
	e.publish(t, e.App, 10, time.Now().Add(2*time.Second), nil)
	m, _ := e.startWith(t, Options{Drain: true})
	e.WaitQueueLen(e.App, 10, 60*time.Second)
	// The holder counts a release once its settlement returns, which can
	// be after the broker has delivered the copy home.
	released := func() float64 { return testutil.ToFloat64(m.Settled.WithLabelValues("released")) }
	brokertest.Await(10*time.Second, func() bool { return released() >= 10 })
	if got := released(); got != 10 {
		t.Errorf("released %v, want 10", got)
	}
}

// TestHoldParkingQueueMissing: a copy the holder parks while the parking
// queue is missing is returned unroutable by the broker; it is not
// accepted (which would lose it) but held again, and parked, once, when
// the queue is back.
func TestHoldParkingQueueMissing(t *testing.T) {
	e := newHoldEnv(t)
	parking := e.rules.Topology.ParkingQueue
	if _, err := e.Ch.QueueDelete(parking, false, false, false); err != nil {
		t.Fatal(err)
	}
	e.publish(t, e.rules.Topology.InboxQueue, 1, time.Now(), amqp.Table{"kind": "unknown-origin"})
	m, _ := e.start(t)
	// One return is the point: the copy is then held again (the hold
	// queue keeps it) and parked on a later try once the queue is back.
	if !brokertest.Await(60*time.Second, func() bool { return testutil.ToFloat64(m.ParkReturned) >= 1 }) {
		t.Fatalf("returned parks %v, want the copy tried", testutil.ToFloat64(m.ParkReturned))
	}
	if got := testutil.ToFloat64(m.Settled.WithLabelValues("parked")); got != 0 {
		t.Fatalf("%v copies counted parked with no parking queue", got)
	}
	hold := e.rules.Topology.HoldQueue().Name
	if !brokertest.Await(30*time.Second, func() bool { return e.brokerMessages(t, hold) == 1 }) {
		t.Fatalf("the hold queue keeps %d copies, want the one the parking queue did not take", e.brokerMessages(t, hold))
	}
	if _, err := declarer.Declare(e.Conn, e.rules.Topology); err != nil {
		t.Fatal(err)
	}
	e.WaitQueueLen(parking, 1, 60*time.Second)
	if !brokertest.Await(30*time.Second, func() bool { return e.brokerMessages(t, hold) == 0 }) {
		t.Fatalf("the hold queue keeps %d copies after the park", e.brokerMessages(t, hold))
	}
	p := e.Get(parking, 10*time.Second)
	if p.Headers["x-retry-parked-reason"] != string(policy.UnknownOrigin) || p.Headers["kind"] != "unknown-origin" {
		t.Errorf("parked copy %s: headers %v", p.MessageId, p.Headers)
	}
	if n := e.QueueLen(parking); n != 0 {
		t.Errorf("%d more parked copies, want the copy parked once", n)
	}
}

// TestHoldWithoutDefaultExchangeWrite: a holder whose user may not write
// to the default exchange cannot publish due copies home: it sends every
// copy home by dead-lettering instead, and loses none.
func TestHoldWithoutDefaultExchangeWrite(t *testing.T) {
	e := newHoldEnv(t)
	own := "^" + regexp.QuoteMeta(e.Prefix) + ".*"
	_, url := e.Broker.User(t, e.URL(), "secret", own, own, ".*")
	const n = 5
	e.publish(t, e.App, n, time.Now(), nil)
	m, _ := e.startWith(t, Options{Dialer: dialer.New([]string{url}, nil, dialer.Client{Name: t.Name()})})
	e.WaitQueueLen(e.App, n, 60*time.Second)
	if got := testutil.ToFloat64(m.Released.WithLabelValues("dead-lettered")); got != n {
		t.Errorf("dead-lettered %v, want %d", got, n)
	}
	if got := testutil.ToFloat64(m.Released.WithLabelValues("published")); got != 0 {
		t.Errorf("published %v without write access", got)
	}
}

// TestDrainWithoutPermission: a replica in queues mode whose user has no
// permission on the hold queue (RabbitMQ 4.2.6 and later refuse even a
// passive declare without configure) says so once, naming what to grant,
// and waits as for an absent queue instead of reconnecting with backoff.
func TestDrainWithoutPermission(t *testing.T) {
	e := newHoldEnv(t)
	hold := e.rules.Topology.HoldQueue().Name
	others := "^(?!" + regexp.QuoteMeta(hold) + "$)" + regexp.QuoteMeta(e.Prefix) + ".*"
	_, url := e.Broker.User(t, e.URL(), "secret", others, others, others)
	core, logs := observer.New(zap.WarnLevel)
	rules := e.rules
	rules.Topology.Hold = false
	h := New(Options{Dialer: dialer.New([]string{url}, nil, dialer.Client{Name: t.Name()}), Rules: rules,
		Logger: zap.New(core), Metrics: NewMetrics(prometheus.NewRegistry(), time.Now, rules.Slice), Drain: true})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("holder: %v", err)
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for logs.FilterMessageSnippet("cannot check for a hold queue to drain").Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no warning that the hold queue cannot be checked; logged: %v", logs.All())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := logs.FilterMessageSnippet("holder session ended").Len(); got != 0 {
		t.Errorf("%d reconnect warnings, want none: %v", got, logs.All())
	}
	if w := logs.FilterMessageSnippet("cannot check").All()[0]; !strings.Contains(w.Message, "setup.sh") {
		t.Errorf("the warning does not say what to grant: %q", w.Message)
	}
}
