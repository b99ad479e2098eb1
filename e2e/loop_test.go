package e2e

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// End-to-end tests of the retry loop: the real program runs in-process
// against a real RabbitMQ; a test consumer on the application queue
// rejects every message, so RabbitMQ dead-letters it to rebound.

type arrival struct {
	at time.Time
	d  amqp.Delivery
}

// rejector consumes a queue, records every delivery and rejects it without
// requeue. It reconnects when its connection is closed under it.
type rejector struct {
	mu       sync.Mutex
	arrivals []arrival
	stop     context.CancelFunc
	done     chan struct{}
}

func (e *testEnv) rejectAll(queue string) *rejector {
	ctx, cancel := context.WithCancel(context.Background())
	r := &rejector{stop: cancel, done: make(chan struct{})}
	url := e.URL()
	go func() {
		defer close(r.done)
		for ctx.Err() == nil {
			r.consume(ctx, url, queue)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	e.t.Cleanup(func() { cancel(); <-r.done })
	return r
}

// startRejecting starts rebound in-process with vars, and then a consumer
// that rejects every message on the application queue: the loop most tests
// here watch.
func startRejecting(t *testing.T, vars map[string]string) (*testEnv, *rejector) {
	t.Helper()
	e := newTestEnv(t, vars)
	e.startInProcess()
	return e, e.rejectAll(e.App)
}

func (r *rejector) consume(ctx context.Context, url, queue string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	_ = ch.Qos(500, 0, false)
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case d, ok := <-deliveries:
			if !ok {
				return
			}
			r.mu.Lock()
			r.arrivals = append(r.arrivals, arrival{at: time.Now(), d: d})
			r.mu.Unlock()
			_ = d.Nack(false, false)
		}
	}
}

func (r *rejector) seen() []arrival {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]arrival(nil), r.arrivals...)
}

