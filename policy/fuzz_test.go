package policy

import (
	"math"
	"testing"
	"time"
)

// fixed is a Rand that always returns the same draws, for fuzzing.
type fixed struct{ u, z float64 }

func (f fixed) Float64() float64     { return f.u }
func (f fixed) NormFloat64() float64 { return f.z }

// FuzzDecide feeds Decide arbitrary policies, states and draws. It must
// never panic, and for a policy config would accept, every guarantee of the
// contract holds (checkDecision).
func FuzzDecide(f *testing.F) {
	f.Add(uint8(4), uint8(1), uint8(0), int64(time.Second), int64(time.Hour), 2.0, 0.5, int64(time.Second), 0, 10, int64(24*time.Hour), 3, int64(time.Minute), int64(0), false, 0.5, 0.0)
	f.Add(uint8(1), uint8(4), uint8(1), int64(5*time.Second), int64(260*time.Second), 2.0, 0.5, int64(0), 2, 12, int64(0), 5, int64(time.Hour), int64(time.Minute), false, 0.999, 1.0)
	f.Add(uint8(3), uint8(6), uint8(2), int64(time.Millisecond), int64(time.Millisecond), 1.0, 1.0, int64(-1), -1, 0, int64(-1), -7, int64(math.MinInt64), int64(math.MaxInt64), true, -1.0, math.Inf(1))
	f.Add(uint8(4), uint8(7), uint8(0), int64(1), int64(math.MaxInt64), math.MaxFloat64, math.NaN(), int64(math.MaxInt64), 0, 0, int64(time.Hour), math.MaxInt, int64(time.Hour-1), int64(math.MaxInt64), false, 0.0, math.NaN())
	f.Fuzz(func(t *testing.T, backoff, jitter, deadline uint8, minDelay, maxDelay int64, multiplier, factor float64,
		jitterMax int64, immediate, maxRetries int, maxDuration int64, retries int, elapsed, last int64, nonRetryable bool, u, z float64) {
		pick := func(i uint8, n int) int { return int(i) % (n + 1) } // n+1: also an unknown name
		p := Policy{
			Backoff:          append(Backoffs[:len(Backoffs):len(Backoffs)], "bogus")[pick(backoff, len(Backoffs))],
			Jitter:           append(Jitters[:len(Jitters):len(Jitters)], "bogus")[pick(jitter, len(Jitters))],
			Deadline:         append(Deadlines[:len(Deadlines):len(Deadlines)], "bogus")[pick(deadline, len(Deadlines))],
			MinDelay:         time.Duration(minDelay),
			MaxDelay:         time.Duration(maxDelay),
			Multiplier:       multiplier,
			JitterFactor:     factor,
			JitterMax:        time.Duration(jitterMax),
			ImmediateRetries: immediate,
			MaxRetries:       maxRetries,
			MaxDuration:      time.Duration(maxDuration),
		}
		// A real source draws U from [0, 1); keep the fuzzed one there.
		if !(u >= 0 && u < 1) {
			u = 0
		}
		s := State{Retries: retries, StartedAt: start, LastDelay: time.Duration(last), NonRetryable: nonRetryable}
		r := fixed{u: u, z: z}
		d := p.Decide(s, start.Add(time.Duration(elapsed)), r)
		if d.Delay < 0 {
			t.Fatalf("negative delay %v for %+v", d.Delay, p)
		}
		p.Range(retries, time.Duration(last))
		p.Schedule(3)
		if valid(p) {
			checkDecision(t, p, s, time.Duration(elapsed), r)
		}
	})
}
