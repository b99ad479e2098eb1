package headers

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// testNowMs is the clock every test decodes with: 2025-06-01T12:00:00Z.
const testNowMs = 1748779200000

func testNow() time.Time { return time.UnixMilli(testNowMs).UTC() }

func decode(h amqp.Table) (State, []Problem) {
	return NewCodec(DefaultNames()).Decode(h, time.Time{}, testNow(), nil)
}

// wantProblem checks that problems name exactly the given header (or none
// when header is ""), and that the reason says what was wrong.
func wantProblem(t *testing.T, problems []Problem, header, reason string) {
	t.Helper()
	if header == "" {
		if len(problems) != 0 {
			t.Errorf("problems = %v, want none", problems)
		}
		return
	}
	if len(problems) != 1 || problems[0].Header != header || !strings.Contains(problems[0].Reason, reason) {
		t.Errorf("problems = %v, want one for %s containing %q", problems, header, reason)
	}
}

// headerValueCase is one value a header may hold and what decoding it as
// the only header should give.
type headerValueCase[T any] struct {
	name    string
	value   any
	want    T
	problem string // part of the reason; "" for none
}

// testHeaderValues decodes each case's value as the only header, under
// name, and checks the problem it reports; check compares the field the
// header sets with the case's want.
func testHeaderValues[T any](t *testing.T, name string, tests []headerValueCase[T], check func(t *testing.T, s State, want T)) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, problems := decode(amqp.Table{name: tt.value})
			check(t, s, tt.want)
			if tt.problem == "" {
				wantProblem(t, problems, "", "")
			} else {
				wantProblem(t, problems, name, tt.problem)
			}
		})
	}
}

func TestDecodeRetryCount(t *testing.T) {
	const name = "x-retry-count"
	tests := []headerValueCase[int]{
		{"int8", int8(3), 3, ""},
		{"int16", int16(3), 3, ""},
		{"int32", int32(3), 3, ""},
		{"int64", int64(3), 3, ""},
		{"uint8", uint8(3), 3, ""},
		{"uint16", uint16(3), 3, ""},
		{"uint32", uint32(3), 3, ""},
		{"go int", 3, 3, ""},
		{"go uint", uint(3), 3, ""},
		{"go uint64", uint64(3), 3, ""},
		{"zero", int64(0), 0, ""},
		{"limit", int64(MaxRetryCount), MaxRetryCount, ""},
		{"float32", float32(3), 3, ""},
		{"float64", float64(3), 3, ""},
		{"string", "3", 3, ""},
		{"string with spaces", " 3\n", 3, ""},
		{"string with plus", "+3", 3, ""},
		{"string float", "3.0", 3, ""},
		{"string exponent", "1e2", 100, ""},
		{"bytes", []byte("3"), 3, ""},
		{"decimal", amqp.Decimal{Scale: 0, Value: 3}, 3, ""},
		{"decimal scaled", amqp.Decimal{Scale: 2, Value: 300}, 3, ""},
		{"decimal zero, huge scale", amqp.Decimal{Scale: 200, Value: 0}, 0, ""},
		{"void", nil, 0, ""},

		{"negative", int32(-1), 0, "negative"},
		{"negative string", "-2", 0, "negative"},
		{"above limit", int64(MaxRetryCount + 1), 0, "above 1000000"},
		{"huge uint64", uint64(math.MaxUint64), 0, "out of range"},
		{"fraction", 2.5, 0, "not a whole number"},
		{"NaN", math.NaN(), 0, "not a finite number"},
		{"Inf", float32(math.Inf(1)), 0, "not a finite number"},
		{"huge float", 1e300, 0, "out of range"},
		{"string fraction", "2.5", 0, "not a whole number"},
		{"string words", "three", 0, "not a decimal number"},
		{"string hex", "0x10", 0, "not a decimal number"},
		{"string Inf", "Inf", 0, "not a decimal number"},
		{"string overflow", "99999999999999999999", 0, "out of range"},
		{"empty string", "  ", 0, "empty string"},
		{"decimal fraction", amqp.Decimal{Scale: 1, Value: 25}, 0, "not a whole number"},
		{"decimal tiny", amqp.Decimal{Scale: 12, Value: 5}, 0, "not a whole number"},
		{"bool", true, 0, "not a number"},
		{"timestamp", testNow(), 0, "not a number"},
		{"array", []any{int64(1)}, 0, "not a number"},
		{"table", amqp.Table{"n": int64(1)}, 0, "not a number"},
	}
	testHeaderValues(t, name, tests, func(t *testing.T, s State, want int) {
		if s.Retries != want {
			t.Errorf("Retries = %d, want %d", s.Retries, want)
		}
	})
}

