package e2e

import (
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/events"
)

// subscribe binds a new queue of the test's to exchange with key and
// returns its name.
func (e *testEnv) subscribe(exchange, key string, args amqp.Table) string {
	e.t.Helper()
	q := e.Prefix + "sub." + key
	if _, err := e.Ch.QueueDeclare(q, true, false, false, false, args); err != nil {
		e.t.Fatal(err)
	}
	if err := e.Ch.QueueBind(q, key, exchange, false, nil); err != nil {
		e.t.Fatal(err)
	}
	return q
}

func TestParkEventsArePublished(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	exchange := e.Prefix + "events"
	e.Vars["REBOUND_EVENTS_EXCHANGE"] = exchange
	e.startInProcess()
	e.rejectAll(e.App)
	sub := e.subscribe(exchange, "parked.non-retryable.#", nil)

	e.publish(amqp.Publishing{MessageId: "order-8812", Body: []byte("secret body"),
		Headers: amqp.Table{"x-retry-non-retryable": true, "x-retry-error": "SchemaError: field total missing"}})
	e.parked(1, 30*time.Second)
	d := e.Get(sub, 30*time.Second)
	if want := "parked.non-retryable." + e.App; d.RoutingKey != want {
		t.Errorf("routing key %q, want %q", d.RoutingKey, want)
	}
	var ev events.Parked
	if err := json.Unmarshal(d.Body, &ev); err != nil {
		t.Fatalf("event %q: %v", d.Body, err)
	}
	parkedAt, err := time.Parse(time.RFC3339, ev.ParkedAt)
	if err != nil || time.Since(parkedAt) > time.Minute || time.Until(parkedAt) > time.Second {
		t.Errorf("parked_at %q: %v", ev.ParkedAt, err)
	}
	want := events.Parked{Schema: 1, MessageID: "order-8812", Origin: e.App, Reason: "non-retryable", Policy: "default",
		Error: "SchemaError: field total missing", ParkedAt: ev.ParkedAt, Group: ev.Group}
	if ev != want {
		t.Errorf("event %+v, want %+v", ev, want)
	}
	var fields map[string]any
	_ = json.Unmarshal(d.Body, &fields)
	for _, k := range []string{"message_id", "origin", "reason", "policy", "group", "error", "retry_count", "parked_at", "schema"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("event has no %q: %s", k, d.Body)
		}
	}
	if len(fields) != 9 {
		t.Errorf("event has %d fields, want the 9 of schema 1 and never the body: %s", len(fields), d.Body)
	}
	if got := e.metricBecomes(`rebound_events_total{outcome="published"}`, "1"); got != "1" {
		t.Errorf("events published %q, want 1", got)
	}
}

