package cli

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/rebound-mq/rebound/config"
)

// wantSchedule runs "rebound schedule" with environ and compares the
// whole table it prints with want.
func wantSchedule(t *testing.T, environ []string, want string) {
	t.Helper()
	out, _, err := runCLI(t, environ, "schedule")
	if err != nil {
		t.Fatalf("schedule: %v", err)
	}
	if out != want {
		t.Errorf("schedule:\n%s\nwant:\n%s", out, want)
	}
}

func TestScheduleDefaults(t *testing.T) {
	// DESIGN.md's defaults: exponential from 1s doubling, full jitter, 10
	// retries. 128s, 256s and 512s are queued at two significant digits.
	// The header says that delay and cumulative leave jitter out.
	want := `retry  nominal  delay (no jitter)  jitter min  jitter max  cumulative (no jitter)
1      1s       1s                 0s          1s          1s
2      2s       2s                 0s          2s          3s
3      4s       4s                 0s          4s          7s
4      8s       8s                 0s          8s          15s
5      16s      16s                0s          16s         31s
6      32s      32s                0s          32s         1m3s
7      1m4s     1m4s               0s          1m4s        2m7s
8      2m8s     2m10s              0s          2m10s       4m17s
9      4m16s    4m20s              0s          4m20s       8m37s
10     8m32s    8m30s              0s          8m30s       17m7s
parked after retry 10: max retries 10 reached (REBOUND_MAX_RETRIES)
`
	wantSchedule(t, nil, want)
}

var googleHTTPClient = []string{
	"REBOUND_MIN_DELAY=500ms", "REBOUND_MULTIPLIER=1.5", "REBOUND_JITTER=proportional",
	"REBOUND_JITTER_FACTOR=0.5", "REBOUND_MAX_DELAY=1m", "REBOUND_MAX_DURATION=15m", "REBOUND_MAX_RETRIES=0",
}

func TestScheduleGoogleHTTPClient(t *testing.T) {
	_, lines := runCLILines(t, googleHTTPClient, "schedule", "-format", "table")
	// The client's documented table: interval, randomized interval bounds
	// (here as the delay queue holds them).
	want := [][]string{
		{"1", "500ms", "500ms", "250ms", "750ms", "500ms"},
		{"2", "750ms", "750ms", "380ms", "1.1s", "1.25s"},
		{"3", "1.125s", "1.1s", "560ms", "1.7s", "2.35s"},
		{"4", "1.6875s", "1.7s", "840ms", "2.5s", "4.05s"},
		{"5", "2.53125s", "2.5s", "1.3s", "3.8s", "6.55s"},
		{"6", "3.796875s", "3.8s", "1.9s", "5.7s", "10.35s"},
		{"7", "5.6953125s", "5.7s", "2.8s", "8.5s", "16.05s"},
		{"8", "8.54296875s", "8.5s", "4.3s", "13s", "24.55s"},
		{"9", "12.814453125s", "13s", "6.4s", "19s", "37.55s"},
		{"10", "19.221679688s", "19s", "9.6s", "29s", "56.55s"},
	}
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "retry nominal delay (no jitter) jitter min jitter max cumulative (no jitter)" {
		t.Errorf("header %q", lines[0])
	}
	for i, w := range want {
		if got := strings.Fields(lines[i+1]); strings.Join(got, " ") != strings.Join(w, " ") {
			t.Errorf("row %d: %q, want %q", i+1, got, w)
		}
	}
	// Capped at 1m from retry 13; the 15m budget ends it, the last delay
	// shortened to end exactly there.
	if got := strings.Fields(lines[13]); got[1] != "1m" || got[4] != "1m" {
		t.Errorf("row 13: %q, want a 1m nominal delay and max", got)
	}
	last := strings.Fields(lines[len(lines)-2])
	if last[len(last)-1] != "15m" {
		t.Errorf("last row %q, want it to end at 15m", last)
	}
	if got, want := lines[len(lines)-1], "parked after retry 26: budget 15m reached (REBOUND_MAX_DURATION)"; got != want {
		t.Errorf("stop line %q, want %q", got, want)
	}
}

