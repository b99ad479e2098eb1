package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/rebound-mq/rebound/config"
)

// simulateOutput is the document simulate prints with --format json,
// written out here as its readers see it: its shape is public interface.
type simulateOutput[T any] struct {
	Model      string            `json:"model"`
	Seed       uint64            `json:"seed"`
	Parameters map[string]string `json:"parameters"`
	Results    []T               `json:"results"`
}

// burstRow and outageRow are what the tests read of a burst and of an
// outage result.
type burstRow struct {
	Strategy   string `json:"strategy"`
	Clients    int    `json:"clients"`
	Requests   int    `json:"requests"`
	Rejected   int    `json:"rejected"`
	LatencyP50 *int   `json:"latency_p50"`
}

type outageRow struct {
	Strategy    string         `json:"strategy"`
	Recovered   bool           `json:"recovered"`
	RecoveryS   *float64       `json:"recovery_s"`
	DelayQueues int            `json:"delay_queues"`
	Parked      map[string]int `json:"parked"`
	AttemptsP99 int            `json:"attempts_p99"`
	Pending     int            `json:"pending"`
	Backlog     int            `json:"backlog"`
	RetryRate   float64        `json:"retry_rate"`
}

// decodeOutput decodes simulate's JSON document, refusing fields
// simulateOutput lacks, and reads each result into a T.
func decodeOutput[T any](t *testing.T, s string) simulateOutput[T] {
	t.Helper()
	var raw simulateOutput[json.RawMessage]
	decodeStrict(t, s, &raw)
	got := simulateOutput[T]{Model: raw.Model, Seed: raw.Seed, Parameters: raw.Parameters}
	for i, r := range raw.Results {
		var v T
		if err := json.Unmarshal(r, &v); err != nil {
			t.Fatalf("result %d into %T: %v\n%s", i, v, err, r)
		}
		got.Results = append(got.Results, v)
	}
	return got
}

// decodeStrict decodes one JSON value into v, refusing fields v lacks.
func decodeStrict(t *testing.T, s string, v any) {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(s))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		t.Fatalf("decode %T: %v\n%s", v, err, s)
	}
}

// wantResultFields checks that every object in the "results" list has
// each required field. The names are public interface (the issue and
// DESIGN.md list them), so they are checked literally: renaming a tag fails
// here even though the typed decode, using the same type, would still
// succeed.
func wantResultFields(t *testing.T, s string, required ...string) {
	t.Helper()
	var raw struct {
		Results []map[string]json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		t.Fatal(err)
	}
	for i, r := range raw.Results {
		for _, f := range required {
			if _, ok := r[f]; !ok {
				t.Errorf("result %d lacks field %q (has %v)", i, f, slices.Sorted(maps.Keys(r)))
			}
		}
	}
}

func TestSimulateBurstJSON(t *testing.T) {
	out, _, err := runCLI(t, nil, "simulate", "burst", "--format", "json")
	if err != nil {
		t.Fatalf("simulate burst: %v", err)
	}
	got := decodeOutput[burstRow](t, out)
	if got.Model != "burst" || got.Seed != 1 {
		t.Errorf("model %q seed %d, want burst and the default seed 1", got.Model, got.Seed)
	}
	var names []string
	byName := map[string]burstRow{}
	for _, r := range got.Results {
		names = append(names, r.Strategy)
		byName[r.Strategy] = r
		if r.Clients != 800 || r.Requests < r.Clients || r.Rejected > r.Requests {
			t.Errorf("%s: %+v: want 800 clients, at least one request each", r.Strategy, r)
		}
	}
	if want := []string{"NB", "CB", "URB", "EB", "REB", "policy"}; !slices.Equal(names, want) {
		t.Fatalf("strategies %v, want %v", names, want)
	}
	if eb, nb := byName["EB"], byName["NB"]; eb.LatencyP50 == nil || eb.Requests >= nb.Requests {
		t.Errorf("EB %+v against NB %+v: want EB answered with fewer requests", eb, nb)
	}
	wantResultFields(t, out, "strategy", "clients", "completed", "requests", "rejected",
		"latency_p50", "latency_p75", "latency_p90", "latency_p99", "latency_max")
}

func TestSimulateBurstTable(t *testing.T) {
	out, lines := runCLILines(t, nil, "simulate", "burst", "-strategies", "EB,REB", "-seed", "3")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want a header, two rows and a note:\n%s", len(lines), out)
	}
	header := strings.Fields(lines[0])
	for _, col := range []string{"strategy", "completed", "requests", "rejected", "p50", "p75", "p90", "p99", "max"} {
		if !slices.Contains(header, col) {
			t.Errorf("header %q lacks %q", lines[0], col)
		}
	}
	if !strings.HasPrefix(lines[1], "EB ") || !strings.HasPrefix(lines[2], "REB ") || !strings.Contains(lines[3], "seed 3") {
		t.Errorf("rows or note wrong:\n%s", out)
	}
}

