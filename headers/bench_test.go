package headers

import (
	"testing"
	"time"
)

// BenchmarkDecodeRetry measures the work rebound does on the hot path for a
// typical first failure: decode the dead-lettered message (one x-death
// entry, five application headers) and write the retry copy's headers.
// The allocations are the new table and the values boxed into it.
func BenchmarkDecodeRetry(b *testing.B) {
	c := NewCodec(DefaultNames())
	h := deadLettered()
	stamp := testNow().Add(-time.Minute)
	now := testNow()
	buf := make([]Problem, 0, 4)
	b.ReportAllocs()
	for b.Loop() {
		var s State
		s, buf = c.Decode(h, stamp, now, buf[:0])
		// The copy drops the broker's four dead-letter headers and writes
		// six: the retry state (count, start, last delay, origin) and the
		// first death's reason and queue.
		if out := c.Retry(h, s, 2*time.Second, time.Time{}); len(out) != len(h)-4+6 {
			b.Fatalf("copy has %d headers, want %d", len(out), len(h)-4+6)
		}
	}
}
