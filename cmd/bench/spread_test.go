package main

import (
	"slices"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/policy"
)

// The spread runs rest on rebound's policy, configured as startRebound
// configures it, sending copy i to the i-th delay of the sequence with
// the round-robin random source: as many delay queues as the default
// policy uses, none shorter than a run.
func TestSpreadSendsEachCopyWhereTheSequenceSays(t *testing.T) {
	cfg, err := config.Load(append([]string{"REBOUND_BACKOFF=constant"}, spreadEnv()...))
	if err != nil {
		t.Fatal(err)
	}
	for _, digits := range []int{1, 2} {
		sp, err := defaultPolicySpread(3000, digits)
		if err != nil {
			t.Fatal(err)
		}
		p, r := cfg.PolicySet().Default().Policy, spreadRand(sp.Sequence)()
		now := time.Now()
		seen := map[time.Duration]bool{}
		for i := range 2 * len(sp.Sequence) {
			got := p.Decide(policy.State{StartedAt: now}, now, r)
			want := sp.Sequence[i%len(sp.Sequence)]
			if !got.Retry || got.Delay != want {
				t.Fatalf("%d digits, copy %d: decision %+v, want a retry after %s", digits, i, got, want)
			}
			if got.Delay < retryDelay {
				t.Errorf("%d digits, copy %d: delay %s is shorter than a run", digits, i, got.Delay)
			}
			seen[got.Delay] = true
		}
		if len(seen) != len(sp.Queues) {
			t.Errorf("%d digits: copies went to %d delay queues, want %d", digits, len(seen), len(sp.Queues))
		}
		if first := sp.Sequence[:len(sp.Queues)]; len(slices.Compact(slices.Sorted(slices.Values(first)))) != len(sp.Queues) {
			t.Errorf("%d digits: the first %d copies do not reach every delay queue", digits, len(sp.Queues))
		}
	}
}

// The queues stand for the default policy's delays at the digits asked:
// rounded there, within the policy's range, fewer with fewer digits, and
// the same in every invocation.
func TestDefaultPolicySpread(t *testing.T) {
	const n = 20000
	counts := map[int]int{}
	for _, digits := range []int{1, 2} {
		sp, err := defaultPolicySpread(n, digits)
		if err != nil {
			t.Fatal(err)
		}
		if len(sp.Sequence) != n || sp.Digits != digits {
			t.Fatalf("%d digits: %d copies, digits %d", digits, len(sp.Sequence), sp.Digits)
		}
		shares := map[time.Duration]int{}
		for _, long := range sp.Sequence {
			d, ok := sp.Queues[long]
			if !ok {
				t.Fatalf("%d digits: long delay %s stands for no delay of the policy", digits, long)
			}
			shares[d]++
		}
		for d := range shares {
			if d <= 0 || d > time.Hour || (policy.Policy{DelayDigits: digits}).RoundDown(d) != d {
				t.Errorf("%d digits: %s is not a delay of the default policy rounded there", digits, d)
			}
		}
		most := 0
		for _, c := range shares {
			most = max(most, c)
		}
		if sp.Busiest != float64(most)/n {
			t.Errorf("%d digits: busiest %.3f, want %.3f", digits, sp.Busiest, float64(most)/n)
		}
		again, _ := defaultPolicySpread(n, digits)
		if !slices.Equal(again.Sequence, sp.Sequence) {
			t.Errorf("%d digits: two draws differ", digits)
		}
		counts[digits] = len(sp.Queues)
		t.Logf("%d digits: %d delay queues, the busiest %.1f %% of the copies", digits, len(sp.Queues), sp.Busiest*100)
	}
	// Full jitter from 1 ms to 1 h: about 7 decades, at most 9 delays a
	// decade with one digit, 90 with two.
	if counts[1] < 30 || counts[1] > 63 || counts[2] < 300 || counts[2] > 630 {
		t.Errorf("delay queues: %d at one digit, %d at two", counts[1], counts[2])
	}
}

func TestGridDelays(t *testing.T) {
	for _, digits := range []int{1, 2, 3} {
		ds := gridDelays(50, digits)
		if ds[0] != retryDelay {
			t.Errorf("%d digits: starts at %s", digits, ds[0])
		}
		for i, d := range ds {
			if (policy.Policy{DelayDigits: digits}).RoundDown(d) != d || (i > 0 && d <= ds[i-1]) || d >= spreadMax {
				t.Errorf("%d digits: delay %d, %s, off the grid or out of order", digits, i, d)
			}
		}
	}
	if got := gridDelays(3, 3); !slices.Equal(got, []time.Duration{600 * time.Second, 601 * time.Second, 602 * time.Second}) {
		t.Errorf("three digits: %v", got)
	}
	if all := spreadDelays(maxSpread + 5); len(all) != maxSpread {
		t.Errorf("spreadDelays past maxSpread: %d delays", len(all))
	}
}
