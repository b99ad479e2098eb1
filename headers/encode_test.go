package headers

import (
	"fmt"
	"math"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/policy"
)

// junk is a table of valid AMQP types that are not valid retry state.
func junk() amqp.Table {
	return amqp.Table{
		"x-retry-count":         "many",
		"x-task-started-at":     float32(math.NaN()),
		"x-retry-last-delay-ms": int64(-1),
		"x-retry-origin-queue":  int16(5),
		"x-retry-non-retryable": "perhaps",
		"x-retry-parked-reason": []byte{1},
		"x-retry-parked-at":     amqp.Decimal{Scale: 1, Value: 1},
		"x-death":               "not an array",
		"x-first-death-queue":   "orders",
		"CC":                    []any{"payments"},
		"BCC":                   []any{"payments"},
		"x-retry-error":         amqp.Table{"code": int8(-1)},
		"app-bytes":             []byte{0, 1, 2},
		"app-void":              nil,
		"app-float":             math.Inf(-1),
	}
}

// rebounds are the headers rebound owns; everything else is the
// application's and must come out as it went in.
func rebounds() map[string]bool {
	n := DefaultNames()
	return map[string]bool{
		n.RetryCount: true, n.TaskStartedAt: true, n.LastDelay: true, n.OriginQueue: true,
		n.NonRetryable: true, n.ParkedReason: true, n.ParkedAt: true,
		n.FirstDeathReason: true, n.FirstDeathQueue: true, n.Policy: true, n.DueAt: true,
		n.RetryAfter: true, n.ErrorRetry: true, n.Group: true, n.OptNonRetryable: true, n.OptRetryAfter: true, n.OptError: true,
	}
}

// broker reports whether a header is one the broker writes, which no copy
// carries.
func broker(name string) bool {
	for _, b := range brokerHeaders {
		if b == name {
			return true
		}
	}
	return false
}

// checkCopy checks what every writer promises: h unchanged, the result
// valid AMQP, every application header kept with its exact type, none of
// the broker's dead-letter and delivery headers, rebound's numbers written
// as int64, and nothing rebound owns left unreadable.
func checkCopy(t *testing.T, h, out amqp.Table, before string, now time.Time) {
	t.Helper()
	if after := fmt.Sprint(h); after != before {
		t.Errorf("input modified:\nbefore %s\n after %s", before, after)
	}
	if err := out.Validate(); err != nil {
		t.Errorf("output does not validate: %v", err)
	}
	own := rebounds()
	for k, v := range h {
		if own[k] {
			continue
		}
		if broker(k) {
			if _, ok := out[k]; ok {
				t.Errorf("the copy carries the broker's %s header", k)
			}
			continue
		}
		w, ok := out[k]
		if !ok || fmt.Sprintf("%T %v", v, v) != fmt.Sprintf("%T %v", w, w) {
			t.Errorf("application header %s = %T %v, want %T %v", k, w, w, v, v)
		}
	}
	n := DefaultNames()
	for _, k := range []string{n.RetryCount, n.TaskStartedAt, n.LastDelay, n.ParkedAt} {
		if v, ok := out[k]; ok {
			if _, ok := v.(int64); !ok {
				t.Errorf("%s written as %T, want int64", k, v)
			}
		}
	}
	_, problems := NewCodec(n).Decode(out, time.Time{}, now, nil)
	for _, p := range problems {
		if own[p.Header] {
			t.Errorf("the copy carries an unreadable header: %v", p)
		}
	}
}

func TestRetry(t *testing.T) {
	c := NewCodec(DefaultNames())
	h := deadLettered()
	before := fmt.Sprint(h)
	s, _ := c.Decode(h, time.Time{}, testNow(), nil)

	out := c.Retry(h, s, 2500*time.Millisecond+300*time.Microsecond, time.Time{})
	checkCopy(t, h, out, before, testNow())
	want := amqp.Table{
		"x-retry-count":              int64(1),
		"x-task-started-at":          int64(testNowMs/1000-30) * 1000, // the x-death time
		"x-retry-last-delay-ms":      int64(2500),
		"x-retry-origin-queue":       "orders",
		"x-retry-first-death-reason": "rejected",
		"x-retry-first-death-queue":  "orders",
	}
	for k, v := range want {
		if out[k] != v {
			t.Errorf("%s = %T %v, want %T %v", k, out[k], out[k], v, v)
		}
	}
	// The application's five headers and rebound's; none of the broker's
	// four (x-death, x-first-death-exchange, -queue, -reason).
	if len(out) != len(h)-4+len(want) {
		t.Errorf("out has %d headers, want %d: %v", len(out), len(h)-4+len(want), out)
	}

	again, problems := c.Decode(out, time.Time{}, testNow(), nil)
	if len(problems) != 0 {
		t.Errorf("problems = %v", problems)
	}
	wantState := s
	wantState.Retries = 1
	wantState.LastDelay = 2500 * time.Millisecond
	wantState.LastDeathQueue = "" // no x-death on a copy
	if again != wantState {
		t.Errorf("decoded copy = %+v, want %+v", again, wantState)
	}
}

