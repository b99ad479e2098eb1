package policy

import (
	"testing"
	"time"
)

func TestRefused(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	withDuration := func(d Deadline) Policy {
		return Policy{Backoff: Constant, MinDelay: time.Second, MaxDelay: time.Minute, MaxRetries: 3, MaxDuration: time.Minute, Deadline: d}
	}
	countOnly := Policy{Backoff: Constant, MinDelay: time.Second, MaxDelay: time.Minute, MaxRetries: 3, Deadline: clamp}
	for _, tc := range []struct {
		name    string
		p       Policy
		retries int
		elapsed time.Duration
		wait    time.Duration
		want    Decision
	}{
		{"waits within the budget", withDuration(clamp), 0, 10 * time.Second, 2 * time.Second, Decision{Retry: true, Delay: 2 * time.Second}},
		{"the retry count does not bound it", withDuration(clamp), 9, 10 * time.Second, 2 * time.Second, Decision{Retry: true, Delay: 2 * time.Second}},
		{"rounded up, never earlier", withDuration(clamp), 0, 0, 1234 * time.Millisecond, Decision{Retry: true, Delay: 1300 * time.Millisecond}},
		{"clamped to the deadline", withDuration(clamp), 0, 59 * time.Second, 4 * time.Second, Decision{Retry: true, Delay: time.Second}},
		{"strict parks past the deadline", withDuration(Strict), 0, 59 * time.Second, 4 * time.Second, Decision{Reason: OriginRefused}},
		{"lenient waits past it", withDuration(Lenient), 0, 59 * time.Second, 4 * time.Second, Decision{Retry: true, Delay: 4 * time.Second}},
		{"budget spent", withDuration(Lenient), 0, time.Minute, time.Second, Decision{Reason: OriginRefused}},
		{"less than a millisecond left", withDuration(clamp), 0, time.Minute - time.Microsecond, time.Second, Decision{Reason: OriginRefused}},
		{"no duration: counted", countOnly, 2, time.Hour, 30 * time.Second, Decision{Retry: true, Delay: 30 * time.Second}},
		{"no duration: count spent", countOnly, 3, 0, time.Second, Decision{Reason: OriginRefused}},
		{"no wait is a millisecond", countOnly, 0, 0, 0, Decision{Retry: true, Delay: time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := State{Retries: tc.retries, StartedAt: now.Add(-tc.elapsed)}
			if got := tc.p.Refused(s, now, tc.wait); got != tc.want {
				t.Errorf("Refused = %+v, want %+v", got, tc.want)
			}
		})
	}
}
