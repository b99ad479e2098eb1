package policy

import (
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkDecide measures one decision per jitter mode with the default
// exponential curve, mid-schedule. Decide must not allocate.
func BenchmarkDecide(b *testing.B) {
	for _, j := range Jitters {
		b.Run(string(j), func(b *testing.B) {
			p := exponential()
			p.Jitter = j
			benchmarkDecide(b, p)
		})
	}
}

// BenchmarkDecideBackoff is the same per backoff shape, full jitter: the
// fitted geometric curve is the one that needs math.Pow with a fraction.
func BenchmarkDecideBackoff(b *testing.B) {
	for _, shape := range Backoffs {
		b.Run(string(shape), func(b *testing.B) {
			p := exponential()
			p.Backoff = shape
			p.Jitter = fullJitter
			benchmarkDecide(b, p)
		})
	}
}

func benchmarkDecide(b *testing.B, p Policy) {
	r := rand.New(rand.NewPCG(1, 2))
	s := State{Retries: 5, StartedAt: start, LastDelay: 20 * time.Second}
	now := start.Add(time.Minute)
	var d Decision
	b.ReportAllocs()
	for b.Loop() {
		d = p.Decide(s, now, r)
	}
	if !d.Retry {
		b.Fatalf("Decide = %+v, want a retry", d)
	}
}
