package e2e

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// rebound must not be a confused deputy: its user may publish to every
// queue of the vhost (through the default exchange), so nothing a producer
// writes may steer it to a queue the broker did not record the message
// coming from. These tests play the producer as an attacker.

// TestOriginHeaderCannotRedirect is a confused-deputy attempt: a producer
// that may publish only to orders sets x-retry-origin-queue: payments (and
// CC and BCC: payments, which would route rebound's own publishes); the
// consumer rejects it. The message must come back to orders, never reach
// payments, and the mismatch be counted. The producer publishes through a
// fanout exchange bound to orders alone, as a producer limited to orders
// does: through the default exchange the broker would honour its CC on
// that very publish, before rebound sees anything.
func TestOriginHeaderCannotRedirect(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, map[string]string{"REBOUND_MAX_RETRIES": "2", "REBOUND_MIN_DELAY": "100ms", "REBOUND_BACKOFF": "constant"})
	payments := e.extraQueue("payments")
	ordersOnly := e.Prefix + "orders-in"
	if err := e.Ch.ExchangeDeclare(ordersOnly, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.Ch.QueueBind(e.App, "", ordersOnly, false, nil); err != nil {
		t.Fatal(err)
	}
	e.startInProcess()
	r := e.rejectAll(e.App)
	if err := e.Ch.PublishWithContext(context.Background(), ordersOnly, "", false, false, amqp.Publishing{MessageId: "forged", Headers: amqp.Table{
		"x-retry-origin-queue": payments, "CC": []any{payments}, "BCC": []any{payments},
	}}); err != nil {
		t.Fatal(err)
	}
	parked := e.parked(1, 30*time.Second)
	if len(parked) != 1 || parked[0].Headers["x-retry-parked-reason"] != "max-retries" || parked[0].Headers["x-retry-origin-queue"] != e.App {
		t.Fatalf("parked %v, want the message parked after its retries in %s", parked, e.App)
	}
	if n := len(r.seen()); n != 3 {
		t.Errorf("orders saw the message %d times, want 3 (first attempt and 2 retries)", n)
	}
	if n := e.QueueLen(payments); n != 0 {
		t.Errorf("payments received %d messages from rebound", n)
	}
	// Counted once per delivery that claimed another origin: the first; its
	// copies carry the record's origin.
	if got := e.metric("rebound_origin_mismatch_total"); got != "1" {
		t.Errorf("rebound_origin_mismatch_total = %q, want 1", got)
	}
	for _, h := range []string{"CC", "BCC"} {
		if v, ok := parked[0].Headers[h]; ok {
			t.Errorf("the parked copy carries %s: %v", h, v)
		}
	}
}

// TestOriginAllowlist: REBOUND_ORIGIN_QUEUES says where messages may go
// back to. A message from a queue it does not match is parked
// origin-not-allowed, never retried; so is one published straight into
// the inbox with a forged x-death (both RabbitMQ 3.10 and 4.3 deliver a
// client's x-death as it was published when nothing dead-letters the
// message) naming a queue the allowlist excludes.
func TestOriginAllowlist(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, map[string]string{"REBOUND_MAX_RETRIES": "1", "REBOUND_MIN_DELAY": "100ms"})
	e.Vars["REBOUND_ORIGIN_QUEUES"] = "^" + regexp.QuoteMeta(e.App) + "$"
	other := e.Prefix + "other"
	if _, err := e.Ch.QueueDeclare(other, true, false, false, false, amqp.Table{"x-dead-letter-exchange": e.Vars["REBOUND_DEAD_LETTER_EXCHANGE"]}); err != nil {
		t.Fatal(err)
	}
	payments := e.extraQueue("payments")
	e.startInProcess()
	e.rejectAll(e.App)
	rOther := e.rejectAll(other)
	e.publish(amqp.Publishing{MessageId: "allowed"})
	e.PublishTo(other, amqp.Publishing{MessageId: "from-other"})
	e.PublishTo(e.Vars["REBOUND_INBOX_QUEUE"], amqp.Publishing{MessageId: "forged-x-death", Headers: amqp.Table{
		"x-death": []any{amqp.Table{"queue": payments, "reason": "rejected", "count": int64(1), "exchange": "", "time": time.Now()}},
	}})
	byID := map[string]amqp.Delivery{}
	for _, d := range e.parked(3, 30*time.Second) {
		byID[d.MessageId] = d
	}
	for id, reason := range map[string]string{"allowed": "max-retries", "from-other": "origin-not-allowed", "forged-x-death": "origin-not-allowed"} {
		if got := byID[id].Headers["x-retry-parked-reason"]; got != reason {
			t.Errorf("%s parked for %v, want %s", id, got, reason)
		}
	}
	if n := len(rOther.seen()); n != 1 {
		t.Errorf("the queue the allowlist excludes saw its message %d times, want 1 (never sent back)", n)
	}
	if n := e.QueueLen(payments); n != 0 {
		t.Errorf("payments received %d messages", n)
	}
	if got := e.metricSumBecomes("rebound_messages_parked_total", 2, `policy="default"`, `reason="origin-not-allowed"`, `vhost="`+e.vhost()+`"`); got != 2 {
		t.Errorf("parked metric = %d, want 2", got)
	}
}

