// Package tracing follows a message across its retries with OpenTelemetry:
// it decides from the environment whether traces are exported at all,
// builds the tracer provider the standard OTEL_* variables describe, and
// reads a producer's trace context from a message's headers.
//
// Traces are off unless the environment asks for them: an exporter that
// starts by default would send spans nowhere, and cost every message. The
// copies rebound publishes keep the producer's traceparent untouched, so
// every attempt of a message, and rebound's spans between them, share the
// producer's trace.
package tracing

import (
	"context"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/rebound-mq/rebound/headers"
)

// enabled reports whether the environment asks for traces: the exporter
// named otlp, or an OTLP endpoint set; and the SDK not disabled.
func enabled(env map[string]string) bool {
	if strings.EqualFold(env["OTEL_SDK_DISABLED"], "true") {
		return false
	}
	switch exporters := strings.ToLower(env["OTEL_TRACES_EXPORTER"]); {
	case exporters == "none":
		return false
	case strings.Contains(exporters, "otlp"):
		return true
	}
	return env["OTEL_EXPORTER_OTLP_ENDPOINT"] != "" || env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] != ""
}

// Setup returns rebound's tracer, of the provider env describes, and the
// function that flushes and stops that provider: nil when traces are off,
// so that rebound starts no span at all (a no-op tracer still reads each
// message's trace context). version is rebound's, for the resource and
// the tracer. The OTLP
// exporter (HTTP, protobuf), the resource (OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES) and the sampler (OTEL_TRACES_SAMPLER) read the
// process environment with the SDK's own parsing; service.name defaults
// to rebound.
func Setup(ctx context.Context, env map[string]string, version string) (trace.Tracer, func(context.Context) error, error) {
	if !enabled(env) {
		return nil, func(context.Context) error { return nil }, nil
	}
	if p := env["OTEL_EXPORTER_OTLP_PROTOCOL"]; p != "" && p != "http/protobuf" {
		return nil, nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: rebound exports traces over http/protobuf only", p)
	}
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("start the OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(
		resource.NewSchemaless(semconv.ServiceName("rebound"), semconv.ServiceVersion(version)),
		partial(resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK())))
	if err != nil {
		return nil, nil, fmt.Errorf("describe the trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	return tp.Tracer(scopeName, trace.WithInstrumentationVersion(version)), tp.Shutdown, nil
}

// partial keeps what resource.New could read: a malformed
// OTEL_RESOURCE_ATTRIBUTES entry is reported as an error with the rest of
// the resource still usable, and is no reason to run without traces.
func partial(r *resource.Resource, _ error) *resource.Resource { return r }

// propagator reads W3C trace context and baggage, the headers producers'
// instrumentations write.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// extract returns ctx carrying the producer's span context (traceparent,
// tracestate) and baggage from a message's headers. A header of the wrong
// type, or one that does not parse, is ignored: the span then starts a
// trace of its own.
func extract(ctx context.Context, h amqp.Table) context.Context {
	return propagator.Extract(ctx, headerCarrier(h))
}

// headerCarrier reads propagation fields from AMQP headers, which a
// producer may have written as a string or as bytes. It never writes:
// the copy's trace context is the producer's.
type headerCarrier amqp.Table

var _ propagation.TextMapCarrier = headerCarrier(nil)

func (c headerCarrier) Get(key string) string {
	return headers.Text(c[key])
}

func (c headerCarrier) Set(string, string) {}

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
