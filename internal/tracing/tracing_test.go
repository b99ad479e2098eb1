package tracing

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

func TestEnabledOnlyWhenAnExporterIsAskedFor(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"nothing set", map[string]string{"OTEL_SERVICE_NAME": "payments"}, false},
		{"exporter otlp", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{"exporter list with otlp", map[string]string{"OTEL_TRACES_EXPORTER": "console,OTLP"}, true},
		{"exporter none wins over an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false},
		{"another exporter only", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := enabled(tc.env); got != tc.want {
				t.Errorf("Enabled(%v) = %v, want %v", tc.env, got, tc.want)
			}
		})
	}
}

func TestSetupOffRecordsNothing(t *testing.T) {
	tr, stop, err := Setup(context.Background(), map[string]string{}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer stop(context.Background())
	if tr != nil {
		t.Error("traces off, yet a tracer")
	}
	span := Start(tr, "rebound.inbox", amqp.Delivery{})
	span.Decided(Decision{})
	span.Publishing(tr, "x", "y")
	span.End(true, "confirmed")
	if span != nil {
		t.Error("a delivery's spans without a tracer")
	}
}

func TestSetupRefusesAProtocolItDoesNotSpeak(t *testing.T) {
	_, _, err := Setup(context.Background(), map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "test")
	if err == nil {
		t.Fatal("grpc accepted, but rebound exports over http/protobuf only")
	}
}

const producerParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestExtractReadsTheProducersContext(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers amqp.Table
		valid   bool
	}{
		{"string", amqp.Table{"traceparent": producerParent}, true},
		{"bytes", amqp.Table{"traceparent": []byte(producerParent)}, true},
		{"wrong type", amqp.Table{"traceparent": int64(7)}, false},
		{"garbage", amqp.Table{"traceparent": "00-zz-yy-01"}, false},
		{"absent", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := trace.SpanContextFromContext(extract(context.Background(), tc.headers))
			if sc.IsValid() != tc.valid {
				t.Fatalf("span context valid = %v, want %v", sc.IsValid(), tc.valid)
			}
			if tc.valid && sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
				t.Errorf("trace id %s", sc.TraceID())
			}
		})
	}
}

func recorder(t *testing.T) (trace.Tracer, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp.Tracer(scopeName), rec
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestDeliverySpans(t *testing.T) {
	delivery := amqp.Delivery{MessageId: "order-8812", Body: []byte("hello"), DeliveryTag: 7,
		Exchange: "rebound.dlx", RoutingKey: "payments.capture", Headers: amqp.Table{"traceparent": producerParent}}
	for _, tc := range []struct {
		name      string
		decision  Decision
		confirmed bool
		status    codes.Code
	}{
		{"retried", Decision{Origin: "payments.capture", Retry: true, Delay: 32 * time.Second, RetryCount: 2, Policy: "payments", Group: "0123456789ab"}, true, codes.Unset},
		{"parked", Decision{Origin: "payments.capture", RetryCount: 10, Policy: "payments", ParkedReason: "max-retries"}, true, codes.Error},
		{"not confirmed", Decision{Origin: "payments.capture", Retry: true, Delay: time.Second, Policy: "default"}, false, codes.Error},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, rec := recorder(t)
			span := Start(tr, "rebound.inbox", delivery)
			span.Decided(tc.decision)
			span.Publishing(tr, "rebound.delay.32000", "payments.capture")
			outcome := "confirmed"
			if !tc.confirmed {
				outcome = "nack"
			}
			span.End(tc.confirmed, outcome)

			ended := rec.Ended()
			if len(ended) != 2 {
				t.Fatalf("%d spans ended, want process and publish", len(ended))
			}
			publish, process := ended[0], ended[1]
			if process.Name() != "process rebound.inbox" || process.SpanKind() != trace.SpanKindConsumer {
				t.Errorf("process span %q kind %v", process.Name(), process.SpanKind())
			}
			if process.Parent().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || process.Parent().SpanID().String() != "00f067aa0ba902b7" {
				t.Errorf("process span's parent %v is not the producer's", process.Parent())
			}
			if publish.Parent().SpanID() != process.SpanContext().SpanID() || publish.SpanKind() != trace.SpanKindProducer {
				t.Errorf("publish span is not the process span's producer child: parent %v kind %v", publish.Parent(), publish.SpanKind())
			}
			a := attrs(process)
			want := map[attribute.Key]any{
				"rebound.origin_queue": "payments.capture", "rebound.retry_count": int64(tc.decision.RetryCount),
				"rebound.policy": tc.decision.Policy, "rebound.delay_ms": tc.decision.Delay.Milliseconds(),
			}
			if tc.decision.Retry {
				want["rebound.decision"] = "retry"
			} else {
				want["rebound.decision"] = "park"
				want["rebound.parked_reason"] = tc.decision.ParkedReason
			}
			if tc.decision.Group != "" {
				want["rebound.group"] = tc.decision.Group
			}
			for k, v := range want {
				if got := a[k].AsInterface(); got != v {
					t.Errorf("%s = %v, want %v", k, got, v)
				}
			}
			if process.Status().Code != tc.status {
				t.Errorf("process status %v, want %v", process.Status(), tc.status)
			}
			// The message reached the inbox through the dead-letter
			// exchange, with its origin queue's name as routing key.
			wantMessaging(t, "process", process, semconv.MessagingSystemRabbitMQ,
				semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"),
				semconv.MessagingDestinationName("rebound.dlx"), semconv.MessagingRabbitMQDestinationRoutingKey("payments.capture"),
				semconv.MessagingDestinationSubscriptionName("rebound.inbox"), semconv.MessagingMessageID("order-8812"),
				semconv.MessagingMessageBodySize(5), semconv.MessagingRabbitMQMessageDeliveryTag(7))
			wantMessaging(t, "publish", publish, semconv.MessagingSystemRabbitMQ,
				semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("publish"),
				semconv.MessagingDestinationName("rebound.delay.32000"), semconv.MessagingRabbitMQDestinationRoutingKey("payments.capture"))
		})
	}
}