func TestDecodeTaskStart(t *testing.T) {
	const name = "x-task-started-at"
	start := time.Date(2025, 6, 1, 11, 0, 0, 0, time.UTC)
	startMs := start.UnixMilli()
	tests := []headerValueCase[time.Time]{
		{"int64 ms", startMs, start, ""},
		{"uint64 ms", uint64(startMs), start, ""},
		{"go int ms", int(startMs), start, ""},
		{"float64 ms", float64(startMs), start, ""},
		{"string ms", " 1748775600000 ", start, ""},
		{"bytes ms", []byte("1748775600000"), start, ""},
		{"ms precision", startMs + 123, start.Add(123 * time.Millisecond), ""},
		{"timestamp", start.Local(), start, ""},
		{"RFC 3339", "2025-06-01T11:00:00Z", start, ""},
		{"RFC 3339 fraction", "2025-06-01T11:00:00.250Z", start.Add(250 * time.Millisecond), ""},
		{"RFC 3339 offset", "2025-06-01T13:00:00+02:00", start, ""},
		{"in the future within skew", testNowMs + 4*60_000, testNow().Add(4 * time.Minute), ""},

		// Invalid starts fall back to now here: no timestamp, no x-death.
		{"too far in the future", testNowMs + 6*60_000, testNow(), "more than 5m0s in the future"},
		{"future RFC 3339", "2030-01-01T00:00:00Z", testNow(), "in the future"},
		{"future timestamp", testNow().Add(time.Hour), testNow(), "in the future"},
		{"before 2000", int64(900_000_000_000), testNow(), "before 2000-01-01"},
		{"seconds", testNowMs / 1000, testNow(), "Unix seconds instead of milliseconds"},
		{"int32 cannot hold ms", int32(1_700_000_000), testNow(), "Unix seconds"},
		{"zero", int64(0), testNow(), "before 2000-01-01"},
		{"negative", int64(-1), testNow(), "before 2000-01-01"},
		{"old timestamp", time.Unix(0, 0), testNow(), "before 2000-01-01"},
		{"old RFC 3339", "1999-12-31T23:59:59Z", testNow(), "before 2000-01-01"},
		{"fraction", float64(startMs) + 0.5, testNow(), "not a whole number"},
		{"not a time", "yesterday", testNow(), "neither Unix milliseconds nor RFC 3339"},
		{"RFC 3339 without zone", "2025-06-01T11:00:00", testNow(), "neither"},
		{"digits overflow", "99999999999999999999", testNow(), "out of range"},
		{"bool", false, testNow(), "not a number"},
	}
	testHeaderValues(t, name, tests, func(t *testing.T, s State, want time.Time) {
		if !s.StartedAt.Equal(want) {
			t.Errorf("StartedAt = %v, want %v", s.StartedAt, want)
		}
		if s.StartedAt.Location() != time.UTC {
			t.Errorf("StartedAt is in %v, want UTC", s.StartedAt.Location())
		}
	})
}

// death builds an x-death entry as RabbitMQ writes it.
func death(queue, reason string, at time.Time, count int64) amqp.Table {
	return amqp.Table{
		"count": count, "reason": reason, "queue": queue, "time": at.Local(),
		"exchange": "orders", "routing-keys": []any{"order.created"},
	}
}

