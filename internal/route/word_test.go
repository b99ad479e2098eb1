package route

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/group"
	"github.com/rebound-mq/rebound/policy"
)

// TestReported: which error a failure is filed under, as the broker and
// the consumers deliver it.
func TestReported(t *testing.T) {
	r := testRouter(nil)
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	rejectedFrom := func(q string) []any {
		return []any{amqp.Table{"queue": q, "reason": "rejected", "count": int64(1), "time": now.Add(-time.Second)}}
	}
	for _, tc := range []struct {
		name string
		h    amqp.Table
		want string
		ok   bool
	}{
		{"no error", amqp.Table{headers.XDeath: rejectedFrom("orders"), "x-retry-count": int64(2)}, "", false},
		{"first report, republished", amqp.Table{"x-retry-error": "E1", "x-retry-origin-queue": "orders"}, "E1", true},
		{"first report, unstamped, rejected", amqp.Table{"x-retry-error": "E1", headers.XDeath: rejectedFrom("orders")}, "E1", true},
		{"an old error on a plain rejection", amqp.Table{"x-retry-error": "E1", "x-retry-error-retry": int64(0), "x-retry-count": int64(1),
			headers.XDeath: rejectedFrom("orders")}, "", false},
		{"an error from before a replay", amqp.Table{"x-retry-error": "E1", "x-retry-error-retry": int64(-1),
			headers.XDeath: rejectedFrom("orders")}, "", false},
		{"republished after a delay with the old stamp copied", amqp.Table{"x-retry-error": "E2", "x-retry-error-retry": int64(0), "x-retry-count": int64(1),
			"x-retry-origin-queue": "orders", headers.XDeath: rejectedFrom("delay.1000")}, "E2", true},
		{"republished after an immediate retry", amqp.Table{"x-retry-error": "E2", "x-retry-error-retry": int64(0), "x-retry-count": int64(1),
			"x-retry-origin-queue": "orders"}, "E2", true},
		{"stamped by the consumer for this retry", amqp.Table{"x-retry-error": "E2", "x-retry-error-retry": int64(1), "x-retry-count": int64(1),
			headers.XDeath: rejectedFrom("orders")}, "E2", true},
		{"an annotation", amqp.Table{"x-opt-retry-error": "A1", headers.XDeath: rejectedFrom("orders")}, "A1", true},
		{"an annotation over an old header", amqp.Table{"x-opt-retry-error": "A2", "x-retry-error": "A1", "x-retry-error-retry": int64(0),
			"x-retry-count": int64(1), headers.XDeath: rejectedFrom("orders")}, "A2", true},
		{"the header over an annotation, both current", amqp.Table{"x-opt-retry-error": "A1", "x-retry-error": "E1", "x-retry-origin-queue": "orders"}, "E1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := r.Codec.Decode(tc.h, time.Time{}, now, nil)
			got, ok := r.reported(s)
			if got != tc.want || ok != tc.ok {
				t.Errorf("Reported = %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
			// What the copy says: the group of that error, or of the
			// origin and "retry".
			o := r.CheckOrigin(s.Origin, s.ClaimedOrigin)
			rt := r.Decide(s, o, true, now, nil)
			_, msg := r.Plan(amqp.Delivery{Headers: tc.h}, s, rt, now)
			if want := group.Of("orders", tc.want, group.Retry); msg.Headers["x-retry-group"] != want {
				t.Errorf("group %v, want %s", msg.Headers["x-retry-group"], want)
			}
			if tc.ok && (msg.Headers["x-retry-error"] != tc.want || msg.Headers["x-retry-error-retry"] != int64(s.Retries)) {
				t.Errorf("copy error %v at %v, want %q at %d", msg.Headers["x-retry-error"], msg.Headers["x-retry-error-retry"], tc.want, s.Retries)
			}
			if _, ok := msg.Headers["x-opt-retry-error"]; ok {
				t.Error("the copy carries the annotation")
			}
		})
	}
}

func TestRetryAfterOutcome(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    headers.State
		d    policy.Decision
		want string
	}{
		{"none", headers.State{}, policy.Decision{Retry: true, Drawn: time.Second}, ""},
		{"applied", headers.State{State: policy.State{RetryAfter: time.Second}}, policy.Decision{Retry: true, Drawn: time.Second}, retryAfterApplied},
		{"capped", headers.State{State: policy.State{RetryAfter: time.Hour}}, policy.Decision{Retry: true, Drawn: time.Minute}, retryAfterCapped},
		{"parked", headers.State{State: policy.State{RetryAfter: time.Hour}}, policy.Decision{Reason: policy.MaxRetries}, ""},
		{"invalid", headers.State{RetryAfterInvalid: true}, policy.Decision{Retry: true}, retryAfterInvalid},
	} {
		if got := RetryAfter(tc.s, tc.d); got != tc.want {
			t.Errorf("%s: RetryAfter = %q, want %q", tc.name, got, tc.want)
		}
	}
}
