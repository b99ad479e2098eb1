package e2e

import (
	"cmp"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/rebound-mq/rebound/consumer"
	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/eventstest"
	"github.com/rebound-mq/rebound/internal/group"
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

// startWithEvents starts rebound in-process, publishing park events to an
// exchange of the test's own, and an application rejecting every message.
func startWithEvents(t *testing.T) (e *testEnv, exchange string) {
	t.Helper()
	e = newTestEnv(t, nil)
	exchange = e.Prefix + "events"
	e.Vars["REBOUND_EVENTS_EXCHANGE"] = exchange
	e.startInProcess()
	e.rejectAll(e.App)
	return e, exchange
}

func TestParkEventsArePublished(t *testing.T) {
	t.Parallel()
	e, exchange := startWithEvents(t)
	sub := e.subscribe(exchange, "parked.non-retryable.#", nil)

	e.publish(amqp.Publishing{MessageId: "order-8812", Body: []byte("secret body"),
		Headers: amqp.Table{"x-retry-non-retryable": true, "x-retry-error": "SchemaError: field total missing"}})
	e.parked(1, 30*time.Second)
	d := e.Get(sub, 30*time.Second)
	if want := "parked.non-retryable." + e.App; d.RoutingKey != want {
		t.Errorf("routing key %q, want %q", d.RoutingKey, want)
	}
	if err := eventstest.Validate(d.Body); err != nil {
		t.Error(err)
	}
	var ce consumer.CloudEvent
	if err := json.Unmarshal(d.Body, &ce); err != nil {
		t.Fatalf("event %q: %v", d.Body, err)
	}
	ev := ce.Data
	parkedAt, err := time.Parse(time.RFC3339, ev.ParkedAt)
	if err != nil || time.Since(parkedAt) > time.Minute || time.Until(parkedAt) > time.Second {
		t.Errorf("parked_at %q: %v", ev.ParkedAt, err)
	}
	want := consumer.ParkedEvent{MessageID: "order-8812", Origin: e.App, Reason: "non-retryable", Policy: "default",
		Error: "SchemaError: field total missing", ParkedAt: ev.ParkedAt, Group: group.Of(e.App, "SchemaError: field total missing", "")}
	if ev != want {
		t.Errorf("event data %+v, want %+v", ev, want)
	}
	if ce.Type != "io.github.rebound-mq.parked.non-retryable" || ce.Subject != e.App || ce.Time != ev.ParkedAt ||
		!strings.HasPrefix(ce.Source, "/rebound/") || !strings.HasSuffix(ce.Source, "/"+e.Vars["REBOUND_INBOX_QUEUE"]) || d.MessageId != ce.ID {
		t.Errorf("CloudEvent %+v (message id %q)", ce, d.MessageId)
	}
	if strings.Contains(string(d.Body), "secret body") {
		t.Errorf("the event carries the body: %s", d.Body)
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
			e, exchange := startWithEvents(t)
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
			if got := e.metricSumBecomes("rebound_messages_parked_total", 5, `policy="default"`, `reason="non-retryable"`, `vhost="`+e.vhost()+`"`); got != 5 {
				t.Errorf("parked %d, want 5", got)
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
// OTLP endpoint: a message retried three times, then parked, shows seven
// process spans in the producer's trace (each retry's decision, each
// delayed copy's return through the inbox, the park), each the child of the
// producer's span, each with its publish child; the copies keep the
// producer's traceparent.
func TestTracesFollowAMessageAcrossRetries(t *testing.T) {
	t.Parallel()
	receiver := &otlpReceiver{}
	collector := httptest.NewServer(receiver)
	defer collector.Close()
	e := newTestEnv(t, with(fastLoop, "REBOUND_MAX_RETRIES", "3", "REBOUND_BACKOFF", "exponential", "REBOUND_MIN_DELAY", "100ms",
		"OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL, "OTEL_BSP_SCHEDULE_DELAY", "50", "OTEL_SERVICE_NAME", "rebound-test"))
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
	if !brokertest.Await(30*time.Second, func() bool { return len(receiver.named(processName)) >= 7 }) {
		t.Fatalf("%d process spans exported, want 7", len(receiver.named(processName)))
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
		return len(publishBySpan) >= 7
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
		// OpenTelemetry's conventions for RabbitMQ: the exchange the
		// delivery came through, its routing key, the queue read.
		if spanAttr(s, "rebound.origin_queue") != e.App || spanAttr(s, "messaging.message.id") != "order-8812" ||
			spanAttr(s, "messaging.system") != "rabbitmq" || spanAttr(s, "rebound.policy") != "default" ||
			spanAttr(s, "messaging.destination.subscription.name") != e.Vars["REBOUND_INBOX_QUEUE"] {
			t.Errorf("process span attributes %v", s.Attributes)
		}
		decision, _ := spanAttr(s, "rebound.decision").(string)
		if decision != "return" && (spanAttr(s, "messaging.destination.name") != e.Vars["REBOUND_DEAD_LETTER_EXCHANGE"] ||
			spanAttr(s, "messaging.rabbitmq.destination.routing_key") != e.App) {
			t.Errorf("a rejected delivery's process span: exchange %v, routing key %v; want %s, %s", spanAttr(s, "messaging.destination.name"),
				spanAttr(s, "messaging.rabbitmq.destination.routing_key"), e.Vars["REBOUND_DEAD_LETTER_EXCHANGE"], e.App)
		}
		decisions[decision]++
		if decision == "park" && (spanAttr(s, "rebound.parked_reason") != "max-retries" || s.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR ||
			spanAttr(s, "rebound.group") != group.Of(e.App, "", "max-retries")) {
			t.Errorf("park span: reason %v, status %v, group %v", spanAttr(s, "rebound.parked_reason"), s.Status, spanAttr(s, "rebound.group"))
		}
		if publishBySpan[hex.EncodeToString(s.SpanId)] == nil {
			t.Errorf("process span %x has no publish child", s.SpanId)
		}
	}
	if decisions["retry"] != 3 || decisions["return"] != 3 || decisions["park"] != 1 {
		t.Errorf("decisions %v, want 3 retries, their 3 returns and 1 park", decisions)
	}
	if path := os.Getenv("REBOUND_TRACE_PICTURE"); path != "" && !t.Failed() {
		receiver.mu.Lock()
		defer receiver.mu.Unlock()
		if err := os.WriteFile(path, traceSVG(receiver.spans, strings.NewReplacer(e.Prefix, "rebound.").Replace), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// traceSVG draws spans as a waterfall on one time axis, one row each in
// the order they started, names passed through rename: the picture of
// docs/observability.md.
func traceSVG(spans []*tracepb.Span, rename func(string) string) []byte {
	spans = slices.Clone(spans)
	slices.SortFunc(spans, func(a, b *tracepb.Span) int { return cmp.Compare(a.StartTimeUnixNano, b.StartTimeUnixNano) })
	start, end := spans[0].StartTimeUnixNano, spans[0].EndTimeUnixNano
	for _, s := range spans {
		end = max(end, s.EndTimeUnixNano)
	}
	const left, width, row = 300, 560, 26
	x := func(ns uint64) float64 { return left + float64(ns-start)/float64(end-start)*width }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", left+width+20, row*(len(spans)+2))
	fmt.Fprintf(&b, `<text x="10" y="16" font-weight="bold">trace %x: one message, three retries and a park (%.2f s)</text>`+"\n", spans[0].TraceId, float64(end-start)/1e9)
	for i, s := range spans {
		y := row * (i + 1)
		color, indent := "#4c78a8", 10
		if s.Kind == tracepb.Span_SPAN_KIND_PRODUCER {
			color, indent = "#72b7b2", 30
		}
		if s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
			color = "#e45756"
		}
		label := rename(s.Name)
		if d, ok := spanAttr(s, "rebound.decision").(string); ok {
			label += fmt.Sprintf(" [%s", d)
			if ms, ok := spanAttr(s, "rebound.delay_ms").(int64); ok && d == "retry" {
				label += fmt.Sprintf(" in %d ms", ms)
			}
			if r, ok := spanAttr(s, "rebound.parked_reason").(string); ok {
				label += ": " + r
			}
			label += "]"
		}
		w := max(x(s.EndTimeUnixNano)-x(s.StartTimeUnixNano), 2)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text><rect x="%.1f" y="%d" width="%.1f" height="16" fill="%s"/>`+"\n",
			indent, y+16, html.EscapeString(label), x(s.StartTimeUnixNano), y+4, w, color)
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// TestReplayIsTraced runs `rebound parked replay` (the binary) with an
// OTLP endpoint: the replayed message's span joins the message's own
// trace, its parent the producer's span.
func TestReplayIsTraced(t *testing.T) {
	t.Parallel()
	receiver := &otlpReceiver{}
	collector := httptest.NewServer(receiver)
	defer collector.Close()
	e := newTestEnv(t, nil)
	e.startInProcess()
	e.rejectAll(e.App)
	const traceID, producerSpan = "5bf92f3577b34da6a3ce929d0e0e4736", "10f067aa0ba902b7"
	e.publish(amqp.Publishing{MessageId: "order-9", Headers: amqp.Table{
		"traceparent": "00-" + traceID + "-" + producerSpan + "-01", "x-retry-non-retryable": true}})
	e.parked(1, 30*time.Second) // takes it out of the parking queue: put it back for the replay
	e.Publish(e.Vars["REBOUND_PARKING_QUEUE"], amqp.Publishing{MessageId: "order-9", Headers: amqp.Table{
		"traceparent": "00-" + traceID + "-" + producerSpan + "-01", "x-retry-parked-reason": "non-retryable",
		"x-retry-origin-queue": e.App, "x-retry-non-retryable": true}})

	cmd := exec.Command(binary(t), "parked", "replay", "--reason", "non-retryable")
	cmd.Env = append(os.Environ(), e.Environ()...)
	cmd.Env = append(cmd.Env, "OTEL_EXPORTER_OTLP_ENDPOINT="+collector.URL)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("parked replay: %v\n%s", err, out)
	}
	name := "replay " + e.App
	if !brokertest.Await(10*time.Second, func() bool { return len(receiver.named(name)) == 1 }) {
		t.Fatalf("%d %q spans exported, want 1 (the command flushes before it exits)", len(receiver.named(name)), name)
	}
	s := receiver.named(name)[0]
	if hex.EncodeToString(s.TraceId) != traceID || hex.EncodeToString(s.ParentSpanId) != producerSpan {
		t.Errorf("replay span in trace %x under %x, want the message's %s under %s", s.TraceId, s.ParentSpanId, traceID, producerSpan)
	}
	if spanAttr(s, "messaging.operation.name") != "replay" || spanAttr(s, "messaging.message.id") != "order-9" ||
		spanAttr(s, "messaging.destination.name") == nil || spanAttr(s, "messaging.rabbitmq.destination.routing_key") == nil {
		t.Errorf("replay span attributes %v", s.Attributes)
	}
}

// TestFlushIsTraced runs `rebound delayed flush` (the binary) with an OTLP
// endpoint: the copy it sends back early gets a flush span in the
// message's own trace, its parent the producer's span.
func TestFlushIsTraced(t *testing.T) {
	t.Parallel()
	receiver := &otlpReceiver{}
	collector := httptest.NewServer(receiver)
	defer collector.Close()
	e := newTestEnv(t, map[string]string{"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "10m"})
	e.startInProcess()
	const traceID, producerSpan = "6bf92f3577b34da6a3ce929d0e0e4736", "20f067aa0ba902b7"
	e.Publish(e.Vars["REBOUND_INBOX_QUEUE"], amqp.Publishing{MessageId: "order-10", Body: []byte("x"), Headers: amqp.Table{
		"traceparent": "00-" + traceID + "-" + producerSpan + "-01", "x-retry-origin-queue": e.App}})
	waiting := func() int {
		out, _, err := e.cli("delayed", "--format", "json")
		var doc struct {
			Total int `json:"total"`
		}
		if err != nil || json.Unmarshal([]byte(out), &doc) != nil {
			return -1
		}
		return doc.Total
	}
	if !brokertest.Await(30*time.Second, func() bool { return waiting() == 1 }) {
		t.Fatalf("%d copies waiting in the delay queues, want 1", waiting())
	}

	cmd := exec.Command(binary(t), "delayed", "flush", "--origin", "^"+regexp.QuoteMeta(e.App)+"$", "--yes")
	cmd.Env = append(os.Environ(), e.Environ()...)
	cmd.Env = append(cmd.Env, "OTEL_EXPORTER_OTLP_ENDPOINT="+collector.URL)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "1 of 1 matching copies sent back") {
		t.Fatalf("delayed flush: %v\n%s", err, out)
	}
	flushed := func() []*tracepb.Span {
		receiver.mu.Lock()
		defer receiver.mu.Unlock()
		var out []*tracepb.Span
		for _, s := range receiver.spans {
			if strings.HasPrefix(s.Name, "flush ") {
				out = append(out, s)
			}
		}
		return out
	}
	if !brokertest.Await(10*time.Second, func() bool { return len(flushed()) == 1 }) {
		t.Fatalf("%d flush spans exported, want 1 (the command flushes before it exits)", len(flushed()))
	}
	s := flushed()[0]
	if hex.EncodeToString(s.TraceId) != traceID || hex.EncodeToString(s.ParentSpanId) != producerSpan || s.Kind != tracepb.Span_SPAN_KIND_PRODUCER {
		t.Errorf("flush span in trace %x under %x, kind %v; want the message's %s under %s, producer", s.TraceId, s.ParentSpanId, s.Kind, traceID, producerSpan)
	}
	if spanAttr(s, "messaging.operation.name") != "flush" || spanAttr(s, "messaging.message.id") != "order-10" ||
		s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("flush span attributes %v, status %v", s.Attributes, s.Status)
	}
	if d := e.Get(e.App, 30*time.Second); d.MessageId != "order-10" {
		t.Errorf("flushed message %q, want order-10", d.MessageId)
	}
}