func TestDecodeTaskStartFallbacks(t *testing.T) {
	t0 := time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC)
	t1 := t0.Add(10 * time.Minute)
	stamp := t0.Add(30 * time.Minute)
	// RabbitMQ moves an entry to the front when the same queue dead-letters
	// the message again, and keeps the entry's first time, so the oldest
	// time can be anywhere in the array.
	deaths := []any{death("orders", "rejected", t0, 2), death("rebound.delay.1000", "expired", t1, 1)}
	valid := int64(testNowMs - 1000)

	tests := []struct {
		name      string
		h         amqp.Table
		timestamp time.Time
		want      time.Time
		problems  int
	}{
		{"header wins over everything", amqp.Table{"x-task-started-at": valid, "x-death": deaths}, stamp, time.UnixMilli(valid), 0},
		{"timestamp when header absent", amqp.Table{"x-death": deaths}, stamp, stamp, 0},
		{"timestamp when header invalid", amqp.Table{"x-task-started-at": "junk", "x-death": deaths}, stamp, stamp, 1},
		{"oldest x-death time when no timestamp", amqp.Table{"x-death": deaths}, time.Time{}, t0, 0},
		{"x-death when timestamp in the future", amqp.Table{"x-death": deaths}, testNow().Add(time.Hour), t0, 0},
		{"timestamp within skew", nil, testNow().Add(time.Minute), testNow().Add(time.Minute), 0},
		{"x-death when timestamp before 2000", amqp.Table{"x-death": deaths}, time.Unix(0, 0), t0, 0},
		{"x-death skips entries with bad times", amqp.Table{"x-death": []any{
			death("orders", "rejected", t1, 1), amqp.Table{"queue": "older", "time": "junk"},
		}}, time.Time{}, t1, 1},
		{"x-death ignores future times", amqp.Table{"x-death": []any{
			death("orders", "rejected", t1, 1), death("elsewhere", "rejected", testNow().Add(time.Hour), 1),
		}}, time.Time{}, t1, 1},
		{"now when nothing else", amqp.Table{"app": "x"}, time.Time{}, testNow(), 0},
		{"now for a nil table", nil, time.Time{}, testNow(), 0},
		{"now when x-death has no usable time", amqp.Table{"x-death": []any{amqp.Table{"queue": "orders"}}}, time.Time{}, testNow(), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, problems := NewCodec(DefaultNames()).Decode(tt.h, tt.timestamp, testNow(), nil)
			if !s.StartedAt.Equal(tt.want) {
				t.Errorf("StartedAt = %v, want %v", s.StartedAt, tt.want)
			}
			if len(problems) != tt.problems {
				t.Errorf("problems = %v, want %d", problems, tt.problems)
			}
		})
	}
}

func TestDecodeMaxFutureSkew(t *testing.T) {
	c := NewCodec(DefaultNames())
	c.MaxFutureSkew = time.Hour
	h := amqp.Table{"x-task-started-at": testNowMs + 30*60_000}
	if s, problems := c.Decode(h, time.Time{}, testNow(), nil); len(problems) != 0 || !s.StartedAt.Equal(testNow().Add(30*time.Minute)) {
		t.Errorf("with a 1h skew: StartedAt = %v, problems = %v", s.StartedAt, problems)
	}
	c.MaxFutureSkew = 0
	if s, problems := c.Decode(h, time.Time{}, testNow(), nil); len(problems) != 1 || !s.StartedAt.Equal(testNow()) {
		t.Errorf("with no skew: StartedAt = %v, problems = %v", s.StartedAt, problems)
	}
}