// wantMessaging checks a span's messaging attributes against the
// conventions' keys: exactly want, none missing, none more.
func wantMessaging(t *testing.T, name string, s sdktrace.ReadOnlySpan, want ...attribute.KeyValue) {
	t.Helper()
	got := map[attribute.Key]attribute.Value{}
	for k, v := range attrs(s) {
		if strings.HasPrefix(string(k), "messaging.") {
			got[k] = v
		}
	}
	for _, kv := range want {
		if v, ok := got[kv.Key]; !ok || v != kv.Value {
			t.Errorf("%s span: %s = %v (set: %v), want %v", name, kv.Key, v.Emit(), ok, kv.Value.Emit())
		}
		delete(got, kv.Key)
	}
	for k, v := range got {
		t.Errorf("%s span: %s = %v, which the conventions for RabbitMQ do not ask for here", name, k, v.Emit())
	}
}

// TestSpansThroughTheDefaultExchange: a copy sent through the default
// exchange names no exchange (messaging.destination.name is set, empty)
// and the queue as its routing key; a command's move does the same.
func TestSpansThroughTheDefaultExchange(t *testing.T) {
	tr, rec := recorder(t)
	d := amqp.Delivery{MessageId: "order-9", Exchange: "", RoutingKey: "rebound.parked"}
	span := Start(tr, "rebound.inbox", d)
	span.Decided(Decision{Origin: "orders", Retry: true, Returning: true})
	span.Publishing(tr, "", "orders")
	span.End(true, "confirmed")
	Move(tr, "replay", d, "", "orders")(true, "confirmed")
	Move(tr, "flush", d, "rebound.delay.1000", "")(true, "confirmed")
	ended := rec.Ended()
	if len(ended) != 4 {
		t.Fatalf("%d spans ended, want publish, process, replay and flush", len(ended))
	}
	wantMessaging(t, "publish", ended[0], semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("publish"),
		semconv.MessagingDestinationName(""), semconv.MessagingRabbitMQDestinationRoutingKey("orders"))
	wantMessaging(t, "process", ended[1], semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(""), semconv.MessagingRabbitMQDestinationRoutingKey("rebound.parked"),
		semconv.MessagingDestinationSubscriptionName("rebound.inbox"), semconv.MessagingMessageID("order-9"),
		semconv.MessagingMessageBodySize(0), semconv.MessagingRabbitMQMessageDeliveryTag(0))
	wantMessaging(t, "replay", ended[2], semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("replay"),
		semconv.MessagingDestinationName(""), semconv.MessagingRabbitMQDestinationRoutingKey("orders"),
		semconv.MessagingMessageID("order-9"))
	// An exchange with no routing key: the attribute is left out
	// ("conditionally required: if not empty").
	wantMessaging(t, "flush", ended[3], semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("flush"),
		semconv.MessagingDestinationName("rebound.delay.1000"), semconv.MessagingMessageID("order-9"))
}

// BenchmarkDeliverySpans is what tracing costs one delivery: off (no
// tracer, rebound's default), with a no-op tracer (what off would cost if
// rebound held one: it still reads the trace context) and on (recorded by
// the SDK, exported to nowhere).
func BenchmarkDeliverySpans(b *testing.B) {
	d := amqp.Delivery{MessageId: "order-8812", Body: make([]byte, 512), DeliveryTag: 7, Headers: amqp.Table{"traceparent": producerParent}}
	dec := Decision{Origin: "payments.capture", Retry: true, Delay: time.Second, RetryCount: 2, Policy: "payments"}
	for _, tc := range []struct {
		name string
		tr   trace.Tracer
	}{
		{"off", nil},
		{"no-op tracer", noop.NewTracerProvider().Tracer(scopeName)},
		{"on", sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder())).Tracer(scopeName)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				span := Start(tc.tr, "rebound.inbox", d)
				span.Decided(dec)
				span.Publishing(tc.tr, "rebound.delay.1000", "rebound.inbox")
				span.End(true, "confirmed")
			}
		})
	}
}