// An event that cannot be published is counted and never holds up or
// loses its message: the exchange deleted under rebound, or a subscriber
// queue full with reject-publish (the broker nacks the event).
func TestParkEventsThatFailNeverHoldUpParks(t *testing.T) {
	t.Parallel()
	for _, tc := range []string{"missing exchange", "full subscriber"} {
		t.Run(tc, func(t *testing.T) {
			t.Parallel()
			e := newTestEnv(t, nil)
			exchange := e.Prefix + "events"
			e.Vars["REBOUND_EVENTS_EXCHANGE"] = exchange
			e.startInProcess()
			e.rejectAll(e.App)
			if tc == "missing exchange" {
				if err := e.Ch.ExchangeDelete(exchange, false, false); err != nil {
					t.Fatal(err)
				}
			} else {
				full := e.subscribe(exchange, "parked.#", amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
				e.Publish(full, amqp.Publishing{Body: []byte("filler")})
			}
			const n = 5
			for i := range n {
				e.publish(amqp.Publishing{MessageId: string(rune('a' + i)), Headers: amqp.Table{"x-retry-non-retryable": true}})
			}
			if got := len(e.parked(n, 30*time.Second)); got != n {
				t.Fatalf("%d of %d parked", got, n)
			}
			if got := e.metricBecomes(`rebound_events_total{outcome="failed"}`, "5"); got != "5" {
				t.Errorf("failed events %q, want 5", got)
			}
			if got := e.metric(`rebound_messages_parked_total{policy="default",reason="non-retryable"}`); got != "5" {
				t.Errorf("parked %q, want 5", got)
			}
		})
	}
}

// otlpReceiver is an OTLP/HTTP trace receiver: it decodes the protobuf
// requests the exporter sends and keeps their spans.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	var export coltracepb.ExportTraceServiceRequest
	if err == nil && req.URL.Path == "/v1/traces" && req.Header.Get("Content-Type") == "application/x-protobuf" {
		err = proto.Unmarshal(body, &export)
	}
	if err != nil || req.URL.Path != "/v1/traces" {
		http.Error(w, "not an OTLP/HTTP protobuf trace export", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range export.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

func (r *otlpReceiver) named(name string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func spanAttr(s *tracepb.Span, key string) any {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			switch v := kv.Value.Value.(type) {
			case *commonpb.AnyValue_StringValue:
				return v.StringValue
			case *commonpb.AnyValue_IntValue:
				return v.IntValue
			}
		}
	}
	return nil
}

// TestTracesFollowAMessageAcrossRetries runs the rebound binary with an
// OTLP endpoint: a message retried twice, then parked, shows three
// process spans in the producer's trace, each the child of the
// producer's span, each with its publish child; the copies keep the
// producer's traceparent.
func TestTracesFollowAMessageAcrossRetries(t *testing.T) {
	t.Parallel()
	receiver := &otlpReceiver{}
	collector := httptest.NewServer(receiver)
	defer collector.Close()
	e := newTestEnv(t, with(fastLoop, "OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL, "OTEL_BSP_SCHEDULE_DELAY", "50",
		"OTEL_SERVICE_NAME", "rebound-test"))
	e.startBinary()
	r := e.rejectAll(e.App)

	const traceID, producerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	traceparent := "00-" + traceID + "-" + producerSpan + "-01"
	e.publish(amqp.Publishing{MessageId: "order-8812", Headers: amqp.Table{"traceparent": traceparent}})
	e.parked(1, 30*time.Second)
	for _, a := range r.seen() {
		if a.d.Headers["traceparent"] != traceparent {
			t.Errorf("attempt carries traceparent %v, want the producer's %s untouched", a.d.Headers["traceparent"], traceparent)
		}
	}

	processName := "process " + e.Vars["REBOUND_INBOX_QUEUE"]
	if !brokertest.Await(30*time.Second, func() bool { return len(receiver.named(processName)) >= 3 }) {
		t.Fatalf("%d process spans exported, want 3", len(receiver.named(processName)))
	}
	process := receiver.named(processName)
	publishBySpan := map[string]*tracepb.Span{}
	brokertest.Await(10*time.Second, func() bool {
		receiver.mu.Lock()
		defer receiver.mu.Unlock()
		for _, s := range receiver.spans {
			if s.Kind == tracepb.Span_SPAN_KIND_PRODUCER {
				publishBySpan[hex.EncodeToString(s.ParentSpanId)] = s
			}
		}
		return len(publishBySpan) >= 3
	})
	decisions := map[string]int{}
	for _, s := range process {
		if got := hex.EncodeToString(s.TraceId); got != traceID {
			t.Errorf("process span in trace %s, want the producer's %s", got, traceID)
		}
		if got := hex.EncodeToString(s.ParentSpanId); got != producerSpan {
			t.Errorf("process span's parent %s, want the producer's span %s", got, producerSpan)
		}
		if s.Kind != tracepb.Span_SPAN_KIND_CONSUMER {
			t.Errorf("process span kind %v", s.Kind)
		}
		if spanAttr(s, "messaging.destination.name") != e.App || spanAttr(s, "messaging.message.id") != "order-8812" ||
			spanAttr(s, "messaging.system") != "rabbitmq" || spanAttr(s, "rebound.policy") != "default" {
			t.Errorf("process span attributes %v", s.Attributes)
		}
		decision, _ := spanAttr(s, "rebound.decision").(string)
		decisions[decision]++
		if decision == "park" && (spanAttr(s, "rebound.parked_reason") != "max-retries" || s.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR) {
			t.Errorf("park span: reason %v, status %v", spanAttr(s, "rebound.parked_reason"), s.Status)
		}
		if publishBySpan[hex.EncodeToString(s.SpanId)] == nil {
			t.Errorf("process span %x has no publish child", s.SpanId)
		}
	}
	if decisions["retry"] != 2 || decisions["park"] != 1 {
		t.Errorf("decisions %v, want 2 retries and 1 park", decisions)
	}
}
