package policy

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Step is one retry of a Schedule.
type Step struct {
	// Retry is n, the value of State.Retries when this retry is decided:
	// 0 for the first retry.
	Retry int
	// Nominal is the curve value (Policy.Nominal), before jitter, the
	// deadline and rounding.
	Nominal time.Duration
	// Delay is what Decide returns without jitter: the nominal delay with
	// the deadline applied, rounded for the delay queue.
	Delay time.Duration
	// Min and Max bound what Decide can return with jitter, the deadline
	// applied and rounded (see Range; for gaussian jitter they hold 99.7 %
	// of the draws). Under Strict, draws above Max park instead.
	Min, Max time.Duration
	// Elapsed is the time from the task start to the end of this delay,
	// when every delay is its nominal one and every attempt fails at once.
	Elapsed time.Duration
}

// Schedule returns the retries the policy schedules for a message that
// fails every time, as soon as it is delivered, and is always given its
// nominal delay: one Step per retry until Decide parks, at most limit
// steps. stop is the parking Decision that ends the schedule; when limit
// steps come first, stop.Retry is true and the policy would go on.
func (p Policy) Schedule(limit int) (steps []Step, stop Decision) {
	// The policy only looks at time differences, so any start will do.
	start := time.Unix(0, 0)
	nominal := p
	nominal.Jitter = NoJitter
	// Bounds are shown for the retries that happen: a Strict policy parks
	// the draws past the deadline, the rest are those of clamp.
	bounds := p
	if bounds.Deadline == Strict {
		bounds.Deadline = clamp
	}
	var elapsed, lastMax time.Duration
	for n := 0; n < limit; n++ {
		stop = nominal.Decide(State{Retries: n, StartedAt: start}, start.Add(elapsed), nil)
		if !stop.Retry {
			return steps, stop
		}
		lo, hi := p.Range(n, lastMax)
		lastMax = hi
		if n >= p.ImmediateRetries {
			lo, _ = bounds.fit(lo, elapsed)
			// The next range grows from this one's top as drawn, before
			// rounding, as Decide's next range grows from Drawn.
			top, ceiling, _ := bounds.deadline(hi, elapsed)
			lastMax = top.Truncate(time.Millisecond)
			hi = roundWithin(top, ceiling, p.digits())
		}
		elapsed = addSaturating(elapsed, stop.Delay)
		steps = append(steps, Step{
			Retry:   n,
			Nominal: p.Nominal(n),
			Delay:   stop.Delay,
			Min:     lo,
			Max:     hi,
			Elapsed: elapsed,
		})
	}
	return steps, Decision{Retry: true}
}

// addSaturating adds two non-negative durations, stopping at the largest
// Duration instead of wrapping: a long schedule of long delays can sum past
// 292 years.
func addSaturating(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Summary describes the policy and its schedule in one line, for the log
// at start and `rebound config check`: "exponential 1s to 1h ×2, full
// jitter: 10 retries over 17m3s (1s, 2s, 4s … 8m32s), then parked
// max-retries". The delays are the nominal ones, as queued.
func (p Policy) Summary() string {
	var b strings.Builder
	b.WriteString(string(p.Backoff))
	switch {
	case p.Backoff == Constant:
		b.WriteString(" " + FormatDuration(p.MinDelay))
	case p.Backoff == Exponential:
		fmt.Fprintf(&b, " %s to %s ×%s", FormatDuration(p.MinDelay), FormatDuration(p.MaxDelay), strconv.FormatFloat(p.Multiplier, 'g', -1, 64))
	default:
		fmt.Fprintf(&b, " %s to %s", FormatDuration(p.MinDelay), FormatDuration(p.MaxDelay))
	}
	fmt.Fprintf(&b, ", %s jitter", p.Jitter)
	if p.ImmediateRetries > 0 {
		fmt.Fprintf(&b, ", %d immediate", p.ImmediateRetries)
	}
	if p.RetryRate > 0 {
		fmt.Fprintf(&b, ", at most %s/s per origin", strconv.FormatFloat(p.RetryRate, 'g', -1, 64))
	}
	const limit = 1000
	steps, stop := p.Schedule(limit)
	if len(steps) == 0 {
		fmt.Fprintf(&b, ": parked %s at the first failure", stop.Reason)
		return b.String()
	}
	delays := make([]string, 0, 5)
	for i, s := range steps {
		if len(steps) > 5 && i == 3 {
			delays = append(delays, "…")
		}
		if len(steps) <= 5 || i < 3 || i == len(steps)-1 {
			delays = append(delays, FormatDuration(s.Delay))
		}
	}
	total := FormatDuration(steps[len(steps)-1].Elapsed)
	if stop.Retry {
		fmt.Fprintf(&b, ": more than %d retries, the first %d over %s (%s)", limit, limit, total, strings.Join(delays, ", "))
		return b.String()
	}
	retries := "retries"
	if len(steps) == 1 {
		retries = "retry"
	}
	fmt.Fprintf(&b, ": %d %s over %s (%s), then parked %s", len(steps), retries, total, strings.Join(delays, ", "), stop.Reason)
	return b.String()
}