func TestScheduleJSON(t *testing.T) {
	out, errOut, err := runCLI(t, googleHTTPClient, "schedule", "--format", "json")
	if err != nil {
		t.Fatalf("schedule: %v", err)
	}
	var rows []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("stdout is not a JSON array of objects: %v\n%s", err, out)
	}
	if len(rows) != 26 {
		t.Fatalf("%d rows, want 26", len(rows))
	}
	fields := []string{"retry", "delay_ms", "min_ms", "max_ms", "cumulative_ms"}
	for i, row := range rows {
		if len(row) != len(fields) {
			t.Errorf("row %d has fields %v, want exactly %v", i, row, fields)
		}
		for _, f := range fields {
			var n int64
			if err := json.Unmarshal(row[f], &n); err != nil {
				t.Errorf("row %d: %s = %s, want an integer: %v", i, f, row[f], err)
			}
		}
	}
	var typed []struct {
		Retry        int   `json:"retry"`
		DelayMs      int64 `json:"delay_ms"`
		MinMs        int64 `json:"min_ms"`
		MaxMs        int64 `json:"max_ms"`
		CumulativeMs int64 `json:"cumulative_ms"`
	}
	if err := json.Unmarshal([]byte(out), &typed); err != nil {
		t.Fatalf("decode rows: %v", err)
	}
	first, last := typed[0], typed[len(typed)-1]
	if first.Retry != 1 || first.DelayMs != 500 || first.MinMs != 250 || first.MaxMs != 750 || first.CumulativeMs != 500 {
		t.Errorf("first row %+v, want retry 1, 500ms in [250, 750], cumulative 500", first)
	}
	if last.Retry != 26 || last.DelayMs != 450 || last.CumulativeMs != 900_000 {
		t.Errorf("last row %+v, want retry 26, 450ms, cumulative 900000", last)
	}
	if errOut != "" {
		t.Errorf("stderr %q, want nothing: the JSON is the whole answer", errOut)
	}
}

func TestScheduleJSONEmpty(t *testing.T) {
	// A budget shorter than the first delay's millisecond: nothing is retried.
	out, errOut, err := runCLI(t, []string{"REBOUND_MAX_DURATION=100us", "REBOUND_DEADLINE=strict"}, "schedule", "-format=json")
	if err != nil {
		t.Fatalf("schedule: %v", err)
	}
	if strings.TrimSpace(out) != "[]" {
		t.Errorf("stdout %q, want []", out)
	}
	if errOut != "" {
		t.Errorf("stderr %q, want nothing", errOut)
	}
}

func TestScheduleCapped(t *testing.T) {
	_, lines := runCLILines(t, []string{"REBOUND_BACKOFF=constant", "REBOUND_MIN_DELAY=1ms", "REBOUND_MAX_RETRIES=0"}, "schedule")
	if len(lines) != 1+1000+1 {
		t.Errorf("%d lines, want a header, 1000 rows and a note", len(lines))
	}
	if want := "printout capped at 1000 retries; the policy goes on"; lines[len(lines)-1] != want {
		t.Errorf("last line %q, want %q", lines[len(lines)-1], want)
	}
}

func TestScheduleImmediateAndStrict(t *testing.T) {
	environ := []string{
		"REBOUND_IMMEDIATE_RETRIES=2", "REBOUND_JITTER=none", "REBOUND_MAX_DURATION=10s", "REBOUND_DEADLINE=strict",
	}
	want := `retry  nominal  delay (no jitter)  jitter min  jitter max  cumulative (no jitter)
1      0s       0s                 0s          0s          0s
2      0s       0s                 0s          0s          0s
3      1s       1s                 1s          1s          1s
4      2s       2s                 2s          2s          3s
5      4s       4s                 4s          4s          7s
parked after retry 5: the next delay, 8s, would end past the 10s budget (REBOUND_MAX_DURATION, REBOUND_DEADLINE=strict)
`
	wantSchedule(t, environ, want)
}

func TestScheduleInvalidConfig(t *testing.T) {
	_, _, err := runCLI(t, []string{"REBOUND_BACKOFF=fibonacci", "REBOUND_MIN_DELAY=soon"}, "schedule")
	var cfgErr *config.Error
	if !errors.As(err, &cfgErr) {
		t.Fatalf("error %v (%T), want a *config.Error", err, err)
	}
	if len(cfgErr.Problems) != 2 {
		t.Errorf("problems %v, want both reported", cfgErr.Problems)
	}
	if code := ExitCode(err, io.Discard); code != 2 {
		t.Errorf("exit status %d, want 2", code)
	}
}

func TestScheduleUsage(t *testing.T) {
	for _, args := range [][]string{
		{"-bogus"},
		{"-format", "yaml"},
		{"-format"},
		{"extra"},
	} {
		_, _, err := runCLI(t, nil, "schedule", args...)
		var usage usageError
		if !errors.As(err, &usage) {
			t.Errorf("%q: error %v (%T), want a usageError", args, err, err)
			continue
		}
		if code := ExitCode(err, io.Discard); code != 2 {
			t.Errorf("%q: exit status %d, want 2", args, code)
		}
	}
}

func TestScheduleHelp(t *testing.T) {
	// Help works even when the configuration would not load.
	out, _, err := runCLI(t, []string{"REBOUND_JITTER=bogus"}, "schedule", "-h")
	if err != nil {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"usage: rebound schedule", "--format", "cumulative"} {
		if !strings.Contains(out, want) {
			t.Errorf("-h output lacks %q:\n%s", want, out)
		}
	}
}
