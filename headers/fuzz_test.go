package headers

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// fuzzTable turns fuzz bytes into a header table of valid AMQP types,
// keyed mostly by the names rebound reads, so the fuzzer spends its time
// on values the readers look at. The bytes are a program: each value
// starts with a kind byte, followed by what that kind needs.
type fuzzTable struct{ b []byte }

func (f *fuzzTable) byte() byte {
	if len(f.b) == 0 {
		return 0
	}
	c := f.b[0]
	f.b = f.b[1:]
	return c
}

func (f *fuzzTable) uint64() uint64 {
	var buf [8]byte
	n := copy(buf[:], f.b)
	f.b = f.b[n:]
	return binary.LittleEndian.Uint64(buf[:])
}

func (f *fuzzTable) text() string {
	n := min(int(f.byte()%80), len(f.b))
	s := string(f.b[:n])
	f.b = f.b[n:]
	return s
}

// fuzzKeys are the names a generated table uses: rebound's headers,
// RabbitMQ's, the fields of an x-death entry, and an application header.
func fuzzKeys() []string {
	n := DefaultNames()
	return []string{
		n.RetryCount, n.TaskStartedAt, n.LastDelay, n.OriginQueue, n.NonRetryable, n.Error,
		n.ParkedReason, n.ParkedAt, XDeath, xFirstDeathQueue, "x-first-death-reason",
		n.RetryAfter, n.OptRetryAfter, n.ErrorRetry, n.OptError, n.OptNonRetryable, n.Group,
		"queue", "time", "reason", "count", "exchange", "routing-keys", "tenant",
	}
}

func (f *fuzzTable) table(depth int) amqp.Table {
	keys := fuzzKeys()
	t := amqp.Table{}
	for range f.byte() % 12 {
		t[keys[int(f.byte())%len(keys)]] = f.value(depth)
	}
	return t
}

func (f *fuzzTable) value(depth int) any {
	switch kind := f.byte() % 27; kind {
	case 0:
		return nil
	case 1:
		return f.byte()%2 == 1
	case 2:
		return f.byte()
	case 3:
		return int8(f.byte())
	case 4:
		return int16(f.uint64())
	case 5:
		return int32(f.uint64())
	case 6:
		return int64(f.uint64())
	case 7:
		return uint16(f.uint64())
	case 8:
		return uint32(f.uint64())
	case 9:
		return math.Float32frombits(uint32(f.uint64()))
	case 10:
		return math.Float64frombits(f.uint64())
	case 11:
		return amqp.Decimal{Scale: f.byte(), Value: int32(f.uint64())}
	case 12:
		return f.text()
	case 13:
		return []byte(f.text())
	case 14:
		return time.Unix(int64(f.uint64()%(1<<36)), 0)
	case 15, 22: // an array; 22 also, as x-death is one and this is among the plausible kinds
		if depth > 3 {
			return nil
		}
		arr := make([]any, f.byte()%4)
		for i := range arr {
			arr[i] = f.value(depth + 1)
		}
		return arr
	case 16:
		if depth > 3 {
			return nil
		}
		return f.table(depth + 1)
	// The kinds below are plausible values, which random bytes rarely hit.
	case 17: // a recent time in Unix milliseconds
		return int64(testNowMs) - int64(f.uint64()%(1<<40)) + 1<<20
	case 18: // a recent time as a timestamp
		return time.UnixMilli(int64(testNowMs) - int64(f.uint64()%(1<<40))).Truncate(time.Second)
	case 19: // a small count
		return int64(f.byte() % 16)
	case 20: // a queue name
		return []string{"orders", "rebound.delay.1000", "intake", ""}[f.byte()%4]
	case 21: // an x-death entry as RabbitMQ writes it
		return amqp.Table{
			"count": int64(f.byte()%4 + 1), "reason": []string{"rejected", "expired", "maxlen"}[f.byte()%3],
			"queue": []string{"orders", "rebound.delay.1000", "intake"}[f.byte()%3], "exchange": "",
			"time": time.UnixMilli(int64(testNowMs) - int64(f.uint64()%(1<<36))).Truncate(time.Second), "routing-keys": []any{"orders"},
		}
	// Sizes a producer can send (RabbitMQ's frame_max, 128 KiB by
	// default, bounds a header table): the readers must cost bounded work
	// whatever the size.
	case 24: // a long string: up to about 100 KB
		return strings.Repeat(f.text()+"9", int(f.byte())*50+1)
	case 25: // a long array: up to about 10 000 entries, of a few values
		if depth > 3 {
			return nil
		}
		few := []any{f.value(depth + 1), f.value(depth + 1), f.value(depth + 1)}
		arr := make([]any, int(f.byte())*40+1)
		for i := range arr {
			arr[i] = few[i%len(few)]
		}
		return arr
	case 26: // deep nesting: up to 64 tables and arrays in one another
		var v any = f.value(4)
		for i := range int(f.byte() % 64) {
			if i%2 == 0 {
				v = amqp.Table{[]string{"queue", "x-death", "time"}[i%3]: v}
			} else {
				v = []any{v}
			}
		}
		return v
	case 23: // a time as RFC 3339 text, or a group id
		if f.byte()%2 == 0 {
			return "0123456789ab"
		}
		return time.UnixMilli(int64(testNowMs) + int64(f.uint64()%(1<<36)) - 1<<35).UTC().Format(time.RFC3339Nano)
	default: // a number as text
		return fmt.Sprint(int64(f.uint64() % (1 << 42)))
	}
}

