package headers

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/group"
)

// Decode reads the state. timestamp is the message's timestamp property
// (zero when absent); now is the caller's clock (Decode reads none).
// Problems are appended to buf (pass buf[:0] to reuse it).
//
// Decode never fails: a header that cannot be read is reported as a Problem
// and treated as absent, so the message still moves on with a valid state.
// A header whose value is AMQP void (nil) counts as absent and is not a
// Problem. Every header Decode knows is checked, even one another header
// makes unnecessary, so a broken producer shows up in the metrics early.
//
// The task start is the task-start header, else the timestamp property,
// else the oldest time in x-death, else now; the timestamp property is
// skipped silently when it is before 2000 or too far in the future, since
// it is the producer's property, not rebound's header. The origin is the
// queue of the newest x-death entry (the broker's record), else the origin
// header, else x-first-death-queue; an origin header that names another
// queue than the record is returned as ClaimedOrigin.
//
// The returned StartedAt is in UTC and has no monotonic clock reading.
func (c Codec) Decode(h amqp.Table, timestamp, now time.Time, buf []Problem) (State, []Problem) {
	d := decoding{now: now, skew: c.MaxFutureSkew, problems: buf}
	n := c.Names
	var s State

	if v := h[n.RetryCount]; v != nil {
		s.Retries = d.count(n.RetryCount, v)
	}

	start, haveStart := time.Time{}, false
	if v := h[n.TaskStartedAt]; v != nil {
		var why string
		if start, why = d.instant(v); why != "" {
			d.report(n.TaskStartedAt, why, v)
		} else {
			haveStart = true
		}
	}

	if v := h[n.LastDelay]; v != nil {
		s.LastDelay = d.lastDelay(n.LastDelay, v)
	}

	if v := h[n.NonRetryable]; v != nil {
		s.NonRetryable = d.flag(n.NonRetryable, v)
	} else if v := h[n.OptNonRetryable]; v != nil {
		s.NonRetryable = d.flag(n.OptNonRetryable, v)
	}

	s.Error, s.OptError = Text(h[n.Error]), Text(h[n.OptError])
	if v := h[n.ErrorRetry]; v != nil {
		s.ErrorRetry, s.ErrorStamped = d.errorRetry(n.ErrorRetry, v)
	}
	if g, ok := h[n.Group].(string); ok && group.Valid(g) {
		s.Group = g
	}

	// The twin wins when both are there, even when it cannot be read: a
	// consumer that set both meant the header.
	name, after := n.RetryAfter, h[n.RetryAfter]
	if after == nil {
		name, after = n.OptRetryAfter, h[n.OptRetryAfter]
	}
	if after != nil {
		s.RetryAfter, s.RetryAfterInvalid = d.retryAfter(name, after)
	}

	if v := h[n.Policy]; v != nil {
		label, why := queueName(v) // same rules: a non-empty string of at most 255 bytes
		if why != "" {
			d.report(n.Policy, why, v)
		}
		s.Policy = label
	}

	if v := h[n.DueAt]; v != nil {
		s.DueAt = d.dueAt(n.DueAt, v)
	}

	var claimed string
	if v := h[n.OriginQueue]; v != nil {
		q, why := queueName(v)
		if why != "" {
			d.report(n.OriginQueue, why, v)
		}
		claimed = q
	}

	var deathQueue string
	var oldest deathEntry
	if v := h[XDeath]; v != nil {
		deathQueue, oldest = d.xDeath(v)
	}

	var firstDeathQueue string
	if v := h[xFirstDeathQueue]; v != nil {
		q, why := queueName(v)
		if why != "" {
			d.report(xFirstDeathQueue, why, v)
		}
		firstDeathQueue = q
	}

	s.LastDeathQueue = deathQueue
	switch {
	case deathQueue != "":
		s.Origin = deathQueue
		if claimed != "" && claimed != deathQueue {
			s.ClaimedOrigin = claimed
		}
	case claimed != "":
		s.Origin = claimed
	default:
		s.Origin = firstDeathQueue
	}

	s.FirstDeathReason = firstOf(shortText(h[n.FirstDeathReason]), shortText(h[xFirstDeathReason]), oldest.reason)
	s.FirstDeathQueue = firstOf(shortText(h[n.FirstDeathQueue]), firstDeathQueue, oldest.queue)

	switch {
	case haveStart:
	case !timestamp.IsZero() && d.plausible(timestamp) == "":
		start = timestamp
	case !oldest.time.IsZero():
		start = oldest.time
	default:
		start = now
	}
	s.StartedAt = start.UTC()

	return s, d.problems
}

