package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// mkSuite builds a suite of 1000-message runs: rates[c][round] for each
// contender, and the CPU per message of this process and of the broker.
func mkSuite(cs []contender, rates map[string][]float64, selfUs, brokerUs float64) *suite {
	s := &suite{Name: "throughput", Mode: pinnedM, Contenders: cs}
	for _, c := range cs {
		for round, rate := range rates[c.Name] {
			const n = 1000
			t := trial{Contender: c.Name, Mode: pinnedM, Round: round, N: n, Elapsed: time.Duration(n / rate * float64(time.Second)),
				CPU: cpu{self: time.Duration(selfUs * n * 1000), selfSys: time.Duration(selfUs * n * 250), broker: time.Duration(brokerUs * n * 1000)}}
			t.CPU.threads[schedulerThreads] = t.CPU.broker
			s.Trials = append(s.Trials, t)
		}
	}
	return s
}

// A ratio pairs runs by round, so that a load that drifts over the
// invocation cancels out: the relay at twice rebound's rate in each round
// is at 2.00, though its median rate is not twice rebound's median.
func TestRatioPairsRunsByRound(t *testing.T) {
	s := mkSuite(throughputContenders(), map[string][]float64{
		"rebound": {1000, 3000, 500}, "relay": {2000, 6000, 1000}, "shovel": {1000, 1000, 1000},
	}, 40, 60)
	if got := s.ratio("relay", "rebound"); got != 2 {
		t.Errorf("relay ÷ rebound = %.2f, want 2.00", got)
	}
	if got := s.rate("rebound"); got != 1000 {
		t.Errorf("rebound's median rate %.0f, want 1000", got)
	}
	if got := s.ratio("shovel", "rebound"); got != 1 {
		t.Errorf("shovel ÷ rebound = %.2f, want the median of 1, 1/3, 2: 1.00", got)
	}
}

// The table compares every contender with the first, and gives the CPU
// per message of both processes; it holds numbers, no verdict.
func TestTableComparesWithTheBaseline(t *testing.T) {
	s := mkSuite(throughputContenders(), map[string][]float64{
		"rebound": {1000, 1000}, "relay": {1500, 1500}, "shovel": {800, 800},
	}, 40, 60)
	got := s.table()
	for _, want := range []string{
		"| contender | copies into | runs | msg/s | ÷ rebound | process CPU µs/msg | kernel | broker CPU µs/msg |",
		"| rebound | 1 delay queue | 2 | 1000 | 1.00 | 40.0 | 25 % | 60.0 | 60.0 / 0.0 / 0.0 |",
		"| relay | a queue | 2 | 1500 | 1.50 | 40.0 |",
		"| shovel | a queue | 2 | 800 | 0.80 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	for _, verdict := range []string{"| met |", "yes", "**no**", "What limits", "What bounds"} {
		if strings.Contains(got, verdict) {
			t.Errorf("table holds %q:\n%s", verdict, got)
		}
	}
}

// Each run that was not what it was meant to be gets a note under the
// runs.
func TestRunsTableNotesOddRuns(t *testing.T) {
	s := mkSuite([]contender{reboundC}, map[string][]float64{"rebound": {1000, 1000, 1000}}, 40, 60)
	s.Trials[0].Unpinned = "pinned runs need two CPUs"
	s.Trials[1].Attempts = 2
	s.Trials[2].Extra = 3
	got := s.runsTable()
	for _, want := range []string{
		"rebound, round 1 ran unpinned: pinned runs need two CPUs.",
		"rebound, round 2 is attempt 2",
		"rebound, round 3 left 0 messages in the source and 3 extra copies.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("runs table lacks %q:\n%s", want, got)
		}
	}
}

// A spread contender says how many delay queues its copies went to.
func TestSpreadContenders(t *testing.T) {
	cs, err := spreadContenders(300, 2000, []int{2, 1}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 4 || cs[0].Name != reboundC.Name || cs[1].Bound != 300 || cs[2].Spread.Digits != 2 || cs[3].Spread.Digits != 1 {
		t.Fatalf("contenders %+v", cs)
	}
	if got := into(cs[1]); got != "1 delay queue of 300 bound" {
		t.Errorf("bound run copies into %q", got)
	}
	if got := into(cs[3]); !strings.Contains(got, " delay queues, the busiest with ") {
		t.Errorf("spread run copies into %q", got)
	}
	if cs, _ := spreadContenders(0, 2000, nil, true); len(cs) != 1 {
		t.Errorf("without a bound run or digits: %d contenders, want rebound alone", len(cs))
	}
	// Where the broker can hold, each spread runs over quorum delay
	// queues and into the hold queue too.
	cs, _ = spreadContenders(0, 2000, []int{1}, true)
	if len(cs) != 4 || !slices.Contains(cs[2].Env, "REBOUND_QUEUE_TYPE=quorum") || !slices.Contains(cs[3].Env, "REBOUND_DELAY_MODE=hold") || cs[3].Spread == nil {
		t.Errorf("spread contenders of a broker that can hold: %+v", cs)
	}
	if got := into(cs[3]); got != "the hold queue" {
		t.Errorf("hold run copies into %q", got)
	}
}