// TestOwnQueuesAreNeverAnOrigin: a message naming rebound's inbox, parking
// queue or a delay queue as its origin is parked unknown-origin, so it
// neither loops through rebound nor slips into the parking queue unmarked.
func TestOwnQueuesAreNeverAnOrigin(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	e.startInProcess()
	inbox := e.Vars["REBOUND_INBOX_QUEUE"]
	own := []string{inbox, e.Vars["REBOUND_PARKING_QUEUE"], e.Prefix + "delay.1000"}
	for _, q := range own {
		e.PublishTo(inbox, amqp.Publishing{MessageId: q, Headers: amqp.Table{"x-retry-origin-queue": q}})
	}
	e.wantParkedUnknownOrigin(len(own))
	// Parked once each: none came back through rebound again.
	time.Sleep(500 * time.Millisecond)
	if got := e.metric("rebound_messages_received_total"); got != "3" {
		t.Errorf("rebound received %s messages, want 3", got)
	}
}

// TestReplayObeysTheAllowlist: `rebound parked replay` applies the
// sidecar's origin rules. A parked message whose origin the allowlist
// excludes, or that names rebound's own queue, stays parked.
func TestReplayObeysTheAllowlist(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	payments := e.extraQueue("payments")
	e.Vars["REBOUND_ORIGIN_QUEUES"] = "^" + regexp.QuoteMeta(e.App) + "$"
	e.seedParked(
		parkedSeed{id: "ok", origin: e.App, reason: "max-retries"},
		parkedSeed{id: "to-payments", origin: payments, reason: "max-retries"},
		parkedSeed{id: "to-inbox", origin: e.Vars["REBOUND_INBOX_QUEUE"], reason: "max-retries"},
	)
	out, _, err := e.cli("parked", "replay")
	if err == nil {
		t.Error("replay succeeded with messages it may not replay")
	}
	for _, want := range []string{"replayed 1 of 3", "1 stay parked: origin queue not allowed by REBOUND_ORIGIN_QUEUES", "id to-payments",
		"1 stay parked: origin is one of rebound's own queues", "id to-inbox"} {
		if !strings.Contains(out, want) {
			t.Errorf("replay output lacks %q:\n%s", want, out)
		}
	}
	if n := e.QueueLen(payments); n != 0 {
		t.Errorf("payments received %d messages", n)
	}
	if back := e.Drain(e.App); len(back) != 1 || back[0].MessageId != "ok" {
		t.Errorf("origin queue got %v, want only ok", back)
	}
}

// TestLargeHeadersCostLittle: the biggest header table a producer can send
// (RabbitMQ's frame_max bounds it, 128 KiB by default) is handled like any
// other message: an x-death of thousands of entries and a long string.
func TestLargeHeadersCostLittle(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, map[string]string{"REBOUND_MAX_RETRIES": "1", "REBOUND_MIN_DELAY": "50ms"})
	e.startInProcess()
	r := e.rejectAll(e.App)
	// About 100 KiB in all: 1 000 entries of about 70 bytes and two 10 KB
	// strings.
	deaths := make([]any, 1000)
	for i := range deaths {
		deaths[i] = amqp.Table{"queue": "q", "reason": "rejected", "count": int64(i), "time": time.Now()}
	}
	e.publish(amqp.Publishing{MessageId: "big", Headers: amqp.Table{
		"x-death":       deaths,
		"x-retry-count": strings.Repeat("9", 10000),
		"blob":          strings.Repeat("b", 10000),
	}})
	parked := e.parked(1, 30*time.Second)
	if len(parked) != 1 {
		t.Fatalf("parked %d, want 1", len(parked))
	}
	if n := len(r.seen()); n != 2 {
		t.Errorf("the application saw the message %d times, want 2", n)
	}
	if _, ok := parked[0].Headers["x-death"]; ok {
		t.Error("the parked copy carries the forged x-death")
	}
	if parked[0].Headers["blob"] != strings.Repeat("b", 10000) {
		t.Error("the application header was not kept")
	}
	if got := e.metric(`rebound_invalid_headers_total{header="x-retry-count"}`); got != "1" {
		t.Errorf("invalid x-retry-count counted %q times, want 1", got)
	}
}

// TestEndpointsHoldNoSecrets: what /metrics and the probes serve holds no
// password and nothing from a message (body, headers, ids).
func TestEndpointsHoldNoSecrets(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, map[string]string{"REBOUND_MAX_RETRIES": "1", "REBOUND_MIN_DELAY": "50ms"})
	// The same broker through a URL with another password in its user
	// info: a user made for the test.
	const password = "s3cret-pw-9f2c"
	user, url := e.Broker.User(t, e.URL(), password, ".*", ".*", ".*")
	e.Vars["REBOUND_AMQP_URL"] = url
	e.startInProcess()
	e.Vars["REBOUND_AMQP_URL"] = e.Broker.URLIn(e.vhost())
	e.rejectAll(e.App)
	const marker = "m4rk3r-from-a-message"
	e.publish(amqp.Publishing{MessageId: marker + "-id", Headers: amqp.Table{"x-retry-count": marker, "x-retry-error": marker}, Body: []byte(marker)})
	if parked := e.parked(1, 30*time.Second); len(parked) != 1 {
		t.Fatalf("parked %d, want 1", len(parked))
	}
	for _, path := range []string{"/metrics", "/readyz", "/healthz"} {
		resp, err := http.Get("http://" + e.http + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, secret := range []string{password, marker, user} {
			if strings.Contains(string(body), secret) {
				t.Errorf("%s serves %q", path, secret)
			}
		}
	}
}