func TestSimulateOutageJSON(t *testing.T) {
	out, _, err := runCLI(t, nil, "simulate", "outage", "--format=json", "--strategies", "policy,fixed",
		"--compare", "text-eb: REBOUND_MIN_DELAY=100ms REBOUND_MULTIPLIER=2.7 REBOUND_JITTER=gaussian REBOUND_JITTER_FACTOR=0.1 REBOUND_MAX_DELAY=5m REBOUND_MAX_RETRIES=0")
	if err != nil {
		t.Fatalf("simulate outage: %v", err)
	}
	got := decodeOutput[outageRow](t, out)
	if got.Model != "outage" || len(got.Results) != 3 {
		t.Fatalf("model %q, %d results: want outage and 3", got.Model, len(got.Results))
	}
	policy, fixed, text := got.Results[0], got.Results[1], got.Results[2]
	if policy.Strategy != "policy" || fixed.Strategy != "fixed" || text.Strategy != "text-eb" {
		t.Fatalf("strategies %s, %s, %s", policy.Strategy, fixed.Strategy, text.Strategy)
	}
	// The 003 text's finding with its parameters: fixed-interval retries
	// never let the dependency recover, exponential backoff does.
	if !policy.Recovered || policy.RecoveryS == nil || !text.Recovered || fixed.Recovered || fixed.RecoveryS != nil {
		t.Errorf("recovered: policy %v (%v), text's backoff %v, fixed %v: want yes, yes, no", policy.Recovered, policy.RecoveryS, text.Recovered, fixed.Recovered)
	}
	if fixed.Parked["max-retries"] == 0 || fixed.DelayQueues != 1 {
		t.Errorf("fixed: parked %v in %d delay queues: want max-retries parks and one queue", fixed.Parked, fixed.DelayQueues)
	}
	wantResultFields(t, out, "strategy", "recovered", "recovery_s", "peak_dependency_rps", "peak_delayed", "delay_queues",
		"parked", "attempts_p50", "attempts_p99", "latency_p50_s", "latency_p99_s")
}

func TestSimulateOutageTable(t *testing.T) {
	out, lines := runCLILines(t, nil, "simulate", "outage", "-strategies", "policy", "-horizon", "2m")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "policy ") || !strings.Contains(lines[2], "2m horizon") {
		t.Errorf("table:\n%s\nwant a header, the policy's row and a note naming the 2m horizon", out)
	}
}

func TestSimulateDeterministic(t *testing.T) {
	for _, args := range [][]string{
		{"burst", "-format", "json", "-strategies", "URB,REB,policy"},
		{"outage", "-format", "json", "-strategies", "policy", "-horizon", "2m"},
	} {
		a, _, err := runCLI(t, nil, "simulate", args...)
		if err != nil {
			t.Fatal(err)
		}
		b, _, _ := runCLI(t, nil, "simulate", args...)
		c, _, _ := runCLI(t, nil, "simulate", append(args, "-seed", "2")...)
		if a != b {
			t.Errorf("%v: two runs differ", args)
		}
		if a == c {
			t.Errorf("%v: seeds 1 and 2 give the same output", args)
		}
	}
}

func TestSimulateSVG(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"burst", "-strategies", "EB,REB"},
		{"outage", "-strategies", "policy", "-horizon", "2m"},
	} {
		path := filepath.Join(dir, args[0]+".svg")
		out, _, err := runCLI(t, nil, "simulate", append(args, "-svg", path)...)
		if err != nil {
			t.Fatal(err)
		}
		svg, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(svg, []byte("<svg ")) || !bytes.HasSuffix(svg, []byte("</svg>\n")) {
			t.Errorf("%s: %q...: not an SVG document", args[0], svg[:min(40, len(svg))])
		}
		if !strings.Contains(out, "strategy") {
			t.Errorf("%s: the table is still printed with -svg; got %q", args[0], out)
		}
	}
	_, _, err := runCLI(t, nil, "simulate", "burst", "-strategies", "EB", "-svg", filepath.Join(dir, "missing", "x.svg"))
	if err == nil || ExitCode(err, io.Discard) != 1 {
		t.Errorf("unwritable plot: error %v, want exit status 1", err)
	}
}

