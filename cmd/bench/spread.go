package main

import (
	"time"

	"github.com/rebound-mq/rebound/policy"
)

// Delay spread. With jitter, copies go to many delay queues: full jitter
// between 1 s and 1 h, rounded to two significant digits, gives about 300.
// The spread runs compare rebound moving every copy into one delay queue
// with 300 delay queues declared, each bound to its exchange (copies still
// into one: the cost of routing, if any) and with copies spread evenly over those 300
// (the cost of routing and of keeping 300 queues busy).
//
// To spread them evenly and still keep every copy in its delay queue for
// the whole run, rebound runs with full jitter on a constant delay of
// spreadMax and a random source (sidecar.Options.NewRand) that draws, in
// turn, the fractions of spreadMax that land on each of the delays: 300
// delays of two significant digits from 10 minutes up, the longest about
// 10 days. Everything else is rebound as configured by REBOUND_*.

// spreadMax is the constant delay full jitter draws under.
const spreadMax = 1_000_000_000 * time.Millisecond

// maxSpread is how many delays of two significant digits lie between
// retryDelay and spreadMax.
const maxSpread = 310

// spreadDelays returns the first k delays of two significant digits in
// milliseconds from retryDelay (10 min) up, ascending; k ≤ maxSpread.
func spreadDelays(k int) []time.Duration {
	var out []time.Duration
	for step := 10 * time.Second; len(out) < k && step < spreadMax; step *= 10 {
		for m := 10; m <= 99 && len(out) < k; m++ {
			if d := time.Duration(m) * step; d >= retryDelay && d < spreadMax {
				out = append(out, d)
			}
		}
	}
	return out
}

// spreadEnv configures full jitter under spreadMax, with no budget that
// would clamp a long delay.
func spreadEnv() []string {
	return []string{
		"REBOUND_MIN_DELAY=" + spreadMax.String(), "REBOUND_MAX_DELAY=" + spreadMax.String(),
		"REBOUND_JITTER=full", "REBOUND_MAX_DURATION=0",
	}
}

// roundRobin is a policy.Rand whose Float64 returns its fractions in turn.
type roundRobin struct {
	fractions []float64
	next      int
}

var _ policy.Rand = (*roundRobin)(nil)

func (r *roundRobin) Float64() float64 {
	f := r.fractions[r.next]
	r.next = (r.next + 1) % len(r.fractions)
	return f
}

func (r *roundRobin) NormFloat64() float64 { return 0 }

// spreadRand returns rebound's random source for a spread over delays:
// full jitter on spreadMax then picks each of them in turn.
func spreadRand(delays []time.Duration) func() policy.Rand {
	fractions := make([]float64, len(delays))
	for i, d := range delays {
		fractions[i] = float64(d) / float64(spreadMax)
	}
	return func() policy.Rand { return &roundRobin{fractions: fractions} }
}
