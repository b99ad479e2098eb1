package parking

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"regexp"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/internal/topology"
)

// Tests of what needs no broker: filters and decoding. The operations
// run against the broker in ops_test.go.

func TestParkedFilterMatch(t *testing.T) {
	now := time.Date(2025, 1, 2, 12, 0, 0, 0, time.UTC)
	m := Message{
		Delivery: amqp.Delivery{MessageId: "m1"},
		Reason:   "max-retries", Origin: "orders", ParkedAt: now.Add(-2 * time.Hour),
	}
	unknownAt := m
	unknownAt.ParkedAt = time.Time{}
	for _, tc := range []struct {
		name string
		f    Filter
		m    Message
		want bool
	}{
		{"zero filter", Filter{}, m, true},
		{"reason", Filter{Reason: "max-retries"}, m, true},
		{"other reason", Filter{Reason: "non-retryable"}, m, false},
		{"origin", Filter{Origin: "orders"}, m, true},
		{"other origin", Filter{Origin: "billing"}, m, false},
		{"origin pattern", Filter{Origins: regexp.MustCompile(`^ord`)}, m, true},
		{"other origin pattern", Filter{Origins: regexp.MustCompile(`^orders\.`)}, m, false},
		{"skipped reason", Filter{SkipReasons: []string{"max-retries"}}, m, false},
		{"skipped reason asked for", Filter{Reason: "max-retries", SkipReasons: []string{"max-retries"}}, m, true},
		{"other reason skipped", Filter{SkipReasons: []string{"non-retryable"}}, m, true},
		{"id", Filter{ID: "m1"}, m, true},
		{"other id", Filter{ID: "m2"}, m, false},
		{"older than 1h", Filter{OlderThan: time.Hour}, m, true},
		{"not older than 3h", Filter{OlderThan: 3 * time.Hour}, m, false},
		{"parked exactly 2h ago is older than 2h", Filter{OlderThan: 2 * time.Hour}, m, true},
		{"unknown parked-at never older", Filter{OlderThan: time.Hour}, unknownAt, false},
		{"all conditions", Filter{Reason: "max-retries", Origin: "orders", OlderThan: time.Hour, Limit: 1}, m, true},
	} {
		if got := tc.f.match(tc.m, now); got != tc.want {
			t.Errorf("%s: match = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestFilterBound(t *testing.T) {
	now := time.Date(2025, 1, 2, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		before time.Time
		want   time.Time
	}{
		{"no bound of its own: now", time.Time{}, now},
		{"an earlier bound of its own", now.Add(-time.Hour), now.Add(-time.Hour)},
		{"a later bound of its own: now", now.Add(time.Hour), now},
		{"the same instant", now, now},
	} {
		if got := (Filter{ParkedBefore: tc.before}).Bound(now); !got.Equal(tc.want) {
			t.Errorf("%s: Bound = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestParkedDecode(t *testing.T) {
	now := time.Now()
	parkedAt := now.Add(-time.Minute).Truncate(time.Millisecond)
	q := Queue{Router: route.Router{Codec: headers.NewCodec(headers.DefaultNames())}}
	m := q.decode(amqp.Delivery{MessageId: "m1", Headers: amqp.Table{
		"x-retry-count": int64(7), "x-retry-origin-queue": "orders", "x-retry-error": []byte("boom"),
		"x-retry-parked-reason": "max-retries", "x-retry-parked-at": parkedAt.UnixMilli(),
		"x-task-started-at": parkedAt.Add(-time.Hour).UnixMilli(),
	}}, now)
	if m.Retries != 7 || m.Origin != "orders" || m.Error != "boom" || m.Reason != "max-retries" ||
		!m.ParkedAt.Equal(parkedAt) || !m.StartedAt.Equal(parkedAt.Add(-time.Hour)) {
		t.Errorf("Decode = %+v", m)
	}
	if m := q.decode(amqp.Delivery{}, now); m.Reason != "" || !m.ParkedAt.IsZero() || m.Origin != "" {
		t.Errorf("Decode of a bare delivery = %+v", m)
	}
}

// TestDecodeDeliveryLimit decodes messages as the broker moves them from
// rebound's quorum inbox to the parking queue after their delivery limit,
// with x-death entries as RabbitMQ writes them, newest first.
func TestDecodeDeliveryLimit(t *testing.T) {
	q := Queue{Router: route.Router{
		Topology: topology.Topology{InboxQueue: "rebound.inbox", DelayQueuePrefix: "rebound.delay.", ParkingQueue: "rebound.parked", Quorum: true},
		Codec:    headers.NewCodec(headers.DefaultNames()),
	}}
	n := q.Router.Codec.Names
	limitAt := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	rejectedAt := limitAt.Add(-time.Minute)
	death := func(queue, reason string, at time.Time) amqp.Table {
		return amqp.Table{"queue": queue, "reason": reason, "count": int64(1), "exchange": "", "routing-keys": []any{queue}, "time": at}
	}
	for _, tc := range []struct {
		name     string
		h        amqp.Table
		reason   string
		parkedAt time.Time
		origin   string
	}{
		{"after the application rejected it",
			amqp.Table{headers.XDeath: []any{death("rebound.inbox", "delivery_limit", limitAt), death("orders", "rejected", rejectedAt)}},
			"delivery-limit", limitAt, "orders"},
		{"rebound's own queues are no origin",
			amqp.Table{headers.XDeath: []any{death("rebound.inbox", "delivery_limit", limitAt), death("rebound.delay.1000", "expired", rejectedAt),
				death("orders", "rejected", rejectedAt.Add(-time.Second))}},
			"delivery-limit", limitAt, "orders"},
		{"no earlier entry: the origin header",
			amqp.Table{n.OriginQueue: "orders", headers.XDeath: []any{death("rebound.inbox", "delivery_limit", limitAt)}},
			"delivery-limit", limitAt, "orders"},
		{"no earlier entry, no origin header",
			amqp.Table{headers.XDeath: []any{death("rebound.inbox", "delivery_limit", limitAt)}},
			"delivery-limit", limitAt, ""},
		{"rejected in the inbox is no delivery limit",
			amqp.Table{headers.XDeath: []any{death("rebound.inbox", "rejected", limitAt), death("orders", "rejected", rejectedAt)}},
			"", time.Time{}, "rebound.inbox"},
		{"a delivery limit elsewhere is not rebound's",
			amqp.Table{headers.XDeath: []any{death("orders", "delivery_limit", limitAt)}},
			"", time.Time{}, "orders"},
	} {
		m := q.decode(amqp.Delivery{MessageId: "m1", Headers: tc.h}, limitAt.Add(time.Hour))
		if m.Reason != tc.reason || !m.ParkedAt.Equal(tc.parkedAt) || m.Origin != tc.origin {
			t.Errorf("%s: reason %q, parked at %v, origin %q; want %q, %v, %q", tc.name, m.Reason, m.ParkedAt, m.Origin, tc.reason, tc.parkedAt, tc.origin)
		}
	}
}

// TestExportLineReadsBackAnyHeader: `rebound parked expire --export`
// writes a line for every message it removes, whatever its headers hold:
// values JSON has no word for (NaN and infinities, in tables and arrays
// at any depth) become strings instead of failing the export, and
// decimals keep their value and scale; the body is kept in base64. A
// failing sync is the caller's to see, so no message is removed unsaved.
func TestExportLineReadsBackAnyHeader(t *testing.T) {
	parkedAt := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	m := Message{
		Delivery: amqp.Delivery{MessageId: "m1", ContentType: "application/json", Body: []byte{0, 1, 0xff}, Headers: amqp.Table{
			"nan":     math.NaN(),
			"inf32":   float32(math.Inf(-1)),
			"price":   amqp.Decimal{Scale: 2, Value: 1999},
			"raw":     []byte("bytes"),
			"nested":  amqp.Table{"deeper": []any{math.Inf(1), int64(7), amqp.Table{"ok": 1.5}}},
			"plain32": float32(0.5),
		}},
		Origin: "orders", Reason: "max-retries", Group: "0123456789ab", Retries: 3, ParkedAt: parkedAt,
	}
	var out bytes.Buffer
	exportedAt := parkedAt.Add(time.Hour)
	j := NewJSONLines(&out, nil, func() time.Time { return exportedAt })
	if err := j.Export(m); err != nil {
		t.Fatalf("export: %v", err)
	}
	if err := j.Export(Message{Delivery: amqp.Delivery{MessageId: "m2"}}); err != nil {
		t.Fatalf("export of a message that says nothing: %v", err)
	}
	if err := j.Sync(); err != nil {
		t.Errorf("sync with nothing to sync: %v", err)
	}
	// One JSON document a line, read back in order.
	dec := json.NewDecoder(&out)
	var got, bare map[string]any
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if err := dec.Decode(&bare); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"nan":     "NaN",
		"inf32":   "-Inf",
		"price":   map[string]any{"decimal": float64(1999), "scale": float64(2)},
		"raw":     "Ynl0ZXM=",
		"nested":  map[string]any{"deeper": []any{"+Inf", float64(7), map[string]any{"ok": 1.5}}},
		"plain32": 0.5,
	}
	if h := got["headers"]; !reflect.DeepEqual(h, want) {
		t.Errorf("headers %v, want %v", h, want)
	}
	props, _ := got["properties"].(map[string]any) // absent: nil, and the check below fails
	if got["id"] != "m1" || got["body"] != "AAH/" || got["body_encoding"] != "base64" || got["parked_at"] != "2025-03-01T12:00:00Z" ||
		got["exported_at"] != "2025-03-01T13:00:00Z" || got["schema"] != float64(1) || got["retry_count"] != float64(3) ||
		props["content_type"] != "application/json" {
		t.Errorf("line %v", got)
	}
	if bare["id"] != "m2" || bare["parked_at"] != nil {
		t.Errorf("a message with no parked time: %v; want parked_at null", bare)
	}
	failing := errors.New("disk full")
	if err := NewJSONLines(&out, func() error { return failing }, time.Now).Sync(); !errors.Is(err, failing) {
		t.Errorf("sync: %v, want %v", err, failing)
	}
}

// TestMost: what a group's row shows of its origins, reasons and
// policies: the value counted most, the least one on a tie (the same row
// on every reading), and how many others there are.
func TestMost(t *testing.T) {
	for _, tc := range []struct {
		counts map[string]int
		value  string
		others int
	}{
		{nil, "", 0},
		{map[string]int{"orders": 3}, "orders", 0},
		{map[string]int{"orders": 1, "payments": 4, "billing": 2}, "payments", 2},
		{map[string]int{"payments": 2, "orders": 2, "zeta": 1}, "orders", 2},
		{map[string]int{"": 5, "orders": 1}, "", 1},
	} {
		if value, others := Most(tc.counts); value != tc.value || others != tc.others {
			t.Errorf("Most(%v) = %q, %d; want %q, %d", tc.counts, value, others, tc.value, tc.others)
		}
	}
}