func TestSimulateHelp(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"-h"}, []string{"simulate burst", "simulate outage"}},
		{[]string{"burst", "-h"}, []string{"overwhelmed", "min(2^attempts, --exp-cap)", "max(2^attempts, 30)", "--clients", "--spike", "--tick", "--strategies", "--svg"}},
		{[]string{"outage", "--help"}, []string{"Poisson", "--min-latency", "--factor", "--compare", "Recovered:", "fail at --timeout", "--concurrency"}},
	}
	for _, tt := range tests {
		out, errOut, err := runCLI(t, nil, "simulate", tt.args...)
		if err != nil {
			t.Errorf("%v: %v", tt.args, err)
		}
		if errOut != "" {
			t.Errorf("%v: help on stderr %q, want it on stdout", tt.args, errOut)
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: help lacks %q", tt.args, w)
			}
		}
	}
	var stdout bytes.Buffer
	if err := Run(context.Background(), []string{"help"}, nil, &stdout, io.Discard); err != nil || !strings.Contains(stdout.String(), "simulate") {
		t.Errorf("rebound help does not list simulate: %v\n%s", err, stdout.String())
	}
}

func TestSimulateUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "missing command"},
		{[]string{"storm"}, `unknown command "storm"`},
		{[]string{"burst", "-clients", "many"}, "invalid value"},
		{[]string{"burst", "-clients", "0"}, "clients 0"},
		{[]string{"burst", "-format", "yaml"}, `-format "yaml"`},
		{[]string{"burst", "extra"}, `unexpected argument "extra"`},
		{[]string{"burst", "-strategies", "EB,XB"}, `unknown strategy "XB"`},
		{[]string{"burst", "-strategies", "EB,EB"}, "listed twice"},
		{[]string{"burst", "-strategies", "policy", "-tick", "0s"}, "tick 0s"},
		{[]string{"outage", "-horizon", "1m"}, "horizon 1m0s"},
		{[]string{"outage", "-step", "7ms"}, "step 7ms"},
		{[]string{"outage", "-interval", "0s"}, "-interval 0s"},
		{[]string{"outage", "-strategies", "backoff"}, `unknown strategy "backoff"`},
		{[]string{"outage", "-strategies", ""}, "empty list"},
		{[]string{"outage", "-compare", "BACKOFF=constant"}, "want REBOUND_NAME=value"},
		{[]string{"outage", "-compare", "policy: REBOUND_MIN_DELAY=2s"}, `the name "policy" is taken`},
	}
	for _, tt := range tests {
		_, _, err := runCLI(t, nil, "simulate", tt.args...)
		var usage usageError
		if !errors.As(err, &usage) || ExitCode(err, io.Discard) != 2 {
			t.Errorf("%v: error %v (%T), want a usage error, exit 2", tt.args, err, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %q, want it to say %q", tt.args, err, tt.want)
		}
	}
}

