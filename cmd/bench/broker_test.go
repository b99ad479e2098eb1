package main

import (
	"testing"
	"time"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/topology"
)

// shovel-same's messages must be what rebound publishes for the messages
// the other contenders move: those, with the broker's dead-letter headers
// replaced by the retry headers, and no routing header.
func TestRetriedIsWhatReboundPublishes(t *testing.T) {
	const origin = "bench.x.app"
	topo := topology.Topology{DelayExchange: "bench.x.delay", DelayQueuePrefix: "bench.x.delay."}
	in, out := deadLettered(origin)(7), retried(topo, origin)(7)
	n := headers.DefaultNames()
	want := map[string]any{
		n.RetryCount: int64(1), n.LastDelay: retryDelay.Milliseconds(), n.OriginQueue: origin,
		n.TaskStartedAt: in.Timestamp.UnixMilli(), n.FirstDeathReason: "rejected", n.FirstDeathQueue: origin,
	}
	for k, v := range want {
		if out.Headers[k] != v {
			t.Errorf("copy header %s = %#v, want %#v", k, out.Headers[k], v)
		}
	}
	for _, gone := range []string{"CC", "BCC", "x-death", "x-first-death-queue", "x-first-death-reason", "x-first-death-exchange"} {
		if _, ok := out.Headers[gone]; ok {
			t.Errorf("the copy carries the broker's %s", gone)
		}
	}
	for _, kept := range []string{"app", "tenant", "seq", "x-retry-error"} {
		if out.Headers[kept] != in.Headers[kept] {
			t.Errorf("header %s: %v in the message, %v in the copy", kept, in.Headers[kept], out.Headers[kept])
		}
	}
	if string(out.Body) != string(in.Body) || out.MessageId != in.MessageId || out.DeliveryMode != in.DeliveryMode ||
		!out.Timestamp.Equal(in.Timestamp.Truncate(time.Second)) {
		t.Error("the copy's body or properties differ from the message's")
	}
}
