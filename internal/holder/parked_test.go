package holder

import (
	"reflect"
	"testing"
	"time"

	amqp10 "github.com/Azure/go-amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/policy"
)

// TestParkedFromTheAMQP10View: parked rebuilds the 0-9-1 message from the
// AMQP 1.0 view RabbitMQ 4.3 gives (as go-amqp decodes it): x- tables and
// arrays from the annotations, the others from HeldTables, the type from
// x-basic-type, the app id from group-id, a UUID id as urn:uuid; none of
// the broker's annotations.
func TestParkedFromTheAMQP10View(t *testing.T) {
	typ, app := "order.created", "shop"
	id := amqp10.UUID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	msg := &amqp10.Message{
		Annotations: amqp10.Annotations{
			"x-routing-key": "orders", "x-exchange": "rebound.delay.hold", "x-basic-type": typ,
			"x-nested": map[string]any{"a": map[string]any{"b": int64(1)}}, "x-arr": []any{int64(1), "two"},
			"x-small":          uint8(3),
			headers.HeldTables: map[string]any{"tenant": map[string]any{"id": int32(7)}, "arr": []any{"x"}, "plain": "not this"},
		},
		ApplicationProperties: map[string]any{"plain": "s"},
		Properties:            &amqp10.MessageProperties{MessageID: id, GroupID: &app},
		Data:                  [][]byte{[]byte("bo"), []byte("dy")},
	}
	v := verdict{Action: park, Origin: "orders", Reason: policy.Cancelled}
	pub := parked(msg, headers.DefaultNames(), v, time.UnixMilli(1e12))
	want := map[string]any{
		"x-nested": amqp.Table{"a": amqp.Table{"b": int64(1)}}, "x-arr": []any{int64(1), "two"}, "x-small": uint8(3),
		"tenant": amqp.Table{"id": int32(7)}, "arr": []any{"x"}, "plain": "s",
		"x-retry-origin-queue": "orders", "x-retry-parked-reason": "cancelled", "x-retry-parked-at": int64(1e12),
	}
	if !reflect.DeepEqual(map[string]any(pub.Headers), want) {
		t.Errorf("headers\n got %#v\nwant %#v", pub.Headers, want)
	}
	if pub.Type != typ || pub.AppId != app || pub.MessageId != "urn:uuid:"+id.String() || string(pub.Body) != "body" {
		t.Errorf("type %q app id %q message id %q body %q", pub.Type, pub.AppId, pub.MessageId, pub.Body)
	}
}

// TestHoldParkKeepsTablesAndArrays: a copy parked by a holder keeps its
// headers that hold tables and arrays, x- and others, as RabbitMQ 4.3
// hands it over AMQP 1.0 (the others through HeldTables, written by the
// sidecar as it publishes the copy).
func TestHoldParkKeepsTablesAndArrays(t *testing.T) {
	e := newHoldEnv(t)
	sent := amqp.Table{
		"tenant":   amqp.Table{"id": int32(7), "tags": []any{"a", int64(2)}, "deep": amqp.Table{"k": "v"}},
		"arr":      []any{"x", int32(1), amqp.Table{"k": "v"}},
		"x-nested": amqp.Table{"a": amqp.Table{"b": int64(1)}},
		"x-arr":    []any{int64(1), "two"},
		"plain":    "s",
	}
	h := amqp.Table{"x-retry-due-at": time.Now().UnixMilli()}
	for k, v := range sent {
		h[k] = v
	}
	headers.HoldTables(h)
	// The inbox as origin: parked, unknown-origin.
	c, err := e.Ch.PublishWithDeferredConfirm(e.rules.Topology.HoldExchange().Name, e.rules.Topology.InboxQueue, true, false,
		amqp.Publishing{MessageId: "tables", Headers: h, Type: "order.created", AppId: "shop", Body: []byte("body")})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Wait() {
		t.Fatal("copy not confirmed")
	}
	e.start(t)
	p := e.Get(e.rules.Topology.ParkingQueue, 60*time.Second)
	for k, v := range sent {
		if !reflect.DeepEqual(p.Headers[k], v) {
			t.Errorf("parked header %s = %#v, want %#v", k, p.Headers[k], v)
		}
	}
	if _, ok := p.Headers[headers.HeldTables]; ok {
		t.Errorf("parked copy carries %s", headers.HeldTables)
	}
	if p.Type != "order.created" || p.AppId != "shop" || p.MessageId != "tables" {
		t.Errorf("parked copy: type %q app id %q message id %q", p.Type, p.AppId, p.MessageId)
	}
}
