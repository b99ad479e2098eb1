package policy_test

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/rebound-mq/rebound/policy"
)

// A message that keeps failing under DESIGN.md's default curve without
// jitter: the delay doubles from 1s, and the fifth retry is the last.
func ExamplePolicy_Decide() {
	p := policy.Policy{
		Backoff:     policy.Exponential,
		MinDelay:    time.Second,
		MaxDelay:    time.Hour,
		Multiplier:  2,
		Jitter:      policy.NoJitter,
		MaxRetries:  5,
		MaxDuration: 24 * time.Hour,
		Deadline:    "clamp",
	}
	started := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	now := started
	for n := 0; ; n++ {
		d := p.Decide(policy.State{Retries: n, StartedAt: started}, now, nil)
		if !d.Retry {
			fmt.Println("park:", d.Reason)
			break
		}
		fmt.Println("retry after", d.Delay)
		now = now.Add(d.Delay)
	}
	// Output:
	// retry after 1s
	// retry after 2s
	// retry after 4s
	// retry after 8s
	// retry after 16s
	// park: max-retries
}

// With jitter, Decide draws from the random source it is given; a seeded
// one makes the result reproducible. Full jitter picks from [0, 4s) for
// the third retry, and the delay queue holds it to two significant digits.
func ExamplePolicy_Decide_jitter() {
	p := policy.Policy{
		Backoff:     policy.Exponential,
		MinDelay:    time.Second,
		MaxDelay:    time.Hour,
		Multiplier:  2,
		Jitter:      "full",
		MaxRetries:  10,
		MaxDuration: 24 * time.Hour,
		Deadline:    "clamp",
	}
	r := rand.New(rand.NewPCG(1, 2))
	started := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	d := p.Decide(policy.State{Retries: 2, StartedAt: started}, started.Add(3*time.Second), r)
	lo, hi := p.Range(2, 0)
	fmt.Println(d.Retry, d.Delay >= lo && d.Delay <= hi, d.Delay == p.RoundDown(d.Delay))
	// Output: true true true
}

// Delays wait in delay queues of two significant digits by default
// (REBOUND_DELAY_DIGITS): a least delay rounds up to one, a deadline down.
func ExamplePolicy_RoundUp() {
	var p policy.Policy
	for _, d := range []time.Duration{1234 * time.Millisecond, 56789 * time.Millisecond, time.Millisecond, 0} {
		fmt.Println(d, "→", p.RoundUp(d), p.RoundDown(d))
	}
	// Output:
	// 1.234s → 1.3s 1.2s
	// 56.789s → 57s 56s
	// 1ms → 1ms 1ms
	// 0s → 0s 0s
}

// The schedule of the Google HTTP client's defaults: 500ms growing by half
// each time, ±50 %, up to 1m, for at most 15 minutes.
func ExamplePolicy_Schedule() {
	p := policy.Policy{
		Backoff:      policy.Exponential,
		MinDelay:     500 * time.Millisecond,
		MaxDelay:     time.Minute,
		Multiplier:   1.5,
		Jitter:       policy.ProportionalJitter,
		JitterFactor: 0.5,
		MaxDuration:  15 * time.Minute,
		Deadline:     "clamp",
	}
	steps, stop := p.Schedule(1000)
	for _, s := range steps[:4] {
		fmt.Printf("retry %d: nominal %v, queued %v, between %v and %v\n", s.Retry+1, s.Nominal, s.Delay, s.Min, s.Max)
	}
	last := steps[len(steps)-1]
	fmt.Printf("%d retries, the last ends at %v; then %s\n", len(steps), last.Elapsed, stop.Reason)
	// Output:
	// retry 1: nominal 500ms, queued 500ms, between 250ms and 750ms
	// retry 2: nominal 750ms, queued 750ms, between 380ms and 1.1s
	// retry 3: nominal 1.125s, queued 1.1s, between 560ms and 1.7s
	// retry 4: nominal 1.6875s, queued 1.7s, between 840ms and 2.5s
	// 26 retries, the last ends at 15m0s; then max-duration
}