func TestDecodeLastDelay(t *testing.T) {
	const name = "x-retry-last-delay-ms"
	tests := []headerValueCase[time.Duration]{
		{"int64", int64(1500), 1500 * time.Millisecond, ""},
		{"int32", int32(1500), 1500 * time.Millisecond, ""},
		{"uint16", uint16(1500), 1500 * time.Millisecond, ""},
		{"float64", 1500.0, 1500 * time.Millisecond, ""},
		{"string", "1500", 1500 * time.Millisecond, ""},
		{"zero", int64(0), 0, ""},
		{"limit", MaxLastDelay.Milliseconds(), MaxLastDelay, ""},

		{"negative", int64(-1), 0, "negative"},
		{"above limit", MaxLastDelay.Milliseconds() + 1, 0, "above 720h0m0s"},
		{"fraction", 1.5, 0, "not a whole number"},
		{"duration text", "1.5s", 0, "not a decimal number"},
		{"bool", true, 0, "not a number"},
	}
	testHeaderValues(t, name, tests, func(t *testing.T, s State, want time.Duration) {
		if s.LastDelay != want {
			t.Errorf("LastDelay = %v, want %v", s.LastDelay, want)
		}
	})
}

func TestDecodeNonRetryable(t *testing.T) {
	const name = "x-retry-non-retryable"
	const notBoolean = "not a boolean"
	tests := []headerValueCase[bool]{
		{"true", true, true, ""},
		{"false", false, false, ""},
		{"string true", "true", true, ""},
		{"string TRUE", "TRUE", true, ""},
		{"string False", "False", false, ""},
		{"string yes", " yes ", true, ""},
		{"string No", "No", false, ""},
		{"string 1", "1", true, ""},
		{"string 0", "0", false, ""},
		{"bytes true", []byte("true"), true, ""},
		{"int64 1", int64(1), true, ""},
		{"int32 0", int32(0), false, ""},
		{"uint8 1", uint8(1), true, ""},
		{"void", nil, false, ""},

		{"string maybe", "maybe", false, notBoolean},
		{"empty string", "", false, notBoolean},
		{"two", int64(2), false, notBoolean},
		{"minus one", int8(-1), false, notBoolean},
		{"fraction", 0.5, false, notBoolean},
		{"timestamp", testNow(), false, notBoolean},
		{"array", []any{true}, false, notBoolean},
	}
	testHeaderValues(t, name, tests, func(t *testing.T, s State, want bool) {
		if s.NonRetryable != want {
			t.Errorf("NonRetryable = %v, want %v", s.NonRetryable, want)
		}
	})
}

func TestDecodeOrigin(t *testing.T) {
	at := testNow().Add(-time.Minute)
	long := strings.Repeat("q", maxQueueName+1)
	tests := []struct {
		name    string
		h       amqp.Table
		want    string
		claimed string // ClaimedOrigin
		problem string // header with a problem, "" for none
	}{
		// The broker's record wins over the header, which is reported.
		{"x-death over the header", amqp.Table{"x-retry-origin-queue": "payments", "x-death": []any{death("orders", "rejected", at, 1)}}, "orders", "payments", ""},
		{"header agreeing with x-death", amqp.Table{"x-retry-origin-queue": "orders", "x-death": []any{death("orders", "rejected", at, 1)}}, "orders", "", ""},
		{"header without x-death", amqp.Table{"x-retry-origin-queue": "orders"}, "orders", "", ""},
		{"header bytes", amqp.Table{"x-retry-origin-queue": []byte("orders")}, "orders", "", ""},
		{"header of 255 bytes", amqp.Table{"x-retry-origin-queue": long[1:]}, long[1:], "", ""},
		{"header over x-first-death-queue", amqp.Table{"x-retry-origin-queue": "orders", "x-first-death-queue": "intake"}, "orders", "", ""},
		{"newest x-death entry", amqp.Table{"x-death": []any{
			death("orders", "rejected", at, 1), death("rebound.delay.1000", "expired", at, 1), death("intake", "rejected", at, 1),
		}, "x-first-death-queue": "intake"}, "orders", "", ""},
		// On RabbitMQ 3.10 a client's x-death stays behind the broker's entry.
		{"forged entries behind the broker's", amqp.Table{"x-retry-origin-queue": "payments", "x-death": []any{
			death("orders", "rejected", at, 1), death("payments", "rejected", at, 1),
		}}, "orders", "payments", ""},
		{"x-first-death-queue", amqp.Table{"x-first-death-queue": "orders"}, "orders", "", ""},
		{"x-first-death-queue bytes", amqp.Table{"x-first-death-queue": []byte("orders")}, "orders", "", ""},
		{"unknown", amqp.Table{"x-first-death-reason": "rejected"}, "", "", ""},
		{"nil table", nil, "", "", ""},

		{"empty header falls back to x-first-death-queue", amqp.Table{"x-retry-origin-queue": "", "x-first-death-queue": "orders"}, "orders", "", "x-retry-origin-queue"},
		{"overlong header", amqp.Table{"x-retry-origin-queue": long, "x-first-death-queue": "orders"}, "orders", "", "x-retry-origin-queue"},
		{"header of the wrong type", amqp.Table{"x-retry-origin-queue": int64(1), "x-first-death-queue": "orders"}, "orders", "", "x-retry-origin-queue"},
		{"newest x-death entry unreadable", amqp.Table{"x-death": []any{
			amqp.Table{"queue": int64(7), "time": at}, death("intake", "rejected", at, 1),
		}, "x-retry-origin-queue": "orders"}, "orders", "", "x-death"},
		{"x-first-death-queue empty", amqp.Table{"x-first-death-queue": ""}, "", "", "x-first-death-queue"},
		{"x-first-death-queue of the wrong type", amqp.Table{"x-first-death-queue": true}, "", "", "x-first-death-queue"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, problems := decode(tt.h)
			if s.Origin != tt.want || s.ClaimedOrigin != tt.claimed {
				t.Errorf("Origin = %q, ClaimedOrigin %q; want %q, %q", s.Origin, s.ClaimedOrigin, tt.want, tt.claimed)
			}
			wantProblem(t, problems, tt.problem, "")
		})
	}
}

