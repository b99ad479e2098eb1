package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// trials builds two rounds of replica runs of 20 000 messages from each
// count's seconds per run and its cores (process, broker, machine).
func trials(runs map[int][2]float64, cores map[int][3]float64) *replicaScaling {
	r := &replicaScaling{}
	for k := range runs {
		r.Counts = append(r.Counts, k)
	}
	slices.Sort(r.Counts)
	for round := range 2 {
		for _, k := range r.Counts {
			elapsed := time.Duration(runs[k][round] * float64(time.Second))
			c := cores[k]
			at := func(x float64) time.Duration { return time.Duration(x * float64(elapsed)) }
			r.Trials = append(r.Trials, replicaTrial{Replicas: k, Round: round, N: 20000, Elapsed: elapsed,
				CPU: cpu{self: at(c[0]), broker: at(c[1]), machine: at(c[2])}})
		}
	}
	return r
}

// probed adds a probe in which the delay queue's process was busy 90 % of
// the time and the inbox's 45 %.
func probed(r *replicaScaling, late bool) *replicaScaling {
	r.Probe = &queueProbe{Replicas: r.Counts[len(r.Counts)-1], queueSample: queueSample{Late: late, Queues: []queueLoad{
		{Queue: "inbox", Busy: 0.45, Mailbox: 1.2, MaxMailbox: 25},
		{Queue: "delay.600000", Busy: 0.9, Mailbox: 28.5, MaxMailbox: 510},
	}}}
	return r
}

func TestReplicaReading(t *testing.T) {
	for _, tc := range []struct {
		name  string
		r     *replicaScaling
		want  []string
		never []string
	}{{
		name: "flat on a saturated machine",
		r: trials(map[int][2]float64{1: {4, 4.2}, 2: {3.9, 4.1}, 4: {4, 4}},
			map[int][3]float64{1: {0.3, 1.2, 1.6}, 2: {0.4, 1.5, 1.95}, 4: {0.4, 1.5, 1.96}}),
		want:  []string{"stops paying after **1 replica**", "(the best, 2 replicas, by +3 %", "the limit is the CPU the broker and rebound share"},
		never: []string{"quiet machine"},
	}, {
		name: "scales to 2 on a saturated machine",
		r: trials(map[int][2]float64{1: {4, 4}, 2: {3, 3}, 4: {3, 3}},
			map[int][3]float64{1: {0.3, 1.2, 1.6}, 2: {0.4, 1.5, 1.95}, 4: {0.4, 1.5, 1.96}}),
		want: []string{"stops paying after **2 replicas**", "With 2 replicas the broker used 1.50 cores", "the limit is the CPU"},
	}, {
		name: "other load",
		r: trials(map[int][2]float64{1: {4, 4}, 2: {4, 4}},
			map[int][3]float64{1: {0.2, 0.7, 2}, 2: {0.2, 0.7, 2}}),
		want:  []string{"1.10 of them by processes that are neither", "measure again on a quiet machine"},
		never: []string{"the limit is"},
	}, {
		name: "idle CPU left",
		r: trials(map[int][2]float64{1: {4, 4}, 2: {4, 4}},
			map[int][3]float64{1: {0.2, 0.8, 1.0}, 2: {0.3, 0.9, 1.2}}),
		want: []string{"still had idle CPU", "does not show what it is"},
	}, {
		name: "idle CPU left, one queue process always busy",
		r: probed(trials(map[int][2]float64{1: {4, 4}, 2: {4, 4}},
			map[int][3]float64{1: {0.2, 0.8, 1.0}, 2: {0.3, 0.9, 1.2}}), false),
		want: []string{"the busiest queue process, delay.600000's, was busy 90 % of the time, with 28.5 messages waiting",
			"not this host's CPU count but that queue"},
		never: []string{"does not show"},
	}, {
		name: "a probe that ran past the end names no limit",
		r: probed(trials(map[int][2]float64{1: {4, 4}, 2: {4, 4}},
			map[int][3]float64{1: {0.2, 0.8, 1.0}, 2: {0.3, 0.9, 1.2}}), true),
		want:  []string{"was busy 90 %", "does not show what it is"},
		never: []string{"but that queue"},
	}, {
		name: "still scaling",
		r: trials(map[int][2]float64{1: {4, 4}, 2: {2, 2}, 4: {1, 1}},
			map[int][3]float64{1: {0.2, 0.5, 0.7}, 2: {0.4, 1, 1.4}, 4: {0.8, 1, 1.8}}),
		want:  []string{"did not reach the point", "to 4.00× the rate of 1 replica with 4 replicas"},
		never: []string{"the limit is", "stops paying after"},
	}, {
		name: "a flat step before a gain is not the end",
		r: trials(map[int][2]float64{1: {4, 4}, 2: {3.9, 3.9}, 4: {3, 3}},
			map[int][3]float64{1: {0.2, 0.5, 0.7}, 2: {0.4, 1, 1.4}, 4: {0.8, 1, 1.8}}),
		want:  []string{"did not reach the point"},
		never: []string{"stops paying after"},
	}, {
		name: "one count",
		r:    trials(map[int][2]float64{1: {4, 4}}, map[int][3]float64{1: {0.2, 0.5, 0.7}}),
		want: []string{"Only 1 replica was measured"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.r.reading(2)
			t.Log(got)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("reading lacks %q:\n%s", w, got)
				}
			}
			for _, w := range tc.never {
				if strings.Contains(got, w) {
					t.Errorf("reading has %q:\n%s", w, got)
				}
			}
		})
	}
}