// parked waits until the parking queue holds at least want messages and
// has stopped growing, then takes them all off it.
func (e *testEnv) parked(want int, timeout time.Duration) []amqp.Delivery {
	e.t.Helper()
	queue := e.Vars["REBOUND_PARKING_QUEUE"]
	deadline := time.Now().Add(timeout)
	last, stableSince := -1, time.Now()
	for time.Now().Before(deadline) {
		n := e.QueueLenOr(queue, 0)
		if n != last {
			last, stableSince = n, time.Now()
		}
		if n >= want && time.Since(stableSince) > 500*time.Millisecond {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return e.Drain(queue)
}

// wantParkedUnknownOrigin waits until want messages are parked and checks
// that each was parked for an origin rebound may not send it back to.
func (e *testEnv) wantParkedUnknownOrigin(want int) {
	e.t.Helper()
	parked := e.parked(want, 30*time.Second)
	if len(parked) != want {
		e.t.Fatalf("parked %d, want %d", len(parked), want)
	}
	for _, p := range parked {
		if p.Headers["x-retry-parked-reason"] != "unknown-origin" {
			e.t.Errorf("%s parked for %#v, want unknown-origin", p.MessageId, p.Headers["x-retry-parked-reason"])
		}
	}
}

func header(t *testing.T, d amqp.Delivery, name string) any {
	t.Helper()
	return d.Headers[name]
}

func TestLoopRetriesWithBackoffThenParks(t *testing.T) {
	t.Parallel()
	e, r := startRejecting(t, map[string]string{
		"REBOUND_BACKOFF": "exponential", "REBOUND_MIN_DELAY": "300ms", "REBOUND_MULTIPLIER": "2", "REBOUND_MAX_RETRIES": "3",
	})
	sent := time.Now().Truncate(time.Second)
	e.publish(amqp.Publishing{
		MessageId: "m-1", CorrelationId: "c-1", ContentType: "application/json", ContentEncoding: "utf-8",
		Type: "order.created", AppId: "orders", ReplyTo: "replies", Priority: 3, DeliveryMode: amqp.Persistent,
		Timestamp: sent, Expiration: "600000",
		Headers: amqp.Table{"app-header": "kept", "tenant": int64(42), "x-retry-error": "db down"},
		Body:    []byte(`{"order":1}`),
	})
	parked := e.parked(1, 30*time.Second)
	if len(parked) != 1 {
		t.Fatalf("parked %d messages, want 1", len(parked))
	}
	arrivals := r.seen()
	if len(arrivals) != 4 {
		t.Fatalf("application saw the message %d times, want 4 (first attempt and 3 retries)", len(arrivals))
	}
	wantDelays := []time.Duration{300 * time.Millisecond, 600 * time.Millisecond, 1200 * time.Millisecond}
	for i, want := range wantDelays {
		got := arrivals[i+1].at.Sub(arrivals[i].at)
		// The lower bound is the contract (a retry never comes early); the
		// upper bound only catches a delay queue that was skipped or stuck.
		if got < want-50*time.Millisecond || got > want+3*time.Second {
			t.Errorf("retry %d came back after %s, want about %s", i+1, got, want)
		}
		if c := header(t, arrivals[i+1].d, "x-retry-count"); c != int64(i+1) {
			t.Errorf("retry %d: x-retry-count = %#v, want int64(%d)", i+1, c, i+1)
		}
		if ld := header(t, arrivals[i+1].d, "x-retry-last-delay-ms"); ld != want.Milliseconds() {
			t.Errorf("retry %d: x-retry-last-delay-ms = %#v, want %d", i+1, ld, want.Milliseconds())
		}
		if q := e.QueueLen(e.Prefix + "delay." + strconv.FormatInt(want.Milliseconds(), 10)); q != 0 {
			t.Errorf("delay queue for %s holds %d messages, want 0", want, q)
		}
	}
	for _, d := range append([]amqp.Delivery{parked[0]}, arrivals[1].d, arrivals[3].d) {
		if d.MessageId != "m-1" || d.CorrelationId != "c-1" || d.ContentType != "application/json" || d.ContentEncoding != "utf-8" ||
			d.Type != "order.created" || d.AppId != "orders" || d.ReplyTo != "replies" || d.Priority != 3 ||
			d.DeliveryMode != amqp.Persistent || !d.Timestamp.Equal(sent) || string(d.Body) != `{"order":1}` {
			t.Errorf("properties or body not preserved: %+v", d)
		}
		if d.Expiration != "" {
			t.Errorf("expiration %q carried into a copy, want none", d.Expiration)
		}
		if d.Headers["app-header"] != "kept" || d.Headers["tenant"] != int64(42) || d.Headers["x-retry-error"] != "db down" {
			t.Errorf("application headers not preserved: %v", d.Headers)
		}
		if d.Headers["x-retry-origin-queue"] != e.App {
			t.Errorf("x-retry-origin-queue = %#v, want %q", d.Headers["x-retry-origin-queue"], e.App)
		}
	}
	p := parked[0]
	if p.Headers["x-retry-parked-reason"] != "max-retries" || p.Headers["x-retry-count"] != int64(3) {
		t.Errorf("parked headers: reason %#v count %#v, want max-retries and 3", p.Headers["x-retry-parked-reason"], p.Headers["x-retry-count"])
	}
	if at, ok := p.Headers["x-retry-parked-at"].(int64); !ok || at < sent.UnixMilli() {
		t.Errorf("x-retry-parked-at = %#v, want Unix ms after the publish", p.Headers["x-retry-parked-at"])
	}
	if started, ok := p.Headers["x-task-started-at"].(int64); !ok || started != sent.UnixMilli() {
		t.Errorf("x-task-started-at = %#v, want the timestamp property %d", p.Headers["x-task-started-at"], sent.UnixMilli())
	}
	if got := e.metricBecomes(`rebound_messages_parked_total{origin="`+e.App+`",policy="default",reason="max-retries",vhost="`+e.vhost()+`"}`, "1"); got != "1" {
		t.Errorf("parked metric = %q, want 1", got)
	}
	if got := e.metricBecomes(`rebound_messages_retried_total{kind="delayed",origin="`+e.App+`",policy="default",vhost="`+e.vhost()+`"}`, "3"); got != "3" {
		t.Errorf("retried metric = %q, want 3", got)
	}
}

func TestParksWhenBudgetIsSpent(t *testing.T) {
	t.Parallel()
	e, r := startRejecting(t, map[string]string{"REBOUND_MAX_DURATION": "1h"})
	e.publish(amqp.Publishing{MessageId: "old", Headers: amqp.Table{"x-task-started-at": time.Now().Add(-2 * time.Hour).UnixMilli()}})
	parked := e.parked(1, 30*time.Second)
	if len(parked) != 1 || parked[0].Headers["x-retry-parked-reason"] != "max-duration" {
		t.Fatalf("parked %v, want one message parked for max-duration", parked)
	}
	if n := len(r.seen()); n != 1 {
		t.Errorf("application saw the message %d times, want 1", n)
	}
}

func TestImmediateRetriesComeStraightBack(t *testing.T) {
	t.Parallel()
	e, r := startRejecting(t, map[string]string{
		"REBOUND_IMMEDIATE_RETRIES": "2", "REBOUND_MAX_RETRIES": "3", "REBOUND_MIN_DELAY": "1500ms", "REBOUND_BACKOFF": "constant",
	})
	e.publish(amqp.Publishing{MessageId: "quick"})
	if parked := e.parked(1, 30*time.Second); len(parked) != 1 {
		t.Fatalf("parked %d, want 1", len(parked))
	}
	a := r.seen()
	if len(a) != 4 {
		t.Fatalf("application saw the message %d times, want 4", len(a))
	}
	for i := 1; i <= 2; i++ {
		if gap := a[i].at.Sub(a[i-1].at); gap > time.Second {
			t.Errorf("immediate retry %d took %s, want well under the 1.5s delay", i, gap)
		}
	}
	if gap := a[3].at.Sub(a[2].at); gap < 1450*time.Millisecond {
		t.Errorf("first delayed retry came after %s, want at least 1.5s", gap)
	}
	// The copy carries none of the broker's dead-letter headers (they make
	// RabbitMQ 3.10 drop a copy as a dead-letter cycle), but the first
	// death's reason and queue in rebound's own.
	retry := a[1].d.Headers
	if _, ok := retry["x-death"]; ok {
		t.Errorf("immediate retry carries the broker's x-death: %v", retry["x-death"])
	}
	if retry["x-retry-first-death-reason"] != "rejected" || retry["x-retry-first-death-queue"] != e.App {
		t.Errorf("first death: %v in %v, want rejected in %s", retry["x-retry-first-death-reason"], retry["x-retry-first-death-queue"], e.App)
	}
}

func TestNonRetryableIsParkedAtOnce(t *testing.T) {
	t.Parallel()
	e, r := startRejecting(t, nil)
	e.publish(amqp.Publishing{MessageId: "poison", Headers: amqp.Table{"x-retry-non-retryable": true, "x-retry-error": "bad schema"}})
	parked := e.parked(1, 30*time.Second)
	if len(parked) != 1 || parked[0].Headers["x-retry-parked-reason"] != "non-retryable" || parked[0].Headers["x-retry-error"] != "bad schema" {
		t.Fatalf("parked %v, want the message parked as non-retryable with its error", parked)
	}
	if n := len(r.seen()); n != 1 {
		t.Errorf("application saw the message %d times, want 1", n)
	}
}

func TestUnknownOrMissingOriginIsParked(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	e.startInProcess()
	inbox := e.Vars["REBOUND_INBOX_QUEUE"]
	// Published straight to the inbox: no x-death, no origin header.
	e.PublishTo(inbox, amqp.Publishing{MessageId: "nowhere"})
	// An origin that names a queue that does not exist: the copy would be
	// dropped by the broker when its delay ends.
	e.PublishTo(inbox, amqp.Publishing{
		MessageId: "gone", Headers: amqp.Table{"x-retry-origin-queue": e.Prefix + "no-such-queue"},
	})
	e.wantParkedUnknownOrigin(2)
	if got := e.metricSumBecomes("rebound_messages_parked_total", 2, `policy="default"`, `reason="unknown-origin"`, `vhost="`+e.vhost()+`"`); got != 2 {
		t.Errorf("parked metric = %d, want 2", got)
	}
}

func TestGarbageHeadersAreCountedAndRepaired(t *testing.T) {
	t.Parallel()
	e, r := startRejecting(t, map[string]string{"REBOUND_MAX_RETRIES": "1", "REBOUND_MIN_DELAY": "100ms"})
	e.publish(amqp.Publishing{MessageId: "junk", Headers: amqp.Table{
		"x-retry-count": "banana", "x-task-started-at": "yesterday", "x-retry-last-delay-ms": int64(-5),
	}})
	parked := e.parked(1, 30*time.Second)
	if len(parked) != 1 {
		t.Fatalf("parked %d, want 1", len(parked))
	}
	a := r.seen()
	if len(a) != 2 {
		t.Fatalf("application saw the message %d times, want 2 (garbage count read as 0, one retry)", len(a))
	}
	retry := a[1].d
	if retry.Headers["x-retry-count"] != int64(1) {
		t.Errorf("repaired x-retry-count = %#v, want int64(1)", retry.Headers["x-retry-count"])
	}
	if started, ok := retry.Headers["x-task-started-at"].(int64); !ok || started <= 0 {
		t.Errorf("repaired x-task-started-at = %#v, want Unix ms", retry.Headers["x-task-started-at"])
	}
	for _, h := range []string{"x-retry-count", "x-task-started-at", "x-retry-last-delay-ms"} {
		if got := e.metric(`rebound_invalid_headers_total{header="` + h + `"}`); got != "1" {
			t.Errorf("invalid header metric for %s = %q, want 1", h, got)
		}
	}
}

func TestQuorumQueuesLoop(t *testing.T) {
	t.Parallel()
	e, r := startRejecting(t, map[string]string{"REBOUND_QUEUE_TYPE": "quorum", "REBOUND_MAX_RETRIES": "2", "REBOUND_MIN_DELAY": "200ms",
		"REBOUND_DELAY_QUEUE_IDLE": "1s"})
	for i := range 20 {
		e.publish(amqp.Publishing{MessageId: strconv.Itoa(i), DeliveryMode: amqp.Persistent})
	}
	if parked := e.parked(20, 60*time.Second); len(parked) != 20 {
		t.Fatalf("parked %d, want 20", len(parked))
	}
	if n := len(r.seen()); n != 60 {
		t.Errorf("application saw %d deliveries, want 60 (20 messages, 3 attempts each)", n)
	}
	// Quorum delay queues are never swept: RabbitMQ answers an if-empty
	// delete on them with a connection error, which would show here.
	time.Sleep(2500 * time.Millisecond)
	if got := e.metric("rebound_reconnects_total"); got != "0" {
		t.Errorf("rebound_reconnects_total = %q after idle sweeps, want 0", got)
	}
	if n := e.QueueLen(e.Prefix + "delay.200"); n != 0 {
		t.Errorf("quorum delay queue holds %d messages, want kept and empty", n)
	}
}

func TestIdleEmptyDelayQueuesAreDeleted(t *testing.T) {
	t.Parallel()
	e, _ := startRejecting(t, map[string]string{
		"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "100ms", "REBOUND_MAX_RETRIES": "1", "REBOUND_DELAY_QUEUE_IDLE": "1s",
	})
	delayQueue := e.Prefix + "delay.100"
	for round := range 2 {
		e.publish(amqp.Publishing{MessageId: strconv.Itoa(round)})
		if parked := e.parked(1, 30*time.Second); len(parked) != 1 {
			t.Fatalf("round %d: parked %d, want 1", round, len(parked))
		}
		// Idle for a second and empty: the next sweep deletes it; the next
		// round's copy declares it again.
		deadline := time.Now().Add(15 * time.Second)
		for e.queueExists(delayQueue) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if e.queueExists(delayQueue) {
			t.Fatalf("round %d: idle, empty delay queue still there (%d messages)", round, e.QueueLen(delayQueue))
		}
	}
}

func TestBusyDelayQueueIsNotDeleted(t *testing.T) {
	t.Parallel()
	// The idle period is shorter than the delay: a queue is only idle after
	// twice its delay, and never deleted while it holds a message.
	e, r := startRejecting(t, map[string]string{
		"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "4s", "REBOUND_MAX_RETRIES": "1", "REBOUND_DELAY_QUEUE_IDLE": "1s",
	})
	e.publish(amqp.Publishing{MessageId: "slow"})
	if parked := e.parked(1, 30*time.Second); len(parked) != 1 {
		t.Fatalf("parked %d, want 1 (the copy waiting 4s must survive the sweeps)", len(parked))
	}
	if n := len(r.seen()); n != 2 {
		t.Errorf("application saw the message %d times, want 2", n)
	}
}

// TestConsumerMarksARetriedMessagePermanent follows docs/producers.md: a
// consumer that finds a failure permanent republishes the message to the
// inbox with every header, x-retry-non-retryable, x-retry-error and
// x-retry-origin-queue, waits for the confirm and acks the original. Done
// on a message that came back from a delay queue, which rebound sent on to
// its origin with its own headers and none of the broker's: rebound parks
// it non-retryable, its origin the application queue, so a replay can send
// it back.
func TestConsumerMarksARetriedMessagePermanent(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, map[string]string{"REBOUND_MIN_DELAY": "100ms", "REBOUND_BACKOFF": "constant"})
	e.startInProcess()
	e.publish(amqp.Publishing{MessageId: "poison", Body: []byte("bad")})
	conn := e.Broker.Dial(t, e.URL())
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	get := func() amqp.Delivery {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			d, ok, err := ch.Get(e.App, false)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				return d
			}
		}
		t.Fatal("no delivery from the application queue within 10s")
		return amqp.Delivery{}
	}
	// The first attempt fails, worth retrying.
	if err := get().Reject(false); err != nil {
		t.Fatal(err)
	}
	// The retry fails for good.
	d := get()
	if deaths, ok := d.Headers["x-death"]; ok {
		t.Errorf("the retry carries x-death %v: rebound sends a delayed copy on without the broker's headers", deaths)
	}
	for _, routing := range []string{"CC", "BCC"} {
		if v, ok := d.Headers[routing]; ok {
			t.Errorf("the retry carries %s %v: republished through the default exchange, it would reach that queue too", routing, v)
		}
	}
	h := amqp.Table{}
	for k, v := range d.Headers {
		h[k] = v
	}
	h["x-retry-non-retryable"] = true
	h["x-retry-error"] = "schema v3 not supported"
	h["x-retry-origin-queue"] = e.App
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", e.Vars["REBOUND_INBOX_QUEUE"], true, false, amqp.Publishing{
		Headers: h, MessageId: d.MessageId, DeliveryMode: amqp.Persistent, Body: d.Body,
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
		t.Fatalf("republish not confirmed: %v", err)
	}
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
	parked := e.parked(1, 30*time.Second)
	if len(parked) != 1 {
		t.Fatalf("parked %d, want 1", len(parked))
	}
	p := parked[0].Headers
	if p["x-retry-parked-reason"] != "non-retryable" || p["x-retry-origin-queue"] != e.App || p["x-retry-error"] != "schema v3 not supported" ||
		p["x-retry-count"] != int64(1) {
		t.Errorf("parked as %v, origin %v, error %v, count %v; want non-retryable, %s, the consumer's error, 1",
			p["x-retry-parked-reason"], p["x-retry-origin-queue"], p["x-retry-error"], p["x-retry-count"], e.App)
	}
	if got := e.metric("rebound_origin_mismatch_total"); got != "0" {
		t.Errorf("rebound_origin_mismatch_total = %q: the consumer's own republish counted as a disputed origin", got)
	}
	// The republish went to the inbox alone: nothing came back to the
	// application queue, which would make the consumer fail it again.
	time.Sleep(300 * time.Millisecond)
	if n := e.QueueLen(e.App); n != 0 {
		t.Errorf("the application queue holds %d messages after the permanent failure's republish, want 0", n)
	}
}