func TestDecodeFirstDeath(t *testing.T) {
	first, later := testNow().Add(-time.Hour), testNow().Add(-time.Minute)
	tests := []struct {
		name          string
		h             amqp.Table
		reason, queue string
	}{
		{"rebound's own headers first", amqp.Table{"x-retry-first-death-reason": "maxlen", "x-retry-first-death-queue": "orders",
			"x-first-death-reason": "rejected", "x-first-death-queue": "intake"}, "maxlen", "orders"},
		{"the broker's x-first-death-*", amqp.Table{"x-first-death-reason": "expired", "x-first-death-queue": "orders",
			"x-death": []any{death("orders", "rejected", later, 1)}}, "expired", "orders"},
		// RabbitMQ 3.10 writes no x-first-death-* when a message already
		// had an x-death: the oldest entry, by time, tells.
		{"the oldest x-death entry", amqp.Table{"x-death": []any{
			death("orders", "rejected", later, 3), death("rebound.delay.1000", "expired", later, 2), death("intake", "maxlen", first, 1),
		}}, "maxlen", "intake"},
		{"none", amqp.Table{"tenant": "acme"}, "", ""},
		{"unreadable own headers fall back", amqp.Table{"x-retry-first-death-reason": int64(4), "x-first-death-reason": "delivery_limit",
			"x-first-death-queue": "orders"}, "delivery_limit", "orders"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := decode(tt.h)
			if s.FirstDeathReason != tt.reason || s.FirstDeathQueue != tt.queue {
				t.Errorf("first death %q in %q, want %q in %q", s.FirstDeathReason, s.FirstDeathQueue, tt.reason, tt.queue)
			}
		})
	}
}

func TestDeaths(t *testing.T) {
	at := testNow().Add(-time.Minute).Truncate(time.Second)
	got := Deaths(amqp.Table{"x-death": []any{
		death("rebound.inbox", "delivery_limit", at, 1), "junk", amqp.Table{"queue": int64(1)}, death("orders", "rejected", at, 2),
	}})
	want := []Death{{"rebound.inbox", "delivery_limit", at.UTC()}, {"", "", time.Time{}}, {"orders", "rejected", at.UTC()}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Deaths = %v, want %v", got, want)
	}
	if d := Deaths(amqp.Table{"x-death": "not an array"}); len(d) != 0 {
		t.Errorf("Deaths of a malformed x-death = %v, want none", d)
	}
	forged := make([]any, 10*MaxDeaths)
	for i := range forged {
		forged[i] = death(fmt.Sprintf("q%d", i), "rejected", at, 1)
	}
	if d := Deaths(amqp.Table{"x-death": forged}); len(d) != MaxDeaths || d[0].Queue != "q0" {
		t.Errorf("Deaths of %d entries read %d from %v, want the first %d", len(forged), len(d), d[0], MaxDeaths)
	}
}