// decoding holds what the readers of one Decode call share.
type decoding struct {
	now      time.Time
	skew     time.Duration
	problems []Problem
}

// report records a header that could not be read. Reasons are formatted
// only once something is wrong, so reading a valid message allocates
// nothing.
func (d *decoding) report(header, why string, v any) {
	d.problems = append(d.problems, Problem{Header: header, Reason: why + ", got " + describe(v)})
}

func (d *decoding) count(name string, v any) int {
	n, why := integer(v)
	switch {
	case why != "":
	case n < 0:
		why = "negative"
	case n > MaxRetryCount:
		why = "above " + strconv.Itoa(MaxRetryCount)
	default:
		return int(n)
	}
	d.report(name, why, v)
	return 0
}

func (d *decoding) lastDelay(name string, v any) time.Duration {
	ms, why := integer(v)
	switch {
	case why != "":
	case ms < 0:
		why = "negative"
	case ms > MaxLastDelay.Milliseconds():
		why = "above " + MaxLastDelay.String()
	default:
		return time.Duration(ms) * time.Millisecond
	}
	d.report(name, why, v)
	return 0
}

// errorRetry reads the retry count an error was reported at, or
// replayedError.
func (d *decoding) errorRetry(name string, v any) (int, bool) {
	n, why := integer(v)
	switch {
	case why != "":
	case n < replayedError:
		why = "below -1"
	case n > MaxRetryCount:
		why = "above " + strconv.Itoa(MaxRetryCount)
	default:
		return int(n), true
	}
	d.report(name, why, v)
	return 0, false
}

// retryAfter reads the least delay a consumer asks for: milliseconds in
// any number form, or a time (an AMQP timestamp or an RFC 3339 string)
// that becomes the delay from now, rounded up to the millisecond, 0 once
// it has passed. A negative delay, or one longer than maxRetryAfter, is
// reported and ignored.
func (d *decoding) retryAfter(name string, v any) (time.Duration, bool) {
	var after time.Duration
	var why string
	switch t := v.(type) {
	case time.Time:
		after, why = d.until(t)
	case string, []byte:
		text := strings.TrimSpace(Text(t))
		if len(text) > maxText {
			why = "neither milliseconds nor an RFC 3339 time"
			break
		}
		if floatText(text) {
			after, why = milliseconds(v)
			break
		}
		at, err := time.Parse(time.RFC3339Nano, text)
		if err != nil {
			why = "neither milliseconds nor an RFC 3339 time"
			break
		}
		after, why = d.until(at)
	default:
		after, why = milliseconds(v)
	}
	if why != "" {
		d.report(name, why, v)
		return 0, true
	}
	return after, false
}

// milliseconds reads a Retry-After in milliseconds.
func milliseconds(v any) (time.Duration, string) {
	ms, why := integer(v)
	switch {
	case why != "":
		return 0, why
	case ms < 0:
		return 0, "negative"
	case ms > maxRetryAfter.Milliseconds():
		return 0, "above " + maxRetryAfter.String()
	}
	return time.Duration(ms) * time.Millisecond, ""
}

// until is the delay from now to t, rounded up to the millisecond.
func (d *decoding) until(t time.Time) (time.Duration, string) {
	after := t.Sub(d.now)
	switch {
	case after <= 0:
		return 0, ""
	case after > maxRetryAfter:
		return 0, "more than " + maxRetryAfter.String() + " ahead"
	}
	return (after + time.Millisecond - 1).Truncate(time.Millisecond), ""
}

