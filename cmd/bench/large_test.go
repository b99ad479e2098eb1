package main

import (
	"strings"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP rebound_messages_retried_total Messages sent back.
# TYPE rebound_messages_retried_total counter
rebound_messages_retried_total{policy="default",origin="a"} 7
rebound_messages_retried_total{policy="default",origin="b{x}"} 5
rebound_inflight_bytes 6.7108864e+07
rebound_prefetch 8
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if m["rebound_messages_retried_total"] != 12 || m["rebound_inflight_bytes"] != 64<<20 || m["rebound_prefetch"] != 8 {
		t.Errorf("parsed %v", m)
	}
	for _, bad := range []string{"rebound_prefetch\n", "rebound_prefetch eight\n", "rebound_prefetch{a=\"b\" 1\n"} {
		if _, err := parseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed without an error", bad)
		}
	}
}

func TestLargeScenarios(t *testing.T) {
	sc := largeScenarios(40)
	if len(sc) != 3 {
		t.Fatalf("%d scenarios", len(sc))
	}
	count := func(sizes []int, size int) int {
		n := 0
		for _, s := range sizes {
			if s == size {
				n++
			}
		}
		return n
	}
	if len(sc[0].Sizes) != 40 || count(sc[0].Sizes, largeSize) != 40 || sc[0].bytes() != 40*largeSize {
		t.Errorf("alone: %d messages, %d large, %d bytes", len(sc[0].Sizes), count(sc[0].Sizes, largeSize), sc[0].bytes())
	}
	if len(sc[1].Sizes) != 400 || count(sc[1].Sizes, largeSize) != 20 || count(sc[1].Sizes, smallSize) != 380 {
		t.Errorf("mixed: %d messages, %d large", len(sc[1].Sizes), count(sc[1].Sizes, largeSize))
	}
	for i := 0; i+20 <= len(sc[1].Sizes); i += 20 {
		if count(sc[1].Sizes[i:i+20], largeSize) != 1 {
			t.Errorf("mixed: messages %d to %d do not hold one large message", i, i+19)
		}
	}
	run := sc[2].Sizes
	if len(run) != smallRun+10 || count(run[:smallRun], smallSize) != smallRun || count(run[smallRun:], largeSize) != 10 {
		t.Errorf("run then large: %d messages", len(run))
	}
	for i, want := range []string{"40 × 8 MiB waiting", "380 × 1 KiB and 20 × 8 MiB, one in 20, interleaved", "5000 × 1 KiB, then 10 × 8 MiB"} {
		if sc[i].Name != want {
			t.Errorf("scenario %d is %q, want %q", i, sc[i].Name, want)
		}
	}
}

func TestLargeVerdicts(t *testing.T) {
	// Peaks relative to the manifests' limit, so the test follows it.
	under, over := int64(memoryLimit)*3/4, int64(memoryLimit)+12<<20
	br := &brokerResult{Name: "3.10", Version: "3.10.8", Large: []largeResult{
		{Scenario: "within", N: 200, Bytes: 200 * largeSize, Moved: 200, Elapsed: 4e9, Peak: under, MaxPrefetch: 8, MaxInflight: 64 << 20},
		{Scenario: "deep window", N: 5050, Large: 50, Bytes: 200 * largeSize, Moved: 5200, Elapsed: 8e9, Peak: 600 << 20, MaxPrefetch: 1024, MaxInflight: 500 << 20, Idle: 12 << 20},
		{Scenario: "shallow window", N: 200, Bytes: 200 * largeSize, Moved: 200, Elapsed: 4e9, Peak: over, MaxPrefetch: 8, MaxInflight: 64 << 20},
		{Scenario: "stopped", N: 5200, Bytes: 200 * largeSize, Moved: 3000, Elapsed: 2e9, Peak: 1100 << 20, MaxPrefetch: 1024, Stopped: true},
	}}
	vs := largeVerdicts(br)
	if len(vs) != 4 {
		t.Fatalf("%d verdicts", len(vs))
	}
	for i, want := range []struct {
		met      bool
		measured string
		bound    string
	}{
		{true, mib(under) + " (50 msg/s, 400 MiB/s)", ""},
		{false, "600.0 MiB", "50 of them here (400.0 MiB). That is the worst case the window does not cover"},
		{false, mib(over), "the process beyond the bodies it holds"},
		{false, "over 1024.0 MiB: stopped", "A window of 1024 holds 8192.0 MiB"},
	} {
		v := vs[i]
		if v.Met != want.met || !strings.HasPrefix(v.Measured, want.measured) || !strings.Contains(v.Bound, want.bound) || (v.Met && v.Bound != "") {
			t.Errorf("%s: %+v, want met %v, measured %q, bound with %q", br.Large[i].Scenario, v, want.met, want.measured, want.bound)
		}
		if !strings.Contains(v.Target, mib(memoryLimit)) || !strings.Contains(v.Target, br.Large[i].Scenario) {
			t.Errorf("target %q", v.Target)
		}
	}
}