func TestDecodeMalformedXDeath(t *testing.T) {
	at := testNow().Add(-time.Minute)
	tests := []struct {
		name   string
		value  any
		reason string
	}{
		{"string", "orders", "not an array"},
		{"table", amqp.Table{"queue": "orders"}, "not an array"},
		{"bytes", []byte("x"), "not an array"},
		{"empty array", []any{}, "empty array"},
		{"entry not a table", []any{"orders"}, "entry 0 is not a table"},
		{"entry void", []any{nil}, "entry 0 is not a table"},
		{"second entry not a table", []any{death("orders", "rejected", at, 1), int64(3)}, "entry 1 is not a table"},
		{"empty entry", []any{amqp.Table{}}, "entry 0 queue: missing"},
		{"queue of the wrong type", []any{amqp.Table{"queue": int64(1), "time": at}}, "entry 0 queue: not a string"},
		{"queue empty", []any{amqp.Table{"queue": "", "time": at}}, "entry 0 queue: empty"},
		{"time missing", []any{amqp.Table{"queue": "orders"}}, "entry 0 time: missing"},
		{"time of the wrong type", []any{amqp.Table{"queue": "orders", "time": true}}, "entry 0 time: not a number"},
		{"time in the future", []any{amqp.Table{"queue": "orders", "time": testNow().Add(time.Hour)}}, "entry 0 time: more than 5m0s in the future"},
		{"reason of the wrong type", []any{amqp.Table{"queue": "orders", "time": at, "reason": int64(1)}}, "entry 0 reason: not a string"},
		{"many problems, one report", []any{"x", amqp.Table{"queue": int64(1)}, nil}, "entry 0 is not a table"},
		{"nested arrays", []any{[]any{[]any{amqp.Table{}}}}, "entry 0 is not a table"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, problems := decode(amqp.Table{"x-death": tt.value})
			wantProblem(t, problems, "x-death", tt.reason)
			if !s.StartedAt.Equal(testNow()) && !s.StartedAt.Equal(at) {
				t.Errorf("StartedAt = %v", s.StartedAt)
			}
		})
	}
}

func TestDecodeReportsEveryHeader(t *testing.T) {
	h := amqp.Table{
		"x-retry-count":         "lots",
		"x-task-started-at":     "soon",
		"x-retry-last-delay-ms": int64(-5),
		"x-retry-non-retryable": "perhaps",
		"x-retry-origin-queue":  "",
		"x-death":               "yes",
		"x-first-death-queue":   int64(1),
	}
	buf := make([]Problem, 0, 8)
	s, problems := NewCodec(DefaultNames()).Decode(h, time.Time{}, testNow(), buf)
	want := []string{
		"x-retry-count", "x-task-started-at", "x-retry-last-delay-ms", "x-retry-non-retryable",
		"x-retry-origin-queue", "x-death", "x-first-death-queue",
	}
	if len(problems) != len(want) {
		t.Fatalf("problems = %v, want one for each of %v", problems, want)
	}
	for i, p := range problems {
		if p.Header != want[i] {
			t.Errorf("problem %d is for %s, want %s", i, p.Header, want[i])
		}
	}
	if &problems[0] != &buf[:1][0] {
		t.Error("problems were not appended to buf")
	}
	wantState := State{Origin: ""}
	wantState.StartedAt = testNow()
	if s != wantState {
		t.Errorf("state = %+v, want %+v", s, wantState)
	}
}

