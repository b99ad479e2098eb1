package policy

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// valid mirrors the rules package config enforces, so property and fuzz
// tests know when the guarantees of Decide apply. (config imports policy,
// so the tests cannot ask it.)
func valid(p Policy) bool {
	known := func(b Backoff, j Jitter, d Deadline) bool {
		okB, okJ, okD := false, false, false
		for _, v := range Backoffs {
			okB = okB || v == b
		}
		for _, v := range Jitters {
			okJ = okJ || v == j
		}
		for _, v := range Deadlines {
			okD = okD || v == d
		}
		return okB && okJ && okD
	}
	switch {
	case !known(p.Backoff, p.Jitter, p.Deadline),
		p.MinDelay < time.Millisecond, p.MaxDelay < p.MinDelay,
		p.Backoff == Exponential && !(p.Multiplier > 1 && !math.IsInf(p.Multiplier, 1)),
		(p.Jitter == ProportionalJitter || p.Jitter == GaussianJitter) && !(p.JitterFactor >= 0 && p.JitterFactor <= 1),
		p.JitterMax < 0, p.ImmediateRetries < 0, p.MaxRetries < 0, p.MaxDuration < 0,
		p.MaxRetries == 0 && p.MaxDuration == 0,
		p.Backoff.Fitted() && p.MaxRetries-p.ImmediateRetries < 2:
		return false
	}
	return true
}

// randomPolicy draws a valid policy, delays spread over orders of magnitude.
func randomPolicy(r *rand.Rand) Policy {
	logUniform := func(lo, hi time.Duration) time.Duration {
		return time.Duration(float64(lo) * math.Pow(float64(hi)/float64(lo), r.Float64()))
	}
	p := Policy{
		Backoff:      Backoffs[r.IntN(len(Backoffs))],
		Jitter:       Jitters[r.IntN(len(Jitters))],
		Deadline:     Deadlines[r.IntN(len(Deadlines))],
		MinDelay:     logUniform(time.Millisecond, time.Minute),
		Multiplier:   1 + 4*r.Float64() + 1e-9,
		JitterFactor: r.Float64(),
		JitterMax:    time.Duration(r.Int64N(int64(10 * time.Second))),
	}
	p.MaxDelay = logUniform(p.MinDelay, 1000*p.MinDelay)
	if r.IntN(4) == 0 {
		p.ImmediateRetries = r.IntN(4)
	}
	if p.Backoff.Fitted() || r.IntN(5) > 0 {
		p.MaxRetries = p.ImmediateRetries + 2 + r.IntN(30)
	}
	if p.MaxRetries == 0 || r.IntN(3) > 0 {
		p.MaxDuration = logUniform(time.Second, 48*time.Hour)
	}
	return p
}

// TestProperties checks the guarantees of Decide and Nominal over a few
// thousand random valid policies and states.
func TestProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 3))
	for c := 0; c < 5000; c++ {
		p := randomPolicy(r)
		if !valid(p) {
			t.Fatalf("case %d: randomPolicy made an invalid policy %+v", c, p)
		}

		// The nominal curve starts at MinDelay, never decreases and never
		// passes MaxDelay; fitted curves end at MaxDelay.
		if got := p.Nominal(p.ImmediateRetries); got != p.MinDelay {
			t.Errorf("case %d %+v: first delayed retry %v, want MinDelay", c, p, got)
		}
		prev := time.Duration(0)
		for n := 0; n < max(p.MaxRetries, 60)+5; n++ {
			d := p.Nominal(n)
			if d < prev || d > p.MaxDelay || (n < p.ImmediateRetries && d != 0) {
				t.Fatalf("case %d %+v: Nominal(%d) = %v after %v", c, p, n, d, prev)
			}
			prev = d
		}
		if p.Backoff.Fitted() && p.Nominal(p.MaxRetries-1) != p.MaxDelay {
			t.Errorf("case %d %+v: fitted curve ends at %v, want MaxDelay", c, p, p.Nominal(p.MaxRetries-1))
		}

		for k := 0; k < 4; k++ {
			s, elapsed := randomState(r, p)
			checkDecision(t, p, s, elapsed, r)
		}
		// Exactly at the limits, and one step short of them.
		atLimits := []State{{Retries: p.ImmediateRetries - 1}, {Retries: p.ImmediateRetries}}
		if p.MaxRetries > 0 {
			atLimits = append(atLimits, State{Retries: p.MaxRetries - 1}, State{Retries: p.MaxRetries})
		}
		for _, s := range atLimits {
			s.StartedAt = start
			checkDecision(t, p, s, 0, r)
			if p.MaxDuration > 0 {
				checkDecision(t, p, s, p.MaxDuration-1, r)
				checkDecision(t, p, s, p.MaxDuration, r)
			}
		}
	}
}

