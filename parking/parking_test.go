package parking

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
)

// The operations themselves run against a real broker in the root
// package's TestParked* tests; these cover what needs none.

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
		{"id", Filter{ID: "m1"}, m, true},
		{"other id", Filter{ID: "m2"}, m, false},
		{"older than 1h", Filter{OlderThan: time.Hour}, m, true},
		{"not older than 3h", Filter{OlderThan: 3 * time.Hour}, m, false},
		{"unknown parked-at never older", Filter{OlderThan: time.Hour}, unknownAt, false},
		{"all conditions", Filter{Reason: "max-retries", Origin: "orders", OlderThan: time.Hour, Limit: 1}, m, true},
	} {
		if got := tc.f.Match(tc.m, now); got != tc.want {
			t.Errorf("%s: Match = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestParkedDecode(t *testing.T) {
	now := time.Now()
	parkedAt := now.Add(-time.Minute).Truncate(time.Millisecond)
	q := Queue{Codec: headers.NewCodec(headers.DefaultNames())}
	m := q.Decode(amqp.Delivery{MessageId: "m1", Headers: amqp.Table{
		"x-retry-count": int64(7), "x-retry-origin-queue": "orders", "x-retry-error": []byte("boom"),
		"x-retry-parked-reason": "max-retries", "x-retry-parked-at": parkedAt.UnixMilli(),
		"x-task-started-at": parkedAt.Add(-time.Hour).UnixMilli(),
	}}, now)
	if m.Retries != 7 || m.Origin != "orders" || m.Error != "boom" || m.Reason != "max-retries" ||
		!m.ParkedAt.Equal(parkedAt) || !m.StartedAt.Equal(parkedAt.Add(-time.Hour)) {
		t.Errorf("Decode = %+v", m)
	}
	if m := q.Decode(amqp.Delivery{}, now); m.Reason != "" || !m.ParkedAt.IsZero() || m.Origin != "" {
		t.Errorf("Decode of a bare delivery = %+v", m)
	}
}
