package policy

import (
	"math"
	"time"
)

// This file holds the curves: the nominal delay of each retry and the
// jitter drawn around it. Everything is computed in float64 nanoseconds and
// clamped to [0, MaxDelay] before it becomes a time.Duration again, so
// overflow (a large retry number, an extreme multiplier) saturates at
// MaxDelay instead of wrapping.

// Nominal returns the un-jittered delay of retry n (0-based, the n of
// State.Retries): 0 for an immediate retry (n < ImmediateRetries), else the
// backoff curve at index i = n − ImmediateRetries, so the first delayed
// retry gets MinDelay. With m = MinDelay, M = MaxDelay and K = MaxRetries −
// ImmediateRetries delayed retries:
//
//	constant     m
//	linear       m + (M − m)·i/(K − 1)
//	arithmetic   m + (M − m)·(i/(K − 1))²
//	geometric    m·(M/m)^(i/(K − 1))
//	exponential  min(M, m·Multiplierⁱ)
//
// The fitted shapes (linear, arithmetic, geometric) run from m at the first
// delayed retry to exactly M at the last one, K − 1; past it they stay at
// M, and with K < 2 (no room to fit a curve; config rejects it) they stay
// at m. The result is rounded to the nanosecond and never above M. Nominal
// ignores the retry and duration limits: Decide applies those.
func (p Policy) Nominal(n int) time.Duration {
	return toDuration(p.curve(n), p.MaxDelay)
}

// curve is Nominal in float64 nanoseconds, unrounded, so that jitter and
// Range work from the exact curve value instead of compounding a rounding.
func (p Policy) curve(n int) float64 {
	n = max(n, 0)
	if n < p.ImmediateRetries {
		return 0
	}
	i := n - max(p.ImmediateRetries, 0)
	m, top := float64(p.MinDelay), float64(p.MaxDelay)
	switch p.Backoff {
	case linear, arithmetic, geometric:
		span := p.MaxRetries - p.ImmediateRetries - 1
		switch {
		case span <= 0:
			return m
		case i >= span:
			// The curve ends at M exactly, not at M give or take a
			// rounding error.
			return top
		}
		t := float64(i) / float64(span)
		switch p.Backoff {
		case linear:
			return m + (top-m)*t
		case arithmetic:
			return m + (top-m)*t*t
		}
		// Pow(top/m, t) without Pow's special cases: half the time.
		return m * math.Exp(t*math.Log(top/m))
	case Exponential:
		return min(top, m*growth(p.Multiplier, i, top/m))
	}
	return m
}

// growth returns x^i, or limit as soon as the power reaches it, so a large
// i (a message retried for days with MaxRetries 0) costs at most 63 steps
// and never overflows. It squares and multiplies in the same order as
// math.Pow does for an integer exponent, so the results are the same to
// the last bit, without Pow's special cases on the hot path.
func growth(x float64, i int, limit float64) float64 {
	power := 1.0
	for ; i > 0; i >>= 1 {
		if i&1 == 1 {
			power *= x
			if power >= limit {
				return limit
			}
		}
		x *= x
	}
	return min(power, limit)
}

// jitter applies the policy's jitter to the nominal delay x (nanoseconds),
// drawing once from r, and clamps the result to [0, MaxDelay]. last is
// State.LastDelay.
func (p Policy) jitter(x float64, last time.Duration, r Rand) time.Duration {
	switch p.Jitter {
	case fullJitter:
		x *= r.Float64()
	case EqualJitter:
		half := x / 2
		x = half + r.Float64()*half
	case boundedJitter:
		lo := float64(p.MinDelay) / 2
		x = lo + r.Float64()*(x-lo)
	case decorrelatedJitter:
		lo, hi := p.decorrelated(last)
		x = lo + r.Float64()*(hi-lo)
	case ProportionalJitter:
		x *= 1 + p.JitterFactor*(2*r.Float64()-1)
	case GaussianJitter:
		x *= 1 + p.JitterFactor*r.NormFloat64()
	case additiveJitter:
		x += r.Float64() * float64(p.JitterMax)
	}
	return toDuration(x, p.MaxDelay)
}

// decorrelated returns the interval decorrelated jitter draws from:
// [m, min(M, 3·last)], last = m when absent. The upper end is capped before
// the draw, not after, so delays spread over [m, M] instead of piling up at
// M; it never falls below m (a short last delay, say a clamped one, still
// leaves m to draw from).
func (p Policy) decorrelated(last time.Duration) (lo, hi float64) {
	lo = float64(p.MinDelay)
	if last <= 0 {
		last = p.MinDelay
	}
	hi = min(float64(p.MaxDelay), 3*float64(last))
	return lo, max(hi, lo)
}

// Range returns the bounds of the delay jitter can give retry n, clamped to
// [0, MaxDelay], before the deadline and delay-queue rounding that Decide
// applies: the jittered delay lies in [lo, hi] (hi itself is a supremum
// for the uniform modes, which draw from [0, 1)). last is the previous
// delay, used only by decorrelated jitter; to bound a whole schedule, pass
// the previous retry's hi. An immediate retry has the range [0, 0].
//
// Gaussian jitter is unbounded (before clamping it could reach anything in
// [0, MaxDelay]), so for it Range reports d·(1 ± 3f), clamped, which holds
// 99.7 % of the draws.
func (p Policy) Range(n int, last time.Duration) (lo, hi time.Duration) {
	if max(n, 0) < p.ImmediateRetries {
		return 0, 0
	}
	d := p.curve(n)
	a, b := d, d
	switch p.Jitter {
	case fullJitter:
		a = 0
	case EqualJitter:
		a = d / 2
	case boundedJitter:
		a = float64(p.MinDelay) / 2
	case decorrelatedJitter:
		a, b = p.decorrelated(last)
	case ProportionalJitter:
		a, b = d*(1-p.JitterFactor), d*(1+p.JitterFactor)
	case GaussianJitter:
		a, b = d*(1-3*p.JitterFactor), d*(1+3*p.JitterFactor)
	case additiveJitter:
		b = d + float64(p.JitterMax)
	}
	return toDuration(a, p.MaxDelay), toDuration(b, p.MaxDelay)
}

// toDuration converts x nanoseconds to the nearest Duration in [0, ceiling].
// NaN, which only an invalid policy can produce, becomes 0.
func toDuration(x float64, ceiling time.Duration) time.Duration {
	switch {
	case !(x > 0):
		return 0
	case x >= float64(ceiling):
		return ceiling
	}
	return time.Duration(math.Round(x))
}