// fuzzInput is what one fuzz call decodes: a table, a timestamp property
// and a delay for Retry.
func fuzzInput(data []byte) (amqp.Table, time.Time, time.Duration) {
	f := &fuzzTable{b: data}
	var timestamp time.Time
	switch f.byte() % 4 {
	case 1:
		timestamp = time.UnixMilli(testNowMs - int64(f.uint64()%(1<<36))).Truncate(time.Second)
	case 2:
		timestamp = time.Unix(int64(f.uint64()%(1<<36)), 0)
	}
	delay := time.Duration(int64(f.uint64())) % (60 * 24 * time.Hour)
	return f.table(0), timestamp, delay
}

func fuzzSeeds(f *testing.F) {
	f.Add([]byte{})
	// A long x-death, a long count and deep nesting.
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 8, 25, 255, 21, 1, 1, 1, 21, 0, 0, 0, 12, 3, 'a', 'b', 'c', 0, 24, 2, '1', '2', 255, 1, 26, 63, 21})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 8, 21, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 19, 3})
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 5, 8, 22, 2, 21, 0, 0, 0, 21, 1, 1, 1, 1, 17, 5, 5, 5, 5, 5, 5, 5, 5, 3, 20, 0})
	f.Add([]byte("\x02\xff\xff\xff\xff\xff\xff\xff\x7f\x10\x10\x0a\x01\x0c\x03abc\x02\x0c\x051.5e3\x04\x0c\x02no"))
}

// FuzzDecode checks that Decode never panics, that every Problem names a
// header and says briefly what was wrong, and that the state it returns
// is within the limits the readers promise.
func FuzzDecode(f *testing.F) {
	fuzzSeeds(f)
	c := NewCodec(DefaultNames())
	f.Fuzz(func(t *testing.T, data []byte) {
		h, timestamp, _ := fuzzInput(data)
		s, problems := c.Decode(h, timestamp, testNow(), nil)
		for _, p := range problems {
			if p.Header == "" || p.Reason == "" || len(p.String()) > 250 {
				t.Errorf("problem %q", p)
			}
		}
		if s.Retries < 0 || s.Retries > MaxRetryCount || s.LastDelay < 0 || s.LastDelay > MaxLastDelay || len(s.Origin) > maxQueueName {
			t.Errorf("state out of range: %+v", s)
		}
		if s.StartedAt.UnixMilli() < minTimeMs || s.StartedAt.After(testNow().Add(c.MaxFutureSkew)) {
			t.Errorf("StartedAt = %v", s.StartedAt)
		}
		if s.RetryAfter < 0 || s.RetryAfter > maxRetryAfter || s.RetryAfter%time.Millisecond != 0 || (s.RetryAfterInvalid && s.RetryAfter != 0) {
			t.Errorf("RetryAfter = %v, invalid %v", s.RetryAfter, s.RetryAfterInvalid)
		}
		if s.ErrorStamped && (s.ErrorRetry < replayedError || s.ErrorRetry > MaxRetryCount) {
			t.Errorf("ErrorRetry = %d", s.ErrorRetry)
		}
	})
}