func TestRetryRewritesOwnHeaders(t *testing.T) {
	c := NewCodec(DefaultNames())
	h := junk()
	before := fmt.Sprint(h)
	s, problems := c.Decode(h, time.Time{}, testNow(), nil)
	if len(problems) != 6 {
		t.Errorf("problems = %v, want 6", problems)
	}
	if s.Origin != "orders" {
		t.Fatalf("Origin = %q, want the x-first-death-queue", s.Origin)
	}
	out := c.Retry(h, s, time.Second, time.Time{})
	checkCopy(t, h, out, before, testNow())
	if out["x-retry-non-retryable"] != false {
		t.Errorf("non-retryable = %T %v, want false", out["x-retry-non-retryable"], out["x-retry-non-retryable"])
	}
	for _, k := range []string{"x-retry-parked-reason", "x-retry-parked-at"} {
		if _, ok := out[k]; ok {
			t.Errorf("%s kept on a retried copy", k)
		}
	}
}

func TestRetryEdges(t *testing.T) {
	c := NewCodec(DefaultNames())
	started := testNow().Add(-time.Hour)
	tests := []struct {
		name  string
		h     amqp.Table
		s     State
		delay time.Duration
		check func(t *testing.T, out amqp.Table)
	}{
		{"nil table", nil, State{Origin: "orders"}, time.Second, func(t *testing.T, out amqp.Table) {
			if len(out) != 4 || out["x-retry-origin-queue"] != "orders" {
				t.Errorf("out = %v", out)
			}
		}},
		{"negative delay written as 0", nil, State{}, -time.Second, func(t *testing.T, out amqp.Table) {
			if out["x-retry-last-delay-ms"] != int64(0) {
				t.Errorf("last delay = %v", out["x-retry-last-delay-ms"])
			}
		}},
		{"huge delay capped", nil, State{}, 100 * 24 * time.Hour, func(t *testing.T, out amqp.Table) {
			if out["x-retry-last-delay-ms"] != MaxLastDelay.Milliseconds() {
				t.Errorf("last delay = %v", out["x-retry-last-delay-ms"])
			}
		}},
		{"count capped", nil, stateWith(MaxRetryCount, started), time.Second, func(t *testing.T, out amqp.Table) {
			if out["x-retry-count"] != int64(MaxRetryCount) {
				t.Errorf("count = %v", out["x-retry-count"])
			}
		}},
		{"unknown origin drops an unreadable header", amqp.Table{"x-retry-origin-queue": ""}, State{}, time.Second, func(t *testing.T, out amqp.Table) {
			if _, ok := out["x-retry-origin-queue"]; ok {
				t.Errorf("origin = %q", out["x-retry-origin-queue"])
			}
		}},
		{"unknown origin keeps a readable header", amqp.Table{"x-retry-origin-queue": []byte("orders")}, State{}, time.Second, func(t *testing.T, out amqp.Table) {
			if string(out["x-retry-origin-queue"].([]byte)) != "orders" {
				t.Errorf("origin = %v", out["x-retry-origin-queue"])
			}
		}},
		{"non-retryable absent stays absent", amqp.Table{}, State{}, time.Second, func(t *testing.T, out amqp.Table) {
			if _, ok := out["x-retry-non-retryable"]; ok {
				t.Error("non-retryable added")
			}
		}},
		{"non-retryable written as a boolean", amqp.Table{"x-retry-non-retryable": "yes"}, nonRetryable(), time.Second, func(t *testing.T, out amqp.Table) {
			if out["x-retry-non-retryable"] != true {
				t.Errorf("non-retryable = %T %v", out["x-retry-non-retryable"], out["x-retry-non-retryable"])
			}
		}},
		{"sub-millisecond start truncated", nil, stateWith(0, started.Add(999*time.Microsecond)), time.Second, func(t *testing.T, out amqp.Table) {
			if out["x-task-started-at"] != started.UnixMilli() {
				t.Errorf("start = %v", out["x-task-started-at"])
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := fmt.Sprint(tt.h)
			out := c.Retry(tt.h, tt.s, tt.delay, time.Time{})
			if fmt.Sprint(tt.h) != before {
				t.Error("input modified")
			}
			if err := out.Validate(); err != nil {
				t.Error(err)
			}
			tt.check(t, out)
		})
	}
}

func stateWith(retries int, started time.Time) State {
	var s State
	s.Retries = retries
	s.StartedAt = started
	return s
}

func nonRetryable() State {
	var s State
	s.NonRetryable = true
	return s
}

func TestPark(t *testing.T) {
	c := NewCodec(DefaultNames())
	h := deadLettered()
	h["x-retry-count"] = int32(10)
	h["x-task-started-at"] = testNowMs - 3_600_000
	h["x-retry-last-delay-ms"] = "8000"
	h["x-retry-non-retryable"] = "0"
	before := fmt.Sprint(h)
	s, problems := c.Decode(h, time.Time{}, testNow(), nil)
	if len(problems) != 0 {
		t.Fatalf("problems = %v", problems)
	}
	at := testNow().Add(1500 * time.Microsecond)
	out := c.Park(h, s, policy.MaxRetries, at)
	checkCopy(t, h, out, before, testNow())
	want := amqp.Table{
		"x-retry-count":         int64(10),
		"x-task-started-at":     int64(testNowMs - 3_600_000),
		"x-retry-last-delay-ms": int64(8000),
		"x-retry-non-retryable": false,
		"x-retry-origin-queue":  "orders",
		"x-retry-parked-reason": "max-retries",
		"x-retry-parked-at":     int64(testNowMs + 1),
	}
	for k, v := range want {
		if out[k] != v {
			t.Errorf("%s = %T %v, want %T %v", k, out[k], out[k], v, v)
		}
	}
	wantState := s
	wantState.LastDeathQueue = "" // no x-death on a copy
	if again, _ := c.Decode(out, time.Time{}, testNow(), nil); again != wantState {
		t.Errorf("decoded parked copy = %+v, want %+v", again, wantState)
	}
	reason, parkedAt, ok := c.Parked(out)
	if !ok || reason != policy.MaxRetries || !parkedAt.Equal(testNow().Add(time.Millisecond)) {
		t.Errorf("Parked = %q, %v, %v", reason, parkedAt, ok)
	}
}

func TestParkUnknownOrigin(t *testing.T) {
	c := NewCodec(DefaultNames())
	h := amqp.Table{"x-retry-origin-queue": "", "payload-kind": "invoice"}
	before := fmt.Sprint(h)
	s, _ := c.Decode(h, time.Time{}, testNow(), nil)
	out := c.Park(h, s, policy.UnknownOrigin, testNow())
	checkCopy(t, h, out, before, testNow())
	if _, ok := out["x-retry-origin-queue"]; ok {
		t.Errorf("origin = %q, want none", out["x-retry-origin-queue"])
	}
	if _, ok := out["x-retry-last-delay-ms"]; ok {
		t.Error("last delay added")
	}
	if out["x-retry-parked-reason"] != "unknown-origin" {
		t.Errorf("reason = %v", out["x-retry-parked-reason"])
	}
}

func TestParkedUnreadable(t *testing.T) {
	c := NewCodec(DefaultNames())
	for _, h := range []amqp.Table{nil, {}, {"x-retry-parked-reason": ""}, {"x-retry-parked-reason": int64(1)}} {
		if reason, at, ok := c.Parked(h); ok || reason != "" || !at.IsZero() {
			t.Errorf("Parked(%v) = %q, %v, %v", h, reason, at, ok)
		}
	}
	if reason, at, ok := c.Parked(amqp.Table{"x-retry-parked-reason": "non-retryable", "x-retry-parked-at": "junk"}); !ok || reason != policy.NonRetryable || !at.IsZero() {
		t.Errorf("Parked = %q, %v, %v", reason, at, ok)
	}
}

func TestReplay(t *testing.T) {
	c := NewCodec(DefaultNames())
	h := deadLettered()
	s, _ := c.Decode(h, time.Time{}, testNow(), nil)
	s.Retries = 4
	s.NonRetryable = true
	s.LastDelay = time.Minute
	s.Policy = "orders:0badcafe"
	parked := c.Park(c.Retry(h, s, time.Minute, testNow().Add(time.Minute)), s, policy.NonRetryable, testNow())
	before := fmt.Sprint(parked)

	later := testNow().Add(48 * time.Hour)
	out := c.Replay(parked, "orders", later)
	checkCopy(t, parked, out, before, later)
	for _, k := range []string{"x-retry-count", "x-retry-last-delay-ms", "x-retry-parked-reason", "x-retry-parked-at",
		"x-retry-non-retryable", "x-retry-first-death-reason", "x-retry-first-death-queue", "x-death", "x-first-death-queue",
		"x-retry-policy", "x-retry-due-at"} {
		if _, ok := out[k]; ok {
			t.Errorf("%s kept: %v", k, out[k])
		}
	}
	if out["x-task-started-at"] != later.UnixMilli() || out["x-retry-origin-queue"] != "orders" {
		t.Errorf("start = %v, origin = %v", out["x-task-started-at"], out["x-retry-origin-queue"])
	}
	for _, k := range []string{"x-retry-error", "tenant"} {
		if _, ok := out[k]; !ok {
			t.Errorf("%s dropped", k)
		}
	}
	got, problems := c.Decode(out, time.Time{}, later, nil)
	want := State{Origin: "orders", Error: "payment gateway timeout", ErrorRetry: replayedError, ErrorStamped: true}
	want.StartedAt = later
	if got != want || len(problems) != 0 {
		t.Errorf("replayed state = %+v (%v), want %+v", got, problems, want)
	}
}

// The replay goes where the caller decided, whatever the parked copy's
// header says: the header is rewritten to match.
func TestReplayOrigin(t *testing.T) {
	c := NewCodec(DefaultNames())
	for _, header := range []any{"orders", []byte("payments"), "", int64(1), nil} {
		h := amqp.Table{}
		if header != nil {
			h["x-retry-origin-queue"] = header
		}
		if got := c.Replay(h, "orders", testNow())["x-retry-origin-queue"]; got != "orders" {
			t.Errorf("header %#v: origin = %T %v, want orders", header, got, got)
		}
	}
}

// TestWritersValidateWithJunk covers the promise that the output passes
// Validate whenever the input did, whatever valid types the input holds.
func TestWritersValidateWithJunk(t *testing.T) {
	c := NewCodec(DefaultNames())
	h := junk()
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	before := fmt.Sprint(h)
	s, _ := c.Decode(h, time.Time{}, testNow(), nil)
	checkCopy(t, h, c.Retry(h, s, time.Second, time.Time{}), before, testNow())
	checkCopy(t, h, c.Park(h, s, "max-duration", testNow()), before, testNow())
	checkCopy(t, h, c.Replay(h, "orders", testNow()), before, testNow())
}

// TestPolicyAndDueAt: a delayed copy says which policy decided and when
// its delay ends; an immediate retry carries no due time, a parked copy
// neither, and none of them the legacy routing header.
func TestPolicyAndDueAt(t *testing.T) {
	c := NewCodec(DefaultNames())
	h := amqp.Table{"rebound-delay-ms": int64(1000), "x-retry-due-at": int64(1), "x-retry-policy": "older:00000000", "tenant": "acme"}
	s, _ := c.Decode(h, time.Time{}, testNow(), nil)
	if s.Policy != "older:00000000" {
		t.Errorf("decoded policy %q", s.Policy)
	}
	s.Policy = "payments:1234abcd"
	due := testNow().Add(1500 * time.Millisecond)
	for _, tc := range []struct {
		name   string
		out    amqp.Table
		policy any
		due    any // nil: absent
	}{
		{"delayed", c.Retry(h, s, 1500*time.Millisecond, due), "payments:1234abcd", due.UnixMilli()},
		{"immediate", c.Retry(h, s, 0, time.Time{}), "payments:1234abcd", nil},
		{"parked", c.Park(h, s, policy.MaxRetries, testNow()), "payments:1234abcd", nil},
	} {
		if tc.out["x-retry-policy"] != tc.policy || tc.out["x-retry-due-at"] != tc.due {
			t.Errorf("%s: policy %#v, due %#v; want %#v, %#v", tc.name, tc.out["x-retry-policy"], tc.out["x-retry-due-at"], tc.policy, tc.due)
		}
		if _, ok := tc.out["rebound-delay-ms"]; ok {
			t.Errorf("%s: the legacy routing header is kept", tc.name)
		}
		back, problems := c.Decode(tc.out, time.Time{}, testNow(), nil)
		if len(problems) != 0 || back.Policy != tc.policy {
			t.Errorf("%s: decoded back as policy %q, %v", tc.name, back.Policy, problems)
		}
		if tc.due != nil && !back.DueAt.Equal(due.Truncate(time.Millisecond)) {
			t.Errorf("%s: due decoded back as %v, want %v", tc.name, back.DueAt, due)
		}
	}
}

// TestMovedKeepsAllButTheBrokersHeaders: a copy an operator moves keeps
// every header but those RabbitMQ owns, and its due time is the one given
// (none for a copy sent back at once).
func TestMovedKeepsAllButTheBrokersHeaders(t *testing.T) {
	c := NewCodec(DefaultNames())
	due := time.UnixMilli(1_700_000_000_000)
	h := amqp.Table{"app": "kept", c.Names.RetryCount: int64(2), c.Names.DueAt: int64(1), XDeath: []any{}, "x-delivery-count": int64(3), "CC": []any{"elsewhere"}}
	for _, tc := range []struct {
		due  time.Time
		want any
	}{{due, due.UnixMilli()}, {time.Time{}, nil}} {
		got := c.Moved(h, tc.due)
		if got["app"] != "kept" || got[c.Names.RetryCount] != int64(2) || got[c.Names.DueAt] != tc.want {
			t.Errorf("due %v: %v", tc.due, got)
		}
		for name := range got {
			if BrokerOwned(name) {
				t.Errorf("due %v: the broker's header %s kept", tc.due, name)
			}
		}
	}
	if h["x-delivery-count"] != int64(3) {
		t.Error("Moved changed the headers it was given")
	}
	for name, want := range map[string]bool{XDeath: true, "x-first-death-exchange": true, "x-last-death-queue": true, "CC": true, c.Names.RetryCount: false, "app": false} {
		if BrokerOwned(name) != want {
			t.Errorf("BrokerOwned(%q) = %v, want %v", name, !want, want)
		}
	}
}

// TestHoldTables: a copy bound for the hold queue carries its non-x table
// and array headers once more in HeldTables, and only those; a copy with
// none an empty one; every writer drops the one a copy came with, so it
// never travels on stale.
func TestHoldTables(t *testing.T) {
	tenant := amqp.Table{"id": int32(7), "tags": []any{"a", int64(2)}}
	for _, tc := range []struct {
		name string
		h    amqp.Table
		want amqp.Table // HeldTables
	}{
		{"none", amqp.Table{"plain": "s", "n": int64(1)}, amqp.Table{}},
		{"nil", nil, amqp.Table{}},
		{"x- tables stay annotations", amqp.Table{"x-nested": amqp.Table{"a": "b"}, "x-arr": []any{int64(1)}}, amqp.Table{}},
		{"table and array", amqp.Table{"tenant": tenant, "arr": []any{"x"}, "plain": "s", "x-arr": []any{int64(1)}},
			amqp.Table{"tenant": tenant, "arr": []any{"x"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := amqp.Table{}
			for k, v := range tc.h {
				h[k] = v
			}
			HoldTables(h)
			got, ok := h[HeldTables].(amqp.Table)
			if !ok || fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("HeldTables = %v, want %v", got, tc.want)
			}
			c := NewCodec(DefaultNames())
			s, _ := c.Decode(h, time.Time{}, time.Now(), nil)
			if out := c.Retry(h, s, time.Second, time.Now()); out[HeldTables] != nil {
				t.Errorf("Retry kept HeldTables %v", out[HeldTables])
			}
			if out := c.Park(h, s, policy.MaxRetries, time.Now()); out[HeldTables] != nil {
				t.Errorf("Park kept HeldTables %v", out[HeldTables])
			}
		})
	}
}
