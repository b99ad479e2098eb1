package main

import (
	"math"
	"testing"
	"time"
)

func TestProfileBuckets(t *testing.T) {
	out := `File: bench
Type: cpu
Duration: 3.23s, Total samples = 1.11s (34.35%)
-----------+-------------------------------------------------------
      20ms   github.com/rebound-mq/rebound/headers.Codec.Decode
             github.com/rebound-mq/rebound/consumer.(*session).handle
-----------+-------------------------------------------------------
      30ms   internal/runtime/syscall/linux.Syscall6
             github.com/rabbitmq/amqp091-go.(*Channel).PublishWithContext
             github.com/rebound-mq/rebound/republisher.(*Publisher).Publish
             github.com/rebound-mq/rebound/consumer.(*session).handle
-----------+-------------------------------------------------------
     1.5ms   runtime.mallocgc (inline)
             github.com/rabbitmq/amqp091-go.(*Connection).reader
-----------+-------------------------------------------------------
      10ms   runtime.futex
             runtime.schedule
-----------+-------------------------------------------------------
      10ms   github.com/rebound-mq/rebound/consumer.(*acker).settle
             github.com/rabbitmq/amqp091-go.(*Channel).Ack
-----------+-------------------------------------------------------
`
	samples := parseTraces(out)
	if len(samples) != 5 || samples[2].Value != 1500*time.Microsecond || samples[2].Frames[0] != "runtime.mallocgc" {
		t.Fatalf("parsed %+v", samples)
	}
	p := bucketize(samples)
	if p.Total != 71500*time.Microsecond {
		t.Errorf("total %s, want 71.5ms", p.Total)
	}
	want := []float64{20, 30, 10, 1.5, 0, 0, 10} // ack before bookkeeping: the earlier bucket wins
	if len(p.Buckets) != len(want) {
		t.Fatalf("%d buckets, want %d", len(p.Buckets), len(want))
	}
	for i, b := range p.Buckets {
		if got := b.Share * 71.5; math.Abs(got-want[i]) > 1e-9 {
			t.Errorf("bucket %d (%s): %.2f ms, want %.2f", i, b.Name, got, want[i])
		}
	}
}