// randomState draws a state near the policy's limits as often as not.
func randomState(r *rand.Rand, p Policy) (s State, elapsed time.Duration) {
	s.Retries = r.IntN(max(p.MaxRetries, 40) + 3)
	s.NonRetryable = r.IntN(20) == 0
	if r.IntN(2) == 0 {
		s.LastDelay = time.Duration(r.Int64N(int64(2*p.MaxDelay) + 1))
	}
	budget := p.MaxDuration
	if budget == 0 {
		budget = 48 * time.Hour
	}
	switch r.IntN(4) {
	case 0: // just before or at the deadline
		elapsed = budget - time.Duration(r.Int64N(int64(2*p.MaxDelay)+1))
	case 1: // a start in the future
		elapsed = -time.Duration(r.Int64N(int64(time.Hour)))
	default:
		elapsed = time.Duration(r.Int64N(int64(budget) + int64(budget)/5))
	}
	s.StartedAt = start
	return s, elapsed
}

// checkDecision checks one Decide call against everything the contract
// promises for a valid policy.
func checkDecision(t *testing.T, p Policy, s State, elapsed time.Duration, r Rand) {
	t.Helper()
	d := p.Decide(s, start.Add(elapsed), r)
	n, spent := max(s.Retries, 0), max(elapsed, 0)
	bad := func(what string) {
		t.Helper()
		t.Fatalf("%s\npolicy %+v\nstate %+v elapsed %v\ndecision %+v", what, p, s, elapsed, d)
	}
	switch {
	case s.NonRetryable:
		if d != (Decision{Reason: NonRetryable}) {
			bad("non-retryable not parked as such")
		}
		return
	case p.MaxRetries > 0 && n >= p.MaxRetries:
		if d != (Decision{Reason: MaxRetries}) {
			bad("retry count spent, not parked with max-retries")
		}
		return
	case p.MaxDuration > 0 && spent >= p.MaxDuration:
		if d != (Decision{Reason: maxDuration}) {
			bad("budget spent, not parked with max-duration")
		}
		return
	case n < p.ImmediateRetries:
		if d != (Decision{Retry: true}) {
			bad("immediate retry with a delay")
		}
		return
	}
	if !d.Retry {
		// Only the deadline may park from here: strict, or clamp with
		// under a millisecond left.
		if d.Reason != maxDuration || p.MaxDuration == 0 || p.Deadline == Lenient ||
			(p.Deadline == clamp && p.MaxDuration-spent >= time.Millisecond) {
			bad("parked without cause")
		}
		return
	}
	if d.Reason != "" || d.Delay < 0 || d.Delay > p.MaxDelay {
		bad("delay outside [0, MaxDelay]")
	}
	if roundDelay(d.Delay) != d.Delay {
		bad("delay not rounded to two significant digits")
	}
	if p.MaxDuration > 0 && p.Deadline != Lenient && spent+d.Delay > p.MaxDuration {
		bad("retry lands past the budget")
	}
	if p.Jitter != GaussianJitter {
		// Within the range Schedule shows, bounds fitted the same way.
		q := p
		if q.Deadline == Strict {
			q.Deadline = clamp
		}
		lo, hi := p.Range(n, s.LastDelay)
		lo, _ = q.fit(lo, spent)
		hi, _ = q.fit(hi, spent)
		if d.Delay < lo || d.Delay > hi {
			bad("delay outside the rounded Range [" + lo.String() + ", " + hi.String() + "]")
		}
	}
}

