package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.out != "docs/BENCHMARKS.md" || !slices.Equal(o.brokers, []string{"4.3", "3.10"}) ||
		!slices.Equal(o.modes, []mode{pinnedM, unpinned}) || !slices.Equal(o.digits, []int{2, 1}) ||
		!slices.Equal(o.delays, []time.Duration{time.Second, 10 * time.Second, time.Minute}) || o.short() {
		t.Errorf("defaults: %+v", o)
	}
	o, err = parseFlags([]string{"-brokers", "3.10", "-modes", "unpinned", "-n", "2000", "-runs", "1", "-digits", "", "-delays", ""}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.brokers, []string{"3.10"}) || o.firstMode() != unpinned || o.digits != nil || o.delays != nil || !o.short() {
		t.Errorf("short run: %+v", o)
	}
	for _, args := range [][]string{
		{"-brokers", "3.9"}, {"-brokers", "4.3,4.3"}, {"-brokers", ""}, {"-modes", "pinned,sideways"}, {"-modes", ""},
		{"-n", "0"}, {"-spread", "999"}, {"-digits", "4"}, {"-delays", "-1s"},
		// The suites e2e asserts are gone, and their flags with them.
		{"-storm", "100"}, {"-large", "10"}, {"-replicas", "1,2"}, {"-backlog", "1000"}, {"-levers"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}

// The report of a short run says so, names the full run, and holds its
// tables with no verdict written around them.
func TestReportOfAShortRun(t *testing.T) {
	args := []string{"-n", "1000", "-runs", "2"}
	o, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s := mkSuite(throughputContenders(), map[string][]float64{
		"rebound": {1000, 1000}, "relay": {1500, 1500}, "shovel": {800, 800},
	}, 40, 60)
	r := &report{started: time.Now(), args: args, opts: o, machine: machine{CPUs: "2"},
		brokers: []*brokerResult{{Name: "4.3", Version: "4.3.6", Suites: []*suite{s},
			Delays: []delayResult{{Delay: time.Second, Samples: 40, P50: 30 * time.Millisecond}}}}}
	got := r.markdown()
	for _, want := range []string{
		"Written by `go run ./cmd/bench -n 1000 -runs 2`",
		"**A short run** (`-n 1000`, `-runs 2`)", "The full run is `make bench` (`go run ./cmd/bench`)",
		"## RabbitMQ 4.3.6", "### Throughput, pinned", "| relay | a queue | 2 | 1500 | 1.50 |",
		"### Delay accuracy, unpinned", "| 1s | default | 40 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	for _, verdict := range []string{"## Targets", "| met |", "**no**", "What limits", "written by bench from the numbers"} {
		if strings.Contains(got, verdict) {
			t.Errorf("report holds %q", verdict)
		}
	}
}