// Text reads a header or annotation that holds text: a string, or the
// bytes some clients send strings as; "" otherwise. It is kept as is,
// however long: the failure group reads a bounded prefix of an error.
func Text(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// dueAt reads when a delayed copy's delay ends: a time as instant reads
// it, which may lie ahead by up to the longest delay rebound queues.
func (d *decoding) dueAt(name string, v any) time.Time {
	ahead := *d
	ahead.skew += MaxLastDelay
	t, why := ahead.instant(v)
	if why != "" {
		d.report(name, why, v)
		return time.Time{}
	}
	return t.UTC()
}

// flag reads a boolean the way people and other languages' clients write
// one: an AMQP boolean, 0 or 1, or a word.
func (d *decoding) flag(name string, v any) bool {
	switch v := v.(type) {
	case bool:
		return v
	case string, []byte:
		if b, ok := word(Text(v)); ok {
			return b
		}
	default:
		if n, why := integer(v); why == "" && (n == 0 || n == 1) {
			return n == 1
		}
	}
	d.report(name, "not a boolean", v)
	return false
}

func word(s string) (value, ok bool) {
	s = strings.TrimSpace(s)
	for _, t := range [...]string{"true", "1", "yes"} {
		if strings.EqualFold(s, t) {
			return true, true
		}
	}
	for _, f := range [...]string{"false", "0", "no"} {
		if strings.EqualFold(s, f) {
			return false, true
		}
	}
	return false, false
}

// instant reads a point in time: Unix milliseconds in any number form, an
// AMQP timestamp, or an RFC 3339 string. It does not report, so x-death
// entries can use it too.
func (d *decoding) instant(v any) (time.Time, string) {
	var t time.Time
	switch v := v.(type) {
	case time.Time:
		t = v
	case string, []byte:
		return d.instantText(Text(v))
	default:
		ms, why := integer(v)
		if why != "" {
			return time.Time{}, why
		}
		if ms < minTimeMs {
			if ms >= minTimeMs/1000 {
				return time.Time{}, "before 2000-01-01 (Unix seconds instead of milliseconds?)"
			}
			return time.Time{}, "before 2000-01-01"
		}
		t = time.UnixMilli(ms)
	}
	if why := d.plausible(t); why != "" {
		return time.Time{}, why
	}
	return t, ""
}

func (d *decoding) instantText(s string) (time.Time, string) {
	s = strings.TrimSpace(s)
	if len(s) > maxText {
		return time.Time{}, "neither Unix milliseconds nor RFC 3339"
	}
	if digits(s) {
		ms, why := integerText(s)
		if why != "" {
			return time.Time{}, why
		}
		return d.instant(ms)
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, "neither Unix milliseconds nor RFC 3339"
	}
	if why := d.plausible(t); why != "" {
		return time.Time{}, why
	}
	return t, ""
}

// plausible says what is wrong with t as a task start, or "".
func (d *decoding) plausible(t time.Time) string {
	if t.UnixMilli() < minTimeMs {
		return "before 2000-01-01"
	}
	if t.After(d.now.Add(d.skew)) {
		return "more than " + d.skew.String() + " in the future"
	}
	return ""
}

// maxDeaths is the most x-death entries Decode reads. RabbitMQ keeps one
// entry per queue and reason a message was dead-lettered for: a message
// with more went through tens of queues, or was given its x-death by a
// client.
const maxDeaths = 64

// deathEntry is what rebound reads of one x-death entry.
type deathEntry struct {
	queue, reason string
	time          time.Time
}

// xDeath reads the queue of the newest entry and the oldest entry, by
// time. RabbitMQ keeps x-death newest first and moves an entry to the
// front when the same queue dead-letters the message again, so the first
// entry is where the message just died, even after a round trip through a
// delay queue (whose "expired" entry is then second). An entry keeps the
// time of its first death, so the oldest entry is the one with the least
// time, not the last one. testdata/ holds both cases as RabbitMQ 3.10
// wrote them. Only the first malformation is reported: one broken x-death
// is one Problem.
func (d *decoding) xDeath(v any) (newestQueue string, oldest deathEntry) {
	entries, ok := v.([]any)
	if !ok {
		d.report(XDeath, "not an array", v)
		return "", deathEntry{}
	}
	if len(entries) == 0 {
		d.problems = append(d.problems, Problem{Header: XDeath, Reason: "empty array"})
		return "", deathEntry{}
	}
	bad := ""
	if len(entries) > maxDeaths {
		bad = fmt.Sprintf("%d entries, more than the broker writes: only the first %d read", len(entries), maxDeaths)
		entries = entries[:maxDeaths]
	}
	for i, e := range entries {
		entry, ok := e.(amqp.Table)
		if !ok {
			if bad == "" {
				bad = fmt.Sprintf("entry %d is not a table, got %s", i, describe(e))
			}
			continue
		}
		q, why := queueName(entry["queue"])
		if why != "" {
			if bad == "" {
				bad = fmt.Sprintf("entry %d queue: %s, got %s", i, why, describe(entry["queue"]))
			}
		} else if i == 0 {
			newestQueue = q
		}
		reason, isText := entry["reason"].(string)
		if _, present := entry["reason"]; present && !isText && bad == "" {
			bad = fmt.Sprintf("entry %d reason: not a string, got %s", i, describe(entry["reason"]))
		}
		if t, why := d.instant(entry["time"]); why != "" {
			if bad == "" {
				bad = fmt.Sprintf("entry %d time: %s, got %s", i, why, describe(entry["time"]))
			}
		} else if oldest.time.IsZero() || t.Before(oldest.time) {
			oldest = deathEntry{queue: q, reason: reason, time: t}
		}
	}
	if bad != "" {
		d.problems = append(d.problems, Problem{Header: XDeath, Reason: bad})
	}
	return newestQueue, oldest
}

// MaxDeaths bounds the x-death entries Deaths reads. RabbitMQ keeps one
// entry per queue and reason, so a real message carries a handful; a longer
// list is a producer's, and what lies past the bound is not read.
const MaxDeaths = 64

// Death is one x-death entry as rebound reads it.
type Death struct {
	Queue  string    // the queue that dead-lettered the message; "" when unreadable
	Reason string    // rejected, expired, maxlen, delivery_limit; "" when unreadable
	Time   time.Time // when it first did; zero when unreadable
}

// Deaths returns the readable x-death entries of h, newest first, for tools
// that look past the newest one (a message the broker moved from rebound's
// inbox to its parking queue went through the application queue before).
// Unlike Decode it allocates, and it never reports. It reads at most
// MaxDeaths entries.
func Deaths(h amqp.Table) []Death {
	entries, _ := h[XDeath].([]any)
	entries = entries[:min(len(entries), MaxDeaths)]
	out := make([]Death, 0, len(entries))
	for _, e := range entries {
		entry, ok := e.(amqp.Table)
		if !ok {
			continue
		}
		q, _ := queueName(entry["queue"])
		r, _ := entry["reason"].(string)
		t, _ := entry["time"].(time.Time)
		out = append(out, Death{Queue: q, Reason: r, Time: t.UTC()})
	}
	return out
}

// shortText reads a short string header leniently: "" when absent, not text,
// or longer than a queue name may be.
func shortText(v any) string {
	q, _ := queueName(v)
	return q
}

func firstOf(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

// queueName reads a queue name. RabbitMQ writes long strings; other
// clients sometimes send byte arrays.
func queueName(v any) (string, string) {
	var q string
	switch v.(type) {
	case string, []byte:
		q = Text(v)
	case nil:
		return "", "missing"
	default:
		return "", "not a string"
	}
	if q == "" {
		return "", "empty"
	}
	if len(q) > maxQueueName {
		return "", "longer than " + strconv.Itoa(maxQueueName) + " bytes"
	}
	return q, ""
}

// maxText is longer than any number or RFC 3339 time a reader accepts.
const maxText = 64

// integer reads a whole number from any AMQP number type amqp091-go
// decodes (plus Go's int, uint and uint64, which Go code puts in tables),
// an integral float or decimal, or a decimal string. why is "" on success
// and a constant otherwise, so the happy path does not allocate.
func integer(v any) (n int64, why string) {
	switch v := v.(type) {
	case int64:
		return v, ""
	case int32:
		return int64(v), ""
	case int16:
		return int64(v), ""
	case int8:
		return int64(v), ""
	case int:
		return int64(v), ""
	case uint8:
		return int64(v), ""
	case uint16:
		return int64(v), ""
	case uint32:
		return int64(v), ""
	case uint:
		return unsigned(uint64(v))
	case uint64:
		return unsigned(v)
	case float64:
		return whole(v)
	case float32:
		return whole(float64(v))
	case amqp.Decimal:
		return decimal(v)
	case string, []byte:
		return integerText(Text(v))
	case nil:
		return 0, "missing"
	}
	return 0, "not a number"
}

func unsigned(u uint64) (int64, string) {
	if u > math.MaxInt64 {
		return 0, "out of range"
	}
	return int64(u), ""
}

func whole(f float64) (int64, string) {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return 0, "not a finite number"
	case f != math.Trunc(f):
		return 0, "not a whole number"
	case f < math.MinInt64 || f >= math.MaxInt64:
		return 0, "out of range"
	}
	return int64(f), ""
}

// decimal reads an AMQP decimal, Value / 10^Scale, when it is whole.
func decimal(d amqp.Decimal) (int64, string) {
	if d.Value == 0 || d.Scale == 0 {
		return int64(d.Value), ""
	}
	// |Value| < 10^10, so a non-zero value with a larger scale is a fraction.
	if d.Scale > 9 {
		return 0, "not a whole number"
	}
	p := int64(1)
	for range d.Scale {
		p *= 10
	}
	if int64(d.Value)%p != 0 {
		return 0, "not a whole number"
	}
	return int64(d.Value) / p, ""
}

func integerText(s string) (int64, string) {
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return 0, "empty string"
	case len(s) > maxText:
		// Not worth parsing: strconv would copy all of it into its error.
		return 0, "not a decimal number"
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, ""
	}
	// "3.0" and "1e3" are whole numbers written by someone's float
	// formatting; hexadecimal, "Inf" and the like are not decimal text.
	if !floatText(s) {
		return 0, "not a decimal number"
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, "out of range"
	}
	return whole(f)
}

// digits reports whether s is an optionally signed run of ASCII digits.
func digits(s string) bool {
	if s != "" && (s[0] == '-' || s[0] == '+') {
		s = s[1:]
	}
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// floatText reports whether s looks like a decimal float: digits, signs,
// one point and exponents only.
func floatText(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9', c == '+', c == '-', c == '.', c == 'e', c == 'E':
		default:
			return false
		}
	}
	return true
}

// describe renders a value for a Problem: its type and, for scalars, the
// value, cut short so a huge header never ends up whole in a log line.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "void"
	case string:
		return "string " + quote(v)
	case []byte:
		return "bytes " + quote(string(v))
	case []any:
		return "array of " + strconv.Itoa(len(v))
	case amqp.Table:
		return "table of " + strconv.Itoa(len(v))
	case time.Time:
		return "timestamp " + v.UTC().Format(time.RFC3339)
	}
	s := fmt.Sprintf("%T %v", v, v)
	if len(s) > 2*maxQuoted {
		s = s[:2*maxQuoted] + "..."
	}
	return s
}

const maxQuoted = 40

func quote(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:maxQuoted]) + fmt.Sprintf("... (%d bytes)", len(s))
}