func TestDecodeConfiguredNames(t *testing.T) {
	n := Names{
		RetryCount: "retries", TaskStartedAt: "started", LastDelay: "last-delay", OriginQueue: "origin",
		NonRetryable: "fatal", Error: "error", ParkedReason: "parked-why", ParkedAt: "parked-when",
	}
	h := amqp.Table{
		"retries": int64(2), "started": testNowMs - 5000, "last-delay": int64(800), "origin": "orders", "fatal": true,
		"x-retry-count": int64(9), "x-retry-origin-queue": "wrong",
	}
	s, problems := NewCodec(n).Decode(h, time.Time{}, testNow(), nil)
	if len(problems) != 0 {
		t.Errorf("problems = %v", problems)
	}
	if s.Retries != 2 || !s.StartedAt.Equal(testNow().Add(-5*time.Second)) || s.LastDelay != 800*time.Millisecond || s.Origin != "orders" || !s.NonRetryable {
		t.Errorf("state = %+v", s)
	}
}

func TestProblemReasonIsShort(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	h := amqp.Table{
		"x-retry-count":        huge,
		"x-retry-origin-queue": huge,
		"x-death":              []any{amqp.Table{"queue": huge, "time": huge}},
		"x-task-started-at":    amqp.Decimal{Scale: 3, Value: 1},
		"x-retry-last-delay-ms": struct {
			Big [1000]int
		}{},
	}
	_, problems := decode(h)
	if len(problems) != 5 {
		t.Fatalf("problems = %d, want 5", len(problems))
	}
	for _, p := range problems {
		if len(p.String()) > 200 {
			t.Errorf("%s: reason is %d bytes: %.300s", p.Header, len(p.Reason), p.Reason)
		}
	}
	if got := problems[0].String(); !strings.HasPrefix(got, `x-retry-count: not a decimal number, got string "xxxx`) || !strings.HasSuffix(got, "... (1048576 bytes)") {
		t.Errorf("problem = %s", got)
	}
}

func TestDecodeHappyPathDoesNotAllocate(t *testing.T) {
	c := NewCodec(DefaultNames())
	h := deadLettered()
	h["x-retry-count"] = int64(2)
	h["x-task-started-at"] = testNowMs - 60_000
	h["x-retry-last-delay-ms"] = int64(4000)
	h["x-retry-origin-queue"] = "orders"
	h["x-retry-non-retryable"] = false
	buf := make([]Problem, 0, 4)
	var s State
	allocs := testing.AllocsPerRun(100, func() {
		s, buf = c.Decode(h, testNow().Add(-time.Hour), testNow(), buf[:0])
	})
	if allocs != 0 || len(buf) != 0 {
		t.Errorf("Decode allocated %v times, problems %v", allocs, buf)
	}
	if s.Retries != 2 || s.Origin != "orders" {
		t.Errorf("state = %+v", s)
	}
}

// deadLettered is a typical message as it reaches the inbox: five
// application headers and what RabbitMQ adds on the first rejection.
func deadLettered() amqp.Table {
	at := time.Unix(testNow().Unix()-30, 0)
	return amqp.Table{
		"tenant":                 "acme",
		"trace-id":               "4bf92f3577b34da6a3ce929d0e0e4736",
		"schema-version":         int32(3),
		"content-origin":         "checkout",
		"x-retry-error":          "payment gateway timeout",
		"x-death":                []any{death("orders", "rejected", at, 1)},
		"x-first-death-exchange": "orders",
		"x-first-death-queue":    "orders",
		"x-first-death-reason":   "rejected",
	}
}

