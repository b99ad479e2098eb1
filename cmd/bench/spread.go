package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/policy"
)

// Delay spread. With jitter, copies go to many delay queues: the default
// policy (exponential from 1 s to 1 h, full jitter, 10 retries) spreads
// them over about 400 delays of two significant digits, and about 50 of
// one (REBOUND_DELAY_DIGITS). A copy must stay in its delay queue for the
// whole run, where it is counted, so each delay the policy would use is
// stood for by a long delay of its own, from 10 minutes up (what the broker
// does per queue does not depend on a TTL that does not expire during the
// run): rebound runs with full jitter under spreadMax, at spreadDigits so
// that neighbouring long delays stay apart, and a random source
// (consumer.Options.NewRand) that draws, in turn, the fractions of
// spreadMax landing on them. Everything else is rebound as REBOUND_*
// configures it.

// spreadMax is the constant delay full jitter draws under.
const spreadMax = 1_000_000_000 * time.Millisecond

// maxSpread is how many delays of two significant digits lie between
// retryDelay and spreadMax: the most delay queues the bound runs bind.
const maxSpread = 310

// spreadDigits is REBOUND_DELAY_DIGITS of the spread runs themselves,
// whatever the digits of the spread they stand for.
const spreadDigits = 3

// gridDelays returns the first k delays of digits significant digits in
// milliseconds from retryDelay (10 min) up to spreadMax, ascending.
func gridDelays(k, digits int) []time.Duration {
	var out []time.Duration
	for d := retryDelay; len(out) < k && d < spreadMax; {
		out = append(out, d)
		d = policy.Policy{DelayDigits: digits}.RoundUp(d + time.Millisecond)
	}
	return out
}

// spreadDelays returns the first k delays of two significant digits in
// milliseconds from retryDelay (10 min) up, ascending; k ≤ maxSpread.
func spreadDelays(k int) []time.Duration { return gridDelays(k, 2) }

// policySpread is how the default policy spreads n copies over delay
// queues at some REBOUND_DELAY_DIGITS, and the long delays that stand for
// them in a run.
type policySpread struct {
	Digits int
	// Sequence is the long delay of each copy, in the order rebound draws
	// them: the first copy of every queue comes first, so that a run's
	// warm-up declares them all; the others follow in the policy's order.
	Sequence []time.Duration
	// Queues maps each long delay to the policy's delay it stands for.
	Queues map[time.Duration]time.Duration
	// Busiest is the share of the copies the busiest queue takes.
	Busiest float64
}

// spreadSeed makes the draws, and so the queues and shares, the same in
// every invocation.
const spreadSeed = 13

// defaultPolicySpread draws n delays from the default policy at digits
// significant digits: copy i is retry i mod REBOUND_MAX_RETRIES of a
// message whose task has just started (so that each retry of the schedule
// has an equal share, as when every message goes through all of them),
// with a seeded random source. A draw that rounds to no delay at all goes
// straight back to its queue, not to a delay queue, and is drawn again.
func defaultPolicySpread(n, digits int) (*policySpread, error) {
	cfg, err := config.Load([]string{"REBOUND_DELAY_DIGITS=" + strconv.Itoa(digits)})
	if err != nil {
		return nil, fmt.Errorf("default policy at %d digits: %w", digits, err)
	}
	p := cfg.PolicySet().Default().Policy
	r := rand.New(rand.NewPCG(spreadSeed, uint64(digits)))
	now := time.Now()
	drawn := make([]time.Duration, 0, n)
	for i := 0; len(drawn) < n; i++ {
		d := p.Decide(policy.State{Retries: i % max(p.MaxRetries, 1), StartedAt: now}, now, r)
		if d.Retry && d.Delay > 0 {
			drawn = append(drawn, d.Delay)
		}
	}
	distinct := slices.Clone(drawn)
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)
	long := gridDelays(len(distinct), spreadDigits)
	if len(long) < len(distinct) {
		return nil, fmt.Errorf("default policy at %d digits: %d delay queues, more than the %d long delays below %s", digits, len(distinct), len(long), spreadMax)
	}
	s := &policySpread{Digits: digits, Queues: make(map[time.Duration]time.Duration, len(distinct))}
	standFor := make(map[time.Duration]time.Duration, len(distinct))
	for i, d := range distinct {
		standFor[d] = long[i]
		s.Queues[long[i]] = d
	}
	first, rest := make([]time.Duration, 0, len(distinct)), make([]time.Duration, 0, n)
	count := map[time.Duration]int{}
	for _, d := range drawn {
		if count[d] == 0 {
			first = append(first, standFor[d])
		} else {
			rest = append(rest, standFor[d])
		}
		count[d]++
	}
	s.Sequence = append(first, rest...)
	most := 0
	for _, c := range count {
		most = max(most, c)
	}
	s.Busiest = float64(most) / float64(n)
	return s, nil
}

// delays returns the long delays of the spread, ascending.
func (s *policySpread) delays() []time.Duration {
	out := make([]time.Duration, 0, len(s.Queues))
	for d := range s.Queues {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// spreadEnv configures full jitter under spreadMax, with no budget that
// would clamp a long delay, at spreadDigits.
func spreadEnv() []string {
	return []string{
		"REBOUND_MIN_DELAY=" + spreadMax.String(), "REBOUND_MAX_DELAY=" + spreadMax.String(),
		"REBOUND_JITTER=full", "REBOUND_MAX_DURATION=0", "REBOUND_DELAY_DIGITS=" + strconv.Itoa(spreadDigits),
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

// spreadRand returns rebound's random source for a sequence of delays:
// full jitter on spreadMax then picks each of them in turn.
func spreadRand(sequence []time.Duration) func() policy.Rand {
	fractions := make([]float64, len(sequence))
	for i, d := range sequence {
		fractions[i] = float64(d) / float64(spreadMax)
	}
	return func() policy.Rand { return &roundRobin{fractions: fractions} }
}
