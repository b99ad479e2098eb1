package route

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
)

// death is an x-death entry as the broker writes it.
func death(queue, reason string, keys ...any) amqp.Table {
	return amqp.Table{"queue": queue, "reason": reason, "count": int64(1), "exchange": "", "routing-keys": keys, "time": time.Unix(1, 0)}
}

func TestReturning(t *testing.T) {
	r := testRouter(nil)
	for _, tc := range []struct {
		name     string
		exchange string
		key      string
		deaths   []any
		want     bool
	}{
		{"expired from a delay queue back to the inbox", "", "in", []any{death("delay.1500", "expired", "in"), death("orders", "rejected", "orders")}, true},
		{"a failure", "dlx", "orders", []any{death("orders", "rejected", "orders")}, false},
		{"an earlier rebound's copy a consumer republished into the inbox", "", "in", []any{death("delay.1500", "expired", "orders")}, false},
		{"published to the dead-letter exchange", "dlx", "in", []any{death("delay.1500", "expired", "in")}, false},
		{"rejected, not expired", "", "in", []any{death("delay.1500", "rejected", "in")}, false},
		{"from a queue not rebound's", "", "in", []any{death("orders", "expired", "in")}, false},
		{"no record", "", "in", nil, false},
		{"a malformed record", "", "in", []any{"delay.1500"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := amqp.Delivery{Exchange: tc.exchange, RoutingKey: tc.key, Headers: amqp.Table{}}
			if tc.deaths != nil {
				d.Headers[headers.XDeath] = tc.deaths
			}
			if got := r.Returning(d); got != tc.want {
				t.Errorf("Returning = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTwin(t *testing.T) {
	r := testRouter(nil)
	for _, tc := range []struct {
		name    string
		headers amqp.Table
		want    string
	}{
		{"refused and dead-lettered", amqp.Table{headers.Attempt: "a.1", headers.XDeath: []any{death("orders", "maxlen", "orders")}}, "a.1"},
		{"rejected by its consumer", amqp.Table{headers.Attempt: "a.1", headers.XDeath: []any{death("orders", "rejected", "orders")}}, ""},
		{"no attempt", amqp.Table{headers.XDeath: []any{death("orders", "maxlen", "orders")}}, ""},
		{"not text", amqp.Table{headers.Attempt: int64(1), headers.XDeath: []any{death("orders", "maxlen", "orders")}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := r.Twin(amqp.Delivery{Headers: tc.headers}); got != tc.want {
				t.Errorf("Twin = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestReturnAndRefuse(t *testing.T) {
	r := testRouter(nil)
	n := r.Codec.Names
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	d := amqp.Delivery{Exchange: "", RoutingKey: "in", MessageId: "m1", Headers: amqp.Table{
		n.RetryCount: int64(2), n.OriginQueue: "orders", n.DueAt: now.UnixMilli(), n.LastDelay: int64(1000),
		n.TaskStartedAt: now.Add(-time.Minute).UnixMilli(),
		headers.XDeath:  []any{death("delay.1000", "expired", "in")},
	}}
	s, _ := r.Codec.Decode(d.Headers, d.Timestamp, now, nil)
	o := r.CheckOrigin(s.Origin, s.ClaimedOrigin)
	if o.Queue != "orders" || o.Refused != "" {
		t.Fatalf("origin %+v, want orders", o)
	}

	rt := r.Return(s, o, true)
	rt.Attempt = "a.1"
	dest, msg := r.Plan(d, s, rt, now)
	if dest != topology.Direct("orders") || msg.Headers[n.RetryCount] != int64(2) || msg.Headers[headers.Attempt] != "a.1" {
		t.Errorf("returning copy to %+v with count %v, attempt %v; want straight to orders, count 2, attempt a.1", dest, msg.Headers[n.RetryCount], msg.Headers[headers.Attempt])
	}
	if v, ok := msg.Headers[headers.XDeath]; ok {
		t.Errorf("returning copy carries %s = %v", headers.XDeath, v)
	}
	if v := msg.Headers[n.DueAt]; v != now.UnixMilli() {
		t.Errorf("returning copy carries %s = %v, want %d: when its delay ended", n.DueAt, v, now.UnixMilli())
	}
	if gone := r.Return(s, o, false); gone.Decision.Reason != policy.UnknownOrigin {
		t.Errorf("a copy whose origin is gone: %+v, want parked unknown-origin", gone.Decision)
	}

	// The policy has a retry count and no duration: a wait counts.
	waiting := r.Refuse(r.Return(s, o, true), s, now, 2*time.Second)
	dest, msg = r.Plan(d, s, waiting, now)
	if !waiting.Refused || dest != r.Topology.Delayed(2*time.Second) || msg.Headers[n.RetryCount] != int64(3) ||
		msg.Headers[n.DueAt] != now.Add(2*time.Second).UnixMilli() || msg.Headers[n.LastDelay] != int64(1000) {
		t.Errorf("waiting copy to %+v with count %v, due %v, last delay %v", dest, msg.Headers[n.RetryCount], msg.Headers[n.DueAt], msg.Headers[n.LastDelay])
	}
	s.Retries = 3
	if spent := r.Refuse(r.Return(s, o, true), s, now, 2*time.Second); spent.Decision.Reason != policy.OriginRefused || spent.Why == "" {
		t.Errorf("count spent: %+v, want parked origin-refused with a why", spent)
	}
	// A park or a delayed retry is not the origin's to refuse.
	delayed := Route{Policy: r.Policies.Default(), Decision: policy.Decision{Retry: true, Delay: time.Second}}
	if got := r.Refuse(delayed, s, now, time.Second); got.Refused || got.Decision != delayed.Decision {
		t.Errorf("Refuse changed a delayed retry: %+v", got)
	}
}

func TestWaitingOrigin(t *testing.T) {
	r := testRouter(nil)
	s := headers.State{Origin: "orders"}
	if got := r.WaitingOrigin(amqp.Delivery{RoutingKey: "in"}, s); got != "orders" {
		t.Errorf("a copy coming back through the inbox: %q, want its origin header", got)
	}
	if got := r.WaitingOrigin(amqp.Delivery{RoutingKey: "payments"}, s); got != "payments" {
		t.Errorf("an earlier rebound's copy: %q, want its routing key", got)
	}
}
