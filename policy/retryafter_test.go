package policy

import (
	"testing"
	"time"
)

// TestDecideRetryAfter: the consumer's Retry-After is a floor on the
// policy's delay, never past MaxDelay or the budget, and never parks a
// message by itself.
func TestDecideRetryAfter(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	base := Policy{Backoff: Constant, MinDelay: time.Second, MaxDelay: time.Minute, Jitter: NoJitter, MaxRetries: 10, Deadline: clamp}
	for _, tc := range []struct {
		name    string
		p       func(Policy) Policy
		after   time.Duration
		elapsed time.Duration
		want    Decision
	}{
		{"none", nil, 0, 0, Decision{Retry: true, Delay: time.Second, Drawn: time.Second}},
		{"below the policy's delay", nil, 500 * time.Millisecond, 0, Decision{Retry: true, Delay: time.Second, Drawn: time.Second}},
		{"raises it", nil, 30 * time.Second, 0, Decision{Retry: true, Delay: 30 * time.Second, Drawn: 30 * time.Second}},
		{"rounded up, never below", nil, 1234 * time.Millisecond, 0, Decision{Retry: true, Delay: 1300 * time.Millisecond, Drawn: 1234 * time.Millisecond}},
		{"capped at the max delay", nil, time.Hour, 0, Decision{Retry: true, Delay: time.Minute, Drawn: time.Minute}},
		{"an immediate retry waits", func(p Policy) Policy { p.ImmediateRetries = 2; return p }, 5 * time.Second, 0,
			Decision{Retry: true, Delay: 5 * time.Second, Drawn: 5 * time.Second}},
		{"capped at the budget", func(p Policy) Policy { p.MaxDuration = time.Hour; return p }, time.Minute, time.Hour - 10*time.Second,
			Decision{Retry: true, Delay: 10 * time.Second, Drawn: 10 * time.Second}},
		{"strict: capped, not parked", func(p Policy) Policy { p.MaxDuration = time.Hour; p.Deadline = Strict; return p }, time.Minute, time.Hour - 10*time.Second,
			Decision{Retry: true, Delay: 10 * time.Second, Drawn: 10 * time.Second}},
		{"spent budget still parks", func(p Policy) Policy { p.MaxDuration = time.Hour; return p }, time.Minute, time.Hour,
			Decision{Reason: maxDuration}},
		{"spent retries still park", func(p Policy) Policy { p.MaxRetries = 1; return p }, time.Minute, 0, Decision{Reason: MaxRetries}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := base
			if tc.p != nil {
				p = tc.p(p)
			}
			retries := 1
			if p.ImmediateRetries > 0 {
				retries = 0
			}
			got := p.Decide(State{Retries: retries, StartedAt: now.Add(-tc.elapsed), RetryAfter: tc.after}, now, nil)
			if got != tc.want {
				t.Errorf("Decide = %+v, want %+v", got, tc.want)
			}
		})
	}
}
