package headers

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The consumer's word: the error, the permanent mark and the Retry-After,
// as headers and as the AMQP 1.0 annotations RabbitMQ 4.x carries.

func TestDecodeRetryAfter(t *testing.T) {
	c := NewCodec(DefaultNames())
	now := testNow()
	for _, tc := range []struct {
		name    string
		h       amqp.Table
		want    time.Duration
		invalid bool
	}{
		{"absent", amqp.Table{}, 0, false},
		{"long ms", amqp.Table{"x-retry-after": int64(30000)}, 30 * time.Second, false},
		{"int32 ms", amqp.Table{"x-retry-after": int32(1500)}, 1500 * time.Millisecond, false},
		{"whole float", amqp.Table{"x-retry-after": 2500.0}, 2500 * time.Millisecond, false},
		{"decimal", amqp.Table{"x-retry-after": amqp.Decimal{Scale: 1, Value: 100}}, 10 * time.Millisecond, false},
		{"decimal string", amqp.Table{"x-retry-after": " 30000 "}, 30 * time.Second, false},
		{"float string", amqp.Table{"x-retry-after": "3e4"}, 30 * time.Second, false},
		{"RFC 3339 ahead", amqp.Table{"x-retry-after": now.Add(90 * time.Second).Format(time.RFC3339Nano)}, 90 * time.Second, false},
		{"RFC 3339 rounded up", amqp.Table{"x-retry-after": now.Add(1500 * time.Microsecond).Format(time.RFC3339Nano)}, 2 * time.Millisecond, false},
		{"RFC 3339 passed", amqp.Table{"x-retry-after": now.Add(-time.Minute).Format(time.RFC3339)}, 0, false},
		{"timestamp", amqp.Table{"x-retry-after": now.Add(time.Minute)}, time.Minute, false},
		{"annotation", amqp.Table{"x-opt-retry-after": int64(30000)}, 30 * time.Second, false},
		{"the header wins", amqp.Table{"x-retry-after": int64(1000), "x-opt-retry-after": int64(30000)}, time.Second, false},
		{"the header wins, unreadable", amqp.Table{"x-retry-after": "soon", "x-opt-retry-after": int64(30000)}, 0, true},
		{"negative", amqp.Table{"x-retry-after": int64(-1)}, 0, true},
		{"a fraction", amqp.Table{"x-retry-after": 0.5}, 0, true},
		{"too long", amqp.Table{"x-retry-after": maxRetryAfter.Milliseconds() + 1}, 0, true},
		{"too far ahead", amqp.Table{"x-retry-after": now.Add(maxRetryAfter + time.Hour).Format(time.RFC3339)}, 0, true},
		{"a word", amqp.Table{"x-retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0, true},
		{"huge text", amqp.Table{"x-retry-after": string(make([]byte, 10000))}, 0, true},
		{"a table", amqp.Table{"x-retry-after": amqp.Table{}}, 0, true},
		{"void", amqp.Table{"x-retry-after": nil}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, problems := c.Decode(tc.h, time.Time{}, now, nil)
			if s.RetryAfter != tc.want || s.RetryAfterInvalid != tc.invalid || (len(problems) > 0) != tc.invalid {
				t.Errorf("RetryAfter = %v, invalid %v, problems %v; want %v, invalid %v", s.RetryAfter, s.RetryAfterInvalid, problems, tc.want, tc.invalid)
			}
		})
	}
}

func TestDecodeConsumerWord(t *testing.T) {
	c := NewCodec(DefaultNames())
	for _, tc := range []struct {
		name         string
		h            amqp.Table
		err, opt     string
		stamp        int
		stamped      bool
		nonRetryable bool
		group        string
		problems     int
	}{
		{name: "none", h: amqp.Table{}},
		{name: "header", h: amqp.Table{"x-retry-error": "TimeoutError: db down"}, err: "TimeoutError: db down"},
		{name: "bytes", h: amqp.Table{"x-retry-error": []byte("TimeoutError")}, err: "TimeoutError"},
		{name: "annotation", h: amqp.Table{"x-opt-retry-error": "TimeoutError: db down"}, opt: "TimeoutError: db down"},
		{name: "both", h: amqp.Table{"x-retry-error": "old", "x-opt-retry-error": "new"}, err: "old", opt: "new"},
		{name: "stamped", h: amqp.Table{"x-retry-error": "e", "x-retry-error-retry": int64(3)}, err: "e", stamp: 3, stamped: true},
		{name: "replayed", h: amqp.Table{"x-retry-error": "e", "x-retry-error-retry": "-1"}, err: "e", stamp: replayedError, stamped: true},
		{name: "bad stamp", h: amqp.Table{"x-retry-error": "e", "x-retry-error-retry": int64(-7)}, err: "e", problems: 1},
		{name: "permanent annotation", h: amqp.Table{"x-opt-retry-non-retryable": true}, nonRetryable: true},
		{name: "the header wins", h: amqp.Table{"x-retry-non-retryable": false, "x-opt-retry-non-retryable": true}},
		{name: "bad annotation", h: amqp.Table{"x-opt-retry-non-retryable": "perhaps"}, problems: 1},
		{name: "group", h: amqp.Table{"x-retry-group": "0123456789ab"}, group: "0123456789ab"},
		{name: "forged group", h: amqp.Table{"x-retry-group": "../../etc"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, problems := c.Decode(tc.h, time.Time{}, testNow(), nil)
			if s.Error != tc.err || s.OptError != tc.opt || s.ErrorRetry != tc.stamp || s.ErrorStamped != tc.stamped ||
				s.NonRetryable != tc.nonRetryable || s.Group != tc.group || len(problems) != tc.problems {
				t.Errorf("got error %q, annotation %q, stamp %d/%v, non-retryable %v, group %q, problems %v", s.Error, s.OptError, s.ErrorRetry,
					s.ErrorStamped, s.NonRetryable, s.Group, problems)
			}
		})
	}
}

// TestOneAttemptsWord: a copy carries no Retry-After and no annotation,
// the group the caller decided, and the error with the retry count it was
// reported at when it was reported with this failure; otherwise the error
// and its stamp as they were.
func TestOneAttemptsWord(t *testing.T) {
	c := NewCodec(DefaultNames())
	now := testNow()
	h := amqp.Table{
		"x-retry-after": int64(30000), "x-opt-retry-after": int64(1), "x-opt-retry-error": "TimeoutError: db down",
		"x-opt-retry-non-retryable": false, "x-retry-error": "old", "x-retry-error-retry": int64(1), "tenant": "acme",
	}
	s, _ := c.Decode(h, time.Time{}, now, nil)
	s.Retries = 4
	for _, tc := range []struct {
		name      string
		current   bool
		text      string
		wantError string
		wantStamp int64
	}{
		{"the annotation, current", true, "TimeoutError: db down", "TimeoutError: db down", 4},
		{"an old error", false, "", "old", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := s
			st.ErrorCurrent, st.Group = tc.current, "0123456789ab"
			if tc.current {
				st.Error = tc.text
			}
			for what, out := range map[string]amqp.Table{"Retry": c.Retry(h, st, time.Second, now.Add(time.Second)), "Park": c.Park(h, st, "max-retries", now)} {
				for _, gone := range []string{"x-retry-after", "x-opt-retry-after", "x-opt-retry-error", "x-opt-retry-non-retryable"} {
					if v, ok := out[gone]; ok {
						t.Errorf("%s: %s = %v, want it removed", what, gone, v)
					}
				}
				if out["x-retry-error"] != tc.wantError || out["x-retry-error-retry"] != tc.wantStamp || out["x-retry-group"] != "0123456789ab" || out["tenant"] != "acme" {
					t.Errorf("%s: error %v, stamp %v, group %v, tenant %v; want %q, %d", what, out["x-retry-error"], out["x-retry-error-retry"],
						out["x-retry-group"], out["tenant"], tc.wantError, tc.wantStamp)
				}
			}
		})
	}
	if h["x-retry-after"] == nil || h["x-opt-retry-error"] == nil {
		t.Error("the writers changed the delivery's table")
	}
	out := c.Redirect(c.Park(h, s, "max-retries", now), "orders", "orders.repair", now)
	if out["x-retry-redirected-from"] != "orders" || out["x-retry-origin-queue"] != "orders.repair" || out["x-retry-error-retry"] != int64(replayedError) ||
		out["x-retry-group"] != nil {
		t.Errorf("Redirect = %v", out)
	}
}