func TestSimulateConfigErrors(t *testing.T) {
	tests := []struct {
		environ []string
		args    []string
		want    string
	}{
		{[]string{"REBOUND_BACKOFF=fibonacci"}, []string{"burst"}, `REBOUND_BACKOFF="fibonacci"`},
		{[]string{"REBOUND_MIN_DELAY=soon"}, []string{"outage"}, `REBOUND_MIN_DELAY="soon"`},
		// A -compare is checked by config as the environment is.
		{nil, []string{"outage", "-compare", "REBOUND_JITTER=loud REBOUND_MAX_RETRIES=-1"}, `REBOUND_JITTER="loud"`},
		{nil, []string{"outage", "-compare", "REBOUND_BACKOFF=linear REBOUND_MAX_RETRIES=1"}, "REBOUND_MAX_RETRIES"},
	}
	for _, tt := range tests {
		_, _, err := runCLI(t, tt.environ, "simulate", tt.args...)
		var cfgErr *config.Error
		if !errors.As(err, &cfgErr) || ExitCode(err, io.Discard) != 2 {
			t.Errorf("%v %v: error %v, want a configuration error, exit 2", tt.environ, tt.args, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v %v: error %q, want it to name %q", tt.environ, tt.args, err, tt.want)
		}
	}
}

// TestSimulateCompareOverlays: a -compare replaces the variables it names
// and keeps the rest of the environment.
func TestSimulateCompareOverlays(t *testing.T) {
	environ := []string{"REBOUND_MAX_RETRIES=3", "REBOUND_JITTER=none", "PATH=/bin"}
	out, _, err := runCLI(t, environ, "simulate", "outage", "-format", "json", "-horizon", "2m", "-strategies", "policy",
		"-compare", "REBOUND_JITTER=none REBOUND_MAX_RETRIES=3", "-compare", "REBOUND_MAX_RETRIES=5")
	if err != nil {
		t.Fatal(err)
	}
	got := decodeOutput[outageRow](t, out)
	if len(got.Results) != 3 {
		t.Fatalf("%d results, want 3", len(got.Results))
	}
	same, five := got.Results[1], got.Results[2]
	if same.Strategy != "JITTER=none MAX_RETRIES=3" || five.Strategy != "MAX_RETRIES=5" {
		t.Errorf("names %q, %q", same.Strategy, five.Strategy)
	}
	// Restating the environment gives the configured policy's run (every
	// field of the result but its name); raising the retry limit (jitter
	// still none, from the environment) changes it.
	all := decodeOutput[map[string]any](t, out)
	first, again := all.Results[0], all.Results[1]
	first["strategy"] = again["strategy"]
	if !reflect.DeepEqual(first, again) {
		a, _ := json.Marshal(first)
		b, _ := json.Marshal(again)
		t.Errorf("the same policy through -compare ran differently:\n%s\n%s", a, b)
	}
	if five.AttemptsP99 <= same.AttemptsP99 {
		t.Errorf("attempts p99 %d with 5 retries, %d with 3: want more", five.AttemptsP99, same.AttemptsP99)
	}
}

// TestSimulateCompareRefusesAMisspeltVariable: a --compare that sets a
// variable rebound does not read would compare the policy with itself.
func TestSimulateCompareRefusesAMisspeltVariable(t *testing.T) {
	_, _, err := runCLI(t, nil, "simulate", "outage", "-horizon", "2m", "-compare", "REBOUND_MAX_RETRY=5")
	if !isUsageError(err) || !strings.Contains(err.Error(), "did you mean REBOUND_MAX_RETRIES?") {
		t.Errorf("misspelt --compare: %v, want a usage error naming the variable it meant", err)
	}
}

// TestSimulateJSONHoldsTheScenario: the JSON carries every parameter of
// the run, given or default.
func TestSimulateJSONHoldsTheScenario(t *testing.T) {
	for _, args := range [][]string{
		{"outage", "-format", "json", "-strategies", "policy", "-horizon", "2m"},
		{"burst", "-format", "json", "-strategies", "EB"},
	} {
		out, _, err := runCLI(t, nil, "simulate", args...)
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Parameters map[string]string `json:"parameters"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatal(err)
		}
		if got.Parameters["seed"] == "" || (args[0] == "outage" && (got.Parameters["horizon"] != "2m0s" || got.Parameters["rate"] == "")) {
			t.Errorf("simulate %s: parameters %v, want every flag's value", args[0], got.Parameters)
		}
	}
}

// TestSimulateCapsOnlyThePolicyUnderTest: REBOUND_RETRY_RATE caps the
// policy; fixed and immediate stand for a consumer without it, unless
// --cap-all.
func TestSimulateCapsOnlyThePolicyUnderTest(t *testing.T) {
	for _, tc := range []struct {
		capAll bool
		want   []float64
	}{{false, []float64{50, 0, 0}}, {true, []float64{50, 50, 50}}} {
		args := []string{"outage", "-format", "json", "-horizon", "2m"}
		if tc.capAll {
			args = append(args, "-cap-all")
		}
		out, _, err := runCLI(t, []string{"REBOUND_RETRY_RATE=50"}, "simulate", args...)
		if err != nil {
			t.Fatal(err)
		}
		got := decodeOutput[outageRow](t, out)
		for i, r := range got.Results {
			if r.RetryRate != tc.want[i] {
				t.Errorf("--cap-all %v: %s capped at %g, want %g", tc.capAll, r.Strategy, r.RetryRate, tc.want[i])
			}
		}
	}
}

// TestSimulateNotRecoveredWithABacklog: retries still waiting at the
// horizon are not a recovery, however healthy the last seconds look.
func TestSimulateNotRecoveredWithABacklog(t *testing.T) {
	env := []string{"REBOUND_BACKOFF=constant", "REBOUND_MIN_DELAY=5m", "REBOUND_MAX_DELAY=5m", "REBOUND_MAX_RETRIES=3"}
	out, _, err := runCLI(t, env, "simulate", "outage", "-format", "json", "-strategies", "policy", "-horizon", "3m")
	if err != nil {
		t.Fatal(err)
	}
	got := decodeOutput[outageRow](t, out)
	if r := got.Results[0]; r.Backlog == 0 || r.Recovered {
		t.Errorf("recovered %v with %d in the delay queues at the horizon (pending %d): want a backlog, not recovered", r.Recovered, r.Backlog, r.Pending)
	}
}