// TestDecodeCostDoesNotGrowWithSize: a producer controls the size of the
// headers, up to what a frame holds. Decoding reads at most 64 x-death
// entries (the broker writes one per queue and reason) and allocates the
// same whatever the length or how much of it is malformed: one Problem
// for a broken x-death, its reason cut short.
func TestDecodeCostDoesNotGrowWithSize(t *testing.T) {
	c := NewCodec(DefaultNames())
	at := testNow().Add(-time.Minute)
	allocs := map[int]float64{}
	for _, n := range []int{100, 10_000} {
		entries := make([]any, n)
		for i := range entries {
			if i%2 == 0 {
				entries[i] = death("orders", "rejected", at, int64(i))
			} else {
				entries[i] = amqp.Table{"queue": int64(i), "time": "never", "reason": []byte("x")}
			}
		}
		h := amqp.Table{"x-death": entries, "x-retry-count": strings.Repeat("9", 50_000), "x-retry-origin-queue": strings.Repeat("q", 50_000)}
		var problems []Problem
		allocs[n] = testing.AllocsPerRun(20, func() {
			_, problems = c.Decode(h, time.Time{}, testNow(), nil)
		})
		if len(problems) != 3 {
			t.Fatalf("%d entries: problems %v, want one each for x-death, the count and the origin", n, problems)
		}
		for _, p := range problems {
			if len(p.Reason) > 200 {
				t.Errorf("%d entries: a %d-byte problem reason", n, len(p.Reason))
			}
		}
	}
	// The same code path for both: about the same count, give or take
	// the buffers fmt takes from its pool (which the race detector empties
	// at random). Without the cap it was 15 000.
	if allocs[10_000] > 2*allocs[100] {
		t.Errorf("decoding allocates %v times for 10 000 x-death entries, %v for 100: it grows with the size", allocs[10_000], allocs[100])
	}
}

func TestDecodePolicyAndDueAt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		h       amqp.Table
		policy  string
		due     time.Time
		problem string // the header with a problem; "" for none
	}{
		{"absent", amqp.Table{}, "", time.Time{}, ""},
		{"as written", amqp.Table{"x-retry-policy": "payments:1234abcd", "x-retry-due-at": testNowMs + 60_000},
			"payments:1234abcd", testNow().Add(time.Minute), ""},
		{"bytes and text", amqp.Table{"x-retry-policy": []byte("p:1"), "x-retry-due-at": "2025-06-01T12:30:00Z"},
			"p:1", testNow().Add(30 * time.Minute), ""},
		{"due in the past", amqp.Table{"x-retry-due-at": testNowMs - 60_000}, "", testNow().Add(-time.Minute), ""},
		{"due a month ahead", amqp.Table{"x-retry-due-at": testNowMs + (30*24*time.Hour + time.Minute).Milliseconds()}, "", testNow().Add(30*24*time.Hour + time.Minute), ""},
		{"due too far ahead", amqp.Table{"x-retry-due-at": testNowMs + (31 * 24 * time.Hour).Milliseconds()}, "", time.Time{}, "x-retry-due-at"},
		{"due garbage", amqp.Table{"x-retry-due-at": "tomorrow"}, "", time.Time{}, "x-retry-due-at"},
		{"policy not text", amqp.Table{"x-retry-policy": int64(7)}, "", time.Time{}, "x-retry-policy"},
		{"policy too long", amqp.Table{"x-retry-policy": strings.Repeat("p", 256)}, "", time.Time{}, "x-retry-policy"},
	} {
		s, problems := decode(tc.h)
		if s.Policy != tc.policy || !s.DueAt.Equal(tc.due) {
			t.Errorf("%s: policy %q, due %v; want %q, %v", tc.name, s.Policy, s.DueAt, tc.policy, tc.due)
		}
		if tc.problem == "" {
			wantProblem(t, problems, "", "")
		} else if len(problems) != 1 || problems[0].Header != tc.problem {
			t.Errorf("%s: problems %v, want one for %s", tc.name, problems, tc.problem)
		}
	}
}

func TestNamesRead(t *testing.T) {
	n := DefaultNames()
	n.Policy = "policy-header"
	read := n.Read()
	for _, want := range []string{"x-retry-count", "x-task-started-at", "x-retry-last-delay-ms", "x-retry-origin-queue",
		"x-retry-non-retryable", "policy-header", "x-retry-due-at", XDeath, xFirstDeathQueue} {
		found := false
		for _, r := range read {
			found = found || r == want
		}
		if !found {
			t.Errorf("Read() = %v lacks %s", read, want)
		}
	}
}