// FuzzRoundTrip checks decode∘encode∘decode: what Retry, Park and Replay
// write validates, reads back as the state it was written from, carries
// no unreadable rebound header, and leaves the input untouched.
func FuzzRoundTrip(f *testing.F) {
	fuzzSeeds(f)
	c := NewCodec(DefaultNames())
	n := c.Names
	own := rebounds()
	now := testNow()
	f.Fuzz(func(t *testing.T, data []byte) {
		h, timestamp, delay := fuzzInput(data)
		if err := h.Validate(); err != nil {
			t.Fatalf("generated table does not validate: %v", err)
		}
		before := fmt.Sprint(h)
		s, _ := c.Decode(h, timestamp, now, nil)

		decodeCopy := func(what string, out amqp.Table) State {
			t.Helper()
			if err := out.Validate(); err != nil {
				t.Fatalf("%s: output does not validate: %v", what, err)
			}
			got, problems := c.Decode(out, timestamp, now, nil)
			for _, p := range problems {
				if own[p.Header] {
					t.Errorf("%s: copy carries an unreadable header: %v", what, p)
				}
			}
			for k, v := range h {
				if own[k] {
					continue
				}
				if broker(k) {
					if _, ok := out[k]; ok {
						t.Errorf("%s: copy carries the broker's %s header", what, k)
					}
					continue
				}
				if w, ok := out[k]; !ok || fmt.Sprint(w) != fmt.Sprint(v) {
					t.Errorf("%s: application header %s = %v, want %v", what, k, w, v)
				}
			}
			return got
		}

		want := s
		want.StartedAt = time.UnixMilli(s.StartedAt.UnixMilli()).UTC()
		want.ClaimedOrigin = "" // the copy's origin header says what the record said
		// One attempt's word is read once, and a copy carries no x-death.
		want.RetryAfter, want.RetryAfterInvalid, want.OptError, want.LastDeathQueue = 0, false, "", ""
		retry := want
		retry.Retries = min(s.Retries+1, MaxRetryCount)
		retry.LastDelay = clampDelay(delay).Truncate(time.Millisecond)
		if got := decodeCopy("Retry", c.Retry(h, s, delay, time.Time{})); got != retry {
			t.Errorf("Retry read back as %+v, want %+v", got, retry)
		}

		parkedOut := c.Park(h, s, "max-duration", now)
		if got := decodeCopy("Park", parkedOut); got != want {
			t.Errorf("Park read back as %+v, want %+v", got, want)
		}
		if reason, at, ok := c.Parked(parkedOut); !ok || reason != "max-duration" || at.UnixMilli() != now.UnixMilli() {
			t.Errorf("Parked = %q, %v, %v", reason, at, ok)
		}

		origin := cmp.Or(s.Origin, "orders")
		replayed := State{Origin: origin}
		replayed.StartedAt = now
		if s.Error != "" {
			replayed.Error, replayed.ErrorRetry, replayed.ErrorStamped = s.Error, replayedError, true
		}
		if got := decodeCopy("Replay", c.Replay(parkedOut, origin, now)); got != replayed {
			t.Errorf("Replay read back as %+v, want %+v", got, replayed)
		}
		if out := c.Replay(h, origin, now); out[n.TaskStartedAt] != now.UnixMilli() {
			t.Errorf("Replay start = %v", out[n.TaskStartedAt])
		}

		if after := fmt.Sprint(h); after != before {
			t.Errorf("input modified:\nbefore %s\n after %s", before, after)
		}
	})
}

// FuzzDecodeText feeds one string to every reader, where the parsing is.
func FuzzDecodeText(f *testing.F) {
	for _, s := range []string{"3", " +7 ", "1e3", "2.5", "-0", "1748779200000", "2025-06-01T11:00:00.5+02:00", "yes", "TRUE", "0x1p3", "NaN", strings.Repeat("9", 70)} {
		f.Add(s)
	}
	c := NewCodec(DefaultNames())
	f.Fuzz(func(t *testing.T, s string) {
		h := amqp.Table{}
		for _, k := range fuzzKeys() {
			h[k] = s
		}
		got, problems := c.Decode(h, time.Time{}, testNow(), nil)
		if len(problems) == 0 {
			t.Fatalf("%q read as valid x-death", s)
		}
		if out := c.Retry(h, got, time.Second, time.Time{}); out.Validate() != nil {
			t.Errorf("%q: Retry output does not validate", s)
		}
		// A count that reads as valid is written back as the same number.
		if n, why := integer(s); why == "" && n >= 0 && n <= MaxRetryCount && got.Retries != int(n) {
			t.Errorf("%q: Retries = %d, want %d", s, got.Retries, n)
		}
	})
}
