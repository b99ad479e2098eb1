package tracing

import (
	"cmp"
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// scopeName names rebound's tracer.
const scopeName = "github.com/rebound-mq/rebound"

// rebound's own span attributes, beside the messaging conventions'.
const (
	attrDecision     = attribute.Key("rebound.decision")
	attrDelayMS      = attribute.Key("rebound.delay_ms")
	attrRetryCount   = attribute.Key("rebound.retry_count")
	attrPolicy       = attribute.Key("rebound.policy")
	attrParkedReason = attribute.Key("rebound.parked_reason")
	attrGroup        = attribute.Key("rebound.group")
	// The queue a message goes back to: the conventions put the exchange
	// in messaging.destination.name and the queue a consumer reads in
	// messaging.destination.subscription.name, and this one is neither.
	attrOrigin = attribute.Key("rebound.origin_queue")
)

// rabbitMQDestination is where a message was sent, in the terms of
// OpenTelemetry's messaging conventions for RabbitMQ: the exchange as messaging.destination.name, "" for
// the default exchange (the attribute is set all the same), and the
// routing key beside it when there is one.
func rabbitMQDestination(exchange, routingKey string) []attribute.KeyValue {
	kv := []attribute.KeyValue{semconv.MessagingSystemRabbitMQ, semconv.MessagingDestinationName(exchange)}
	if routingKey != "" {
		kv = append(kv, semconv.MessagingRabbitMQDestinationRoutingKey(routingKey))
	}
	return kv
}

// Decision is what rebound decided for one message, as a span shows it.
type Decision struct {
	Origin       string // the queue the message goes back to: the destination the application sees
	Retry        bool
	Returning    bool // a delayed copy whose delay ended, on its way on to its origin
	Delay        time.Duration
	RetryCount   int // retries scheduled before this one
	Policy       string
	ParkedReason string
	Group        string
}

// delivery holds the spans of one inbox delivery: a process span, child of
// the producer's context, and the publish span of its copy. A nil
// Delivery (no tracer: traces off) does nothing, and one whose span is not
// recorded (not sampled) builds no attributes.
type delivery struct {
	ctx     context.Context
	process trace.Span
	publish trace.Span
	parked  bool
}

// Start begins the process span of a delivery from inbox; with a nil tr,
// it returns nil.
func Start(tr trace.Tracer, inbox string, d amqp.Delivery) *delivery {
	if tr == nil {
		return nil
	}
	ctx, span := tr.Start(extract(context.Background(), d.Headers), "process "+inbox,
		trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		// The exchange and routing key the message reached the inbox
		// by (the dead-letter exchange and the origin queue's name,
		// for a rejected message).
		span.SetAttributes(rabbitMQDestination(d.Exchange, d.RoutingKey)...)
		span.SetAttributes(semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"),
			semconv.MessagingDestinationSubscriptionName(inbox),
			semconv.MessagingMessageID(d.MessageId), semconv.MessagingMessageBodySize(len(d.Body)),
			semconv.MessagingRabbitMQMessageDeliveryTag(int(d.DeliveryTag)))
	}
	return &delivery{ctx: ctx, process: span}
}

// Decided records the decision on the process span.
func (t *delivery) Decided(dec Decision) {
	if t == nil {
		return
	}
	t.parked = !dec.Retry
	if !t.process.IsRecording() {
		return
	}
	decision := "retry"
	switch {
	case !dec.Retry:
		decision = "park"
	case dec.Returning:
		decision = "return"
	}
	t.process.SetAttributes(attrOrigin.String(dec.Origin), attrDecision.String(decision),
		attrDelayMS.Int64(dec.Delay.Milliseconds()), attrRetryCount.Int(dec.RetryCount), attrPolicy.String(dec.Policy))
	if dec.ParkedReason != "" {
		t.process.SetAttributes(attrParkedReason.String(dec.ParkedReason))
	}
	if dec.Group != "" {
		t.process.SetAttributes(attrGroup.String(dec.Group))
	}
}

// Publishing begins the publish span of the copy, sent to exchange with
// routingKey.
func (t *delivery) Publishing(tr trace.Tracer, exchange, routingKey string) {
	if t == nil {
		return
	}
	// The span's name says where the copy went: through the default
	// exchange, the queue the routing key names.
	_, t.publish = tr.Start(t.ctx, "publish "+cmp.Or(exchange, routingKey), trace.WithSpanKind(trace.SpanKindProducer))
	if t.publish.IsRecording() {
		t.publish.SetAttributes(rabbitMQDestination(exchange, routingKey)...)
		t.publish.SetAttributes(semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("publish"))
	}
}

// End ends both spans once the copy's outcome is known: confirmed, or the
// way it failed (outcome names it). A park sets an error status on the
// process span: the message's retries are over. A copy that was not
// confirmed sets one on both: the delivery goes back to the inbox.
func (t *delivery) End(confirmed bool, outcome string) {
	if t == nil {
		return
	}
	if t.publish != nil {
		if !confirmed {
			t.publish.SetStatus(codes.Error, outcome)
		}
		t.publish.End()
	}
	switch {
	case !confirmed:
		t.process.SetStatus(codes.Error, "copy not confirmed: "+outcome+"; the delivery is requeued")
	case t.parked:
		t.process.SetStatus(codes.Error, "parked")
	}
	t.process.End()
}

// Move starts the span of one message a command moves (operation: replay,
// flush, cancel, ...) to exchange with routingKey: a producer span in the
// message's own trace, so that a replay shows in the trace of the message
// it brought back. end ends it with the copy's outcome.
func Move(tr trace.Tracer, operation string, d amqp.Delivery, exchange, routingKey string) (end func(confirmed bool, outcome string)) {
	_, span := tr.Start(extract(context.Background(), d.Headers), operation+" "+routingKey, trace.WithSpanKind(trace.SpanKindProducer))
	if span.IsRecording() {
		span.SetAttributes(rabbitMQDestination(exchange, routingKey)...)
		span.SetAttributes(semconv.MessagingOperationTypeSend, semconv.MessagingOperationName(operation),
			semconv.MessagingMessageID(d.MessageId))
	}
	return func(confirmed bool, outcome string) {
		if !confirmed {
			span.SetStatus(codes.Error, outcome)
		}
		span.End()
	}
}
