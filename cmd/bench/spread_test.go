package main

import (
	"testing"
	"time"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/policy"
)

// The spread runs rest on rebound's policy, configured as startRebound
// configures it, sending copy i to delay i mod 300 with the round-robin
// random source: 300 distinct delay queues, none shorter than a run.
func TestSpreadReachesEveryDelayQueue(t *testing.T) {
	delays := spreadDelays(300)
	if len(delays) != 300 {
		t.Fatalf("spreadDelays(300) gave %d delays", len(delays))
	}
	cfg, err := config.Load(append([]string{"REBOUND_BACKOFF=constant"}, spreadEnv()...))
	if err != nil {
		t.Fatal(err)
	}
	p, r := cfg.Policy(), spreadRand(delays)()
	now := time.Now()
	seen := map[time.Duration]bool{}
	for i := range 2 * len(delays) {
		got := p.Decide(policy.State{StartedAt: now}, now, r)
		want := delays[i%len(delays)]
		if !got.Retry || got.Delay != want {
			t.Fatalf("copy %d: decision %+v, want a retry after %s", i, got, want)
		}
		if got.Delay < retryDelay || policy.RoundDelay(got.Delay) != got.Delay {
			t.Errorf("copy %d: delay %s is shorter than a run or not a delay queue's", i, got.Delay)
		}
		seen[got.Delay] = true
	}
	if len(seen) != 300 {
		t.Errorf("copies went to %d delay queues, want 300", len(seen))
	}
	if all := spreadDelays(maxSpread + 5); len(all) != maxSpread || all[len(all)-1] >= spreadMax {
		t.Errorf("spreadDelays past maxSpread: %d delays, the last %s", len(all), all[len(all)-1])
	}
}
