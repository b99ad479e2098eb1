package main

import (
	"testing"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/republisher"
)

// shovel-same's messages must be what rebound publishes for the messages
// the other contenders move: those, with the retry headers added.
func TestRetriedAddsReboundsHeadersToTheDeadLetteredMessage(t *testing.T) {
	const origin = "bench.x.app"
	in, out := deadLettered(origin)(7), retried(origin)(7)
	for k, v := range in.Headers {
		if k == "x-death" {
			continue // a slice: compared by its entry below
		}
		if out.Headers[k] != v {
			t.Errorf("header %s: %v in the message, %v in the copy", k, v, out.Headers[k])
		}
	}
	if _, ok := out.Headers["x-death"]; !ok {
		t.Error("the copy lost x-death")
	}
	n := headers.DefaultNames()
	want := map[string]any{
		n.RetryCount: int64(1), n.LastDelay: retryDelay.Milliseconds(), n.OriginQueue: origin,
		n.TaskStartedAt: in.Timestamp.UnixMilli(), republisher.DelayRouteHeader: retryDelay.Milliseconds(),
	}
	for k, v := range want {
		if out.Headers[k] != v {
			t.Errorf("copy header %s = %#v, want %#v", k, out.Headers[k], v)
		}
	}
	if len(out.Headers) != len(in.Headers)+len(want) {
		t.Errorf("copy has %d headers, want the message's %d plus %d", len(out.Headers), len(in.Headers), len(want))
	}
	if string(out.Body) != string(in.Body) || out.MessageId != in.MessageId || out.DeliveryMode != in.DeliveryMode {
		t.Error("the copy's body or properties differ from the message's")
	}
}