// TestJitterStatistics draws 100 000 times from every jitter mode and
// checks the empirical mean and extremes against the formula. Each
// tolerance follows from the distribution: the mean within 5 standard
// errors (σ/√N), the extremes within the distance that N uniform draws
// leave empty with probability e⁻³⁰, or, for gaussian, between 3.5σ and
// 6.5σ (outside with probability under 1e-5). The source is seeded, so the
// test is also reproducible.
func TestJitterStatistics(t *testing.T) {
	const draws = 100_000
	p := exponential()
	p.JitterFactor = 0.2 // gaussian: a negative draw (Z < −5) is too rare to bias the mean
	p.JitterMax = 3 * time.Second
	d := float64(10 * time.Second)
	m := float64(p.MinDelay)
	last := 4 * time.Second // decorrelated: U on [1s, 12s]

	uniform := func(lo, hi float64) (mean, sd, low, high float64) {
		return (lo + hi) / 2, (hi - lo) / math.Sqrt(12), lo, hi
	}
	tests := []struct {
		jitter           Jitter
		mean, sd, lo, hi float64
		gaussian         bool
	}{
		{jitter: NoJitter, mean: d, lo: d, hi: d},
		{jitter: fullJitter},
		{jitter: EqualJitter},
		{jitter: boundedJitter},
		{jitter: decorrelatedJitter},
		{jitter: ProportionalJitter},
		{jitter: GaussianJitter, mean: d, sd: 0.2 * d, gaussian: true},
		{jitter: additiveJitter},
	}
	tests[1].mean, tests[1].sd, tests[1].lo, tests[1].hi = uniform(0, d)
	tests[2].mean, tests[2].sd, tests[2].lo, tests[2].hi = uniform(d/2, d)
	tests[3].mean, tests[3].sd, tests[3].lo, tests[3].hi = uniform(m/2, d)
	tests[4].mean, tests[4].sd, tests[4].lo, tests[4].hi = uniform(m, 3*float64(last))
	tests[5].mean, tests[5].sd, tests[5].lo, tests[5].hi = uniform(0.8*d, 1.2*d)
	tests[7].mean, tests[7].sd, tests[7].lo, tests[7].hi = uniform(d, d+float64(p.JitterMax))

	for _, tt := range tests {
		t.Run(string(tt.jitter), func(t *testing.T) {
			p.Jitter = tt.jitter
			r := rand.New(rand.NewPCG(7, uint64(len(tt.jitter))))
			var sum float64
			low, high := math.Inf(1), math.Inf(-1)
			for range draws {
				x := float64(p.jitter(d, last, r))
				sum += x
				low, high = min(low, x), max(high, x)
			}
			mean := sum / draws
			// Durations are whole nanoseconds: allow one on top.
			if tol := 5*tt.sd/math.Sqrt(draws) + 1; math.Abs(mean-tt.mean) > tol {
				t.Errorf("mean %.0fns, want %.0fns ± %.0f", mean, tt.mean, tol)
			}
			var loMin, loMax, hiMin, hiMax float64
			if tt.gaussian {
				loMin, loMax = tt.mean-6.5*tt.sd, tt.mean-3.5*tt.sd
				hiMin, hiMax = tt.mean+3.5*tt.sd, tt.mean+6.5*tt.sd
			} else {
				gap := 30 * (tt.hi - tt.lo) / draws
				loMin, loMax = tt.lo-1, tt.lo+gap
				hiMin, hiMax = tt.hi-gap, tt.hi+1
			}
			if low < loMin || low > loMax {
				t.Errorf("min %.0fns, want in [%.0f, %.0f]", low, loMin, loMax)
			}
			if high < hiMin || high > hiMax {
				t.Errorf("max %.0fns, want in [%.0f, %.0f]", high, hiMin, hiMax)
			}
		})
	}
}
