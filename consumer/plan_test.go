package consumer

import (
	"maps"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/policy"
	"github.com/rebound-mq/rebound/republisher"
)

func TestPlan(t *testing.T) {
	topo := republisher.Topology{
		InboxQueue: "rebound.inbox", DeadLetterExchange: "rebound.dlx", DelayExchange: "rebound.delay",
		DelayQueuePrefix: "rebound.delay.", ParkingQueue: "rebound.parked",
	}
	codec := headers.NewCodec(headers.DefaultNames())
	n := codec.Names
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	started := now.Add(-time.Hour)
	died := now.Add(-time.Second)

	// failed is a message as the inbox delivers it after the orders queue
	// rejected it once more: it has been retried twice, the last time
	// through the 2s delay queue, and it carries every routing header and
	// dead-letter header a producer, an earlier rebound or the broker may
	// have put on it.
	failed := func() amqp.Delivery {
		return amqp.Delivery{
			Headers: amqp.Table{
				"tenant":                 "acme",
				n.Error:                  "timeout",
				n.RetryCount:             int64(2),
				n.TaskStartedAt:          started.UnixMilli(),
				n.LastDelay:              int64(2000),
				n.OriginQueue:            "orders",
				"CC":                     []any{"billing"},
				"BCC":                    []any{"audit"},
				"rebound-delay-ms":       int64(2000),
				headers.XFirstDeathQueue: "orders", headers.XFirstDeathReason: "rejected", "x-first-death-exchange": "",
				"x-last-death-queue": "orders", "x-last-death-reason": "rejected", "x-last-death-exchange": "",
				headers.XDeath: []any{
					amqp.Table{"queue": "orders", "reason": "rejected", "count": int64(3), "exchange": "", "routing-keys": []any{"orders"}, "time": died},
					amqp.Table{"queue": "rebound.delay.2000", "reason": "expired", "count": int64(1), "exchange": "rebound.delay.2000",
						"routing-keys": []any{"orders"}, "time": died.Add(-2 * time.Second)},
				},
			},
			ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: amqp.Persistent, Priority: 4,
			CorrelationId: "c-1", ReplyTo: "replies", Expiration: "60000", MessageId: "m-1", Timestamp: started,
			Type: "order.created", UserId: "orders-service", AppId: "orders", Body: []byte(`{"id":1}`),
		}
	}
	// leftover is failed with the parked headers a producer copied from a
	// parked message.
	leftover := func() amqp.Delivery {
		d := failed()
		d.Headers[n.ParkedReason] = "max-retries"
		d.Headers[n.ParkedAt] = started.UnixMilli()
		return d
	}
	// bare is a message published straight into the inbox with no header
	// and no property.
	bare := func() amqp.Delivery { return amqp.Delivery{MessageId: "m-2", Body: []byte("?")} }

	for _, tc := range []struct {
		name     string
		d        amqp.Delivery
		decision policy.Decision
		dest     republisher.Destination
		headers  map[string]any // expected values; nil: absent
	}{
		{
			name: "park after max retries", d: failed(), decision: policy.Decision{Reason: policy.MaxRetries},
			dest: republisher.Direct(topo.ParkingQueue),
			headers: map[string]any{
				n.ParkedReason: "max-retries", n.ParkedAt: now.UnixMilli(), n.RetryCount: int64(2),
				n.TaskStartedAt: started.UnixMilli(), n.LastDelay: int64(2000), n.OriginQueue: "orders",
				n.FirstDeathReason: "rejected", n.FirstDeathQueue: "orders",
			},
		},
		{
			name: "park with no origin", d: bare(), decision: policy.Decision{Reason: policy.UnknownOrigin},
			dest: republisher.Direct(topo.ParkingQueue),
			headers: map[string]any{
				n.ParkedReason: "unknown-origin", n.ParkedAt: now.UnixMilli(), n.RetryCount: int64(0),
				n.TaskStartedAt: now.UnixMilli(), n.OriginQueue: nil, n.LastDelay: nil,
				n.FirstDeathReason: nil, n.FirstDeathQueue: nil,
			},
		},
		{
			name: "retry at once", d: failed(), decision: policy.Decision{Retry: true},
			dest: republisher.Direct("orders"),
			headers: map[string]any{
				n.RetryCount: int64(3), n.LastDelay: int64(0), n.TaskStartedAt: started.UnixMilli(), n.OriginQueue: "orders",
				n.FirstDeathReason: "rejected", n.FirstDeathQueue: "orders", n.ParkedReason: nil, n.ParkedAt: nil,
			},
		},
		{
			// The delay queue holds the rounded delay; the header carries the
			// delay as drawn, which decorrelated jitter grows the next from.
			name: "retry after a delay", d: failed(), decision: policy.Decision{Retry: true, Delay: 1500 * time.Millisecond, Drawn: 1534 * time.Millisecond},
			dest: topo.Delayed(1500*time.Millisecond, "orders"),
			headers: map[string]any{
				n.RetryCount: int64(3), n.LastDelay: int64(1534), n.TaskStartedAt: started.UnixMilli(), n.OriginQueue: "orders",
				n.FirstDeathReason: "rejected", n.FirstDeathQueue: "orders", n.ParkedReason: nil, n.ParkedAt: nil,
			},
		},
		{
			name: "retry drops parked headers", d: leftover(), decision: policy.Decision{Retry: true, Delay: 1500 * time.Millisecond},
			dest: topo.Delayed(1500*time.Millisecond, "orders"),
			headers: map[string]any{
				n.RetryCount: int64(3), n.ParkedReason: nil, n.ParkedAt: nil,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			original := maps.Clone(tc.d.Headers)
			state, _ := codec.Decode(tc.d.Headers, tc.d.Timestamp, now, nil)
			dest, msg := Plan(topo, codec, tc.d, state, tc.decision, now)

			if dest != tc.dest {
				t.Errorf("destination %+v, want %+v", dest, tc.dest)
			}
			for name, want := range tc.headers {
				got, ok := msg.Headers[name]
				switch {
				case want == nil && ok:
					t.Errorf("header %s = %#v, want absent", name, got)
				case want != nil && !reflect.DeepEqual(got, want):
					t.Errorf("header %s = %#v, want %#v", name, got, want)
				}
			}
			// Never carried: routing headers (a copy is routed by its
			// destination alone) and the broker's dead-letter headers.
			for _, name := range []string{"CC", "BCC", "rebound-delay-ms", headers.XDeath, headers.XFirstDeathQueue, headers.XFirstDeathReason,
				"x-first-death-exchange", "x-last-death-queue", "x-last-death-reason", "x-last-death-exchange"} {
				if v, ok := msg.Headers[name]; ok {
					t.Errorf("header %s = %#v, want it stripped", name, v)
				}
			}
			// Application headers are kept.
			for name, v := range tc.d.Headers {
				if name == "tenant" || name == n.Error {
					if !reflect.DeepEqual(msg.Headers[name], v) {
						t.Errorf("application header %s = %#v, want %#v kept", name, msg.Headers[name], v)
					}
				}
			}
			if err := msg.Headers.Validate(); err != nil {
				t.Errorf("headers do not validate as an AMQP table: %v", err)
			}
			// Properties are kept, but expiration and user id.
			want := amqp.Publishing{
				ContentType: tc.d.ContentType, ContentEncoding: tc.d.ContentEncoding, DeliveryMode: tc.d.DeliveryMode,
				Priority: tc.d.Priority, CorrelationId: tc.d.CorrelationId, ReplyTo: tc.d.ReplyTo, MessageId: tc.d.MessageId,
				Timestamp: tc.d.Timestamp, Type: tc.d.Type, AppId: tc.d.AppId, Body: tc.d.Body,
			}
			got := msg
			got.Headers = nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("properties\n got %+v\nwant %+v", got, want)
			}
			// The delivery's own table is left as it was.
			if !reflect.DeepEqual(tc.d.Headers, original) {
				t.Errorf("Plan changed the delivery's headers:\n got %#v\nwant %#v", tc.d.Headers, original)
			}
		})
	}
}
