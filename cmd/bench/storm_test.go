package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPerSecond(t *testing.T) {
	base := time.Unix(1000, 900e6)
	times := []time.Time{base, base.Add(50 * time.Millisecond), base.Add(2 * time.Second), base.Add(100 * time.Millisecond)}
	if got := perSecond(times); !slices.Equal(got, []int{2, 1, 1}) {
		t.Errorf("perSecond = %v, want [2 1 1]: by wall-clock second", got)
	}
	if got := perSecond(nil); !slices.Equal(got, []int{0}) {
		t.Errorf("perSecond(nil) = %v", got)
	}
}

func TestStormCounts(t *testing.T) {
	peak, window, p50, p90 := stormCounts([]int{10, 100, 100, 100, 100, 100, 100, 100, 100, 130, 40})
	if peak != 130 || window != 106 || p50 != 100 || p90 != 100 {
		t.Errorf("peak %d, window %.0f, p50 %.0f, p90 %.0f", peak, window, p50, p90)
	}
	if _, window, _, _ := stormCounts([]int{300, 100}); window != 200 {
		t.Errorf("a storm shorter than the window: %.0f a second, want 200", window)
	}
}

func TestStormVerdict(t *testing.T) {
	steady := []int{60, 100, 100, 100, 100, 100, 100, 100, 100, 40}
	free := stormResult{Rate: 0, N: 400, Arrived: []int{700, 400}, Due: []int{900, 200}}
	for _, tc := range []struct {
		name     string
		capped   stormResult
		met      bool
		measured string
		bound    []string
	}{{
		name:   "holds",
		capped: stormResult{Rate: 100, N: 400, Arrived: steady, Due: steady},
		met:    true, measured: "due ≤ 100 a second; arrived ≤ 100 in a second, 100 a second over 5 (no cap: 700 in a second)",
	}, {
		name:   "a burst within the tolerance",
		capped: stormResult{Rate: 100, N: 400, Arrived: []int{100, 50, 140, 100, 100, 100, 100}, Due: steady},
		met:    true,
	}, {
		name:   "the calendar over the cap",
		capped: stormResult{Rate: 100, N: 400, Arrived: steady, Due: []int{100, 120, 80}},
		bound:  []string{"put 120 copies due in one second"},
	}, {
		name: "the broker late, then together",
		capped: stormResult{Rate: 100, N: 400, Arrived: []int{100, 0, 0, 300, 100}, Due: steady,
			Late: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 2500 * time.Millisecond}},
		bound: []string{"yet 300 arrived in one second", "later than due (median, 99th percentile and most: 20.0 ms / 2500.0 ms / 2500.0 ms)"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			v, ok := stormVerdict(&brokerResult{Version: "4.3.6", Storms: []stormResult{free, tc.capped}})
			if !ok {
				t.Fatal("no verdict")
			}
			t.Logf("%+v", v)
			if v.Met != tc.met || !strings.HasPrefix(v.Measured, tc.measured) || (v.Met && v.Bound != "") {
				t.Errorf("met %v, measured %q", v.Met, v.Measured)
			}
			for _, want := range tc.bound {
				if !strings.Contains(v.Bound, want) {
					t.Errorf("bound lacks %q", want)
				}
			}
			if !strings.Contains(v.Target, "REBOUND_RETRY_RATE=100") {
				t.Errorf("target %q", v.Target)
			}
		})
	}
	if _, ok := stormVerdict(&brokerResult{Storms: []stormResult{free}}); ok {
		t.Error("a verdict without a capped storm")
	}
}
