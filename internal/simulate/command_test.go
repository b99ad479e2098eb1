package simulate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/rebound-mq/rebound/config"
)

// command sets up a simulate command on a flag set of its own, parses
// args, and plans it with environ's default policy, as rebound simulate
// does; it returns Plan's error.
func command(t *testing.T, newCommand func(*flag.FlagSet) *Command, environ []string, args ...string) (cmd *Command, err error) {
	t.Helper()
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	cmd = newCommand(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	cfg, err := config.Load(environ)
	if err != nil {
		t.Fatalf("config %q: %v", environ, err)
	}
	return cmd, cmd.Plan(cfg.PolicySet().Default(), environ)
}

// play runs a command that must be accepted and returns what it prints.
func play(t *testing.T, newCommand func(*flag.FlagSet) *Command, environ []string, format, svg string, args ...string) string {
	t.Helper()
	cmd, err := command(t, newCommand, environ, args...)
	if err != nil {
		t.Fatalf("plan %q: %v", args, err)
	}
	var out bytes.Buffer
	if err := cmd.Run(t.Context(), format, svg, &out); err != nil {
		t.Fatalf("run %q: %v", args, err)
	}
	return out.String()
}

// TestBurstCommandPrints: the JSON holds the model, the seed, the flags'
// values and one result per strategy in the order given;
// the table a row per strategy under its header and a note; --svg writes
// the plot.
func TestBurstCommandPrints(t *testing.T) {
	args := []string{"-strategies", "EB,policy", "-clients", "200", "-ticks", "1500", "-send-ticks", "500", "-seed", "3"}
	svg := filepath.Join(t.TempDir(), "burst.svg")
	var doc struct {
		Model      string            `json:"model"`
		Seed       uint64            `json:"seed"`
		Parameters map[string]string `json:"parameters"`
		Results    []burstSummary    `json:"results"`
	}
	if err := json.Unmarshal([]byte(play(t, burstCommand, nil, "json", svg, args...)), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Model != "burst" || doc.Seed != 3 || doc.Parameters["clients"] != "200" {
		t.Errorf("model %q, seed %d, parameters %v: want burst, 3 and clients 200", doc.Model, doc.Seed, doc.Parameters)
	}
	if len(doc.Results) != 2 || doc.Results[0].Strategy != "EB" || doc.Results[1].Strategy != "policy" || doc.Results[0].Clients != 200 {
		t.Errorf("results %+v: want EB then policy, 200 clients", doc.Results)
	}
	if b, err := os.ReadFile(svg); err != nil || !bytes.HasPrefix(b, []byte("<svg")) {
		t.Errorf("plot: %v, starts %.20q", err, b)
	}
	lines := strings.Split(strings.TrimSpace(play(t, burstCommand, nil, "table", "", args...)), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "strategy") || !strings.HasPrefix(lines[1], "EB ") ||
		!strings.HasPrefix(lines[2], "policy ") || !strings.Contains(lines[3], "1500 ticks (seed 3)") {
		t.Errorf("table:\n%s", strings.Join(lines, "\n"))
	}
}

// TestOutageCommandPrints: the built-in strategies and each --compare
// play in turn; a retry rate budget caps the policy and the comparison,
// not fixed and immediate (without --cap-all); the table says the
// scenario under its rows.
func TestOutageCommandPrints(t *testing.T) {
	environ := []string{"REBOUND_RETRY_RATE=50"}
	args := []string{"-horizon", "2m", "-compare", "slow: REBOUND_MIN_DELAY=5s"}
	var doc struct {
		Results []outageSummary `json:"results"`
	}
	if err := json.Unmarshal([]byte(play(t, outageCommand, environ, "json", "", args...)), &doc); err != nil {
		t.Fatal(err)
	}
	var names []string
	rates := map[string]float64{}
	for _, r := range doc.Results {
		names = append(names, r.Strategy)
		rates[r.Strategy] = r.RetryRate
	}
	if !slices.Equal(names, []string{"policy", "fixed", "immediate", "slow"}) {
		t.Fatalf("strategies %q: want policy, fixed, immediate, slow", names)
	}
	if rates["policy"] != 50 || rates["slow"] != 50 || rates["fixed"] != 0 || rates["immediate"] != 0 {
		t.Errorf("retry rates %v: want 50 for policy and slow, none for fixed and immediate", rates)
	}
	capped := play(t, outageCommand, environ, "json", "", append(args, "-cap-all", "-strategies", "fixed")...)
	if !strings.Contains(capped, `"retry_rate": 50`) || strings.Contains(capped, `"retry_rate": 0`) {
		t.Errorf("--cap-all: %s\nwant fixed capped at 50 too", capped)
	}
	table := play(t, outageCommand, environ, "table", filepath.Join(t.TempDir(), "outage.svg"), "-horizon", "2m", "-strategies", "policy")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "strategy") || !strings.HasPrefix(lines[1], "policy ") ||
		!strings.Contains(lines[2], "dependency stopped from 30s for 1m") {
		t.Errorf("table:\n%s", table)
	}
}

// TestCommandRefusals: what Plan refuses, the flags' values (checked
// first) and the strategies; a --compare's configuration error stays
// config's; New refuses a model it does not know.
func TestCommandRefusals(t *testing.T) {
	tests := []struct {
		newCommand func(*flag.FlagSet) *Command
		args       []string
		want       string
	}{
		{burstCommand, []string{"-clients", "0"}, "clients 0"},
		{burstCommand, []string{"-strategies", "EB,XB"}, `--strategies: unknown strategy "XB"`},
		{burstCommand, []string{"-strategies", "EB,EB"}, "listed twice"},
		{outageCommand, []string{"-horizon", "1m"}, "horizon 1m0s"},
		{outageCommand, []string{"-interval", "0s"}, "--interval 0s"},
		{outageCommand, []string{"-strategies", ""}, "empty list"},
		{outageCommand, []string{"-strategies", "backoff"}, `unknown strategy "backoff"`},
		{outageCommand, []string{"-compare", "BACKOFF=constant"}, "want REBOUND_NAME=value"},
		{outageCommand, []string{"-compare", "policy: REBOUND_MIN_DELAY=2s"}, `the name "policy" is taken`},
		{outageCommand, []string{"-compare", "REBOUND_MAX_RETRY=5"}, "did you mean REBOUND_MAX_RETRIES?"},
		{outageCommand, []string{"-compare", "REBOUND_JITTER=loud"}, `REBOUND_JITTER="loud"`},
	}
	for _, tt := range tests {
		_, err := command(t, tt.newCommand, nil, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v, want an error saying %q", tt.args, err, tt.want)
		}
	}
	_, err := command(t, outageCommand, nil, "-compare", "REBOUND_JITTER=loud")
	var cfgErr *config.Error
	if !errors.As(err, &cfgErr) {
		t.Errorf("a --compare's bad value: %T, want a *config.Error", err)
	}
	for _, model := range []string{"burst", "outage"} {
		fs := flag.NewFlagSet("simulate "+model, flag.ContinueOnError)
		if cmd, err := New(model, fs); err != nil || cmd.Usage == "" || fs.Lookup("strategies") == nil {
			t.Errorf("New(%s) = %v, %v; want the model's command and flags", model, cmd, err)
		}
	}
	if _, err := New("storm", flag.NewFlagSet("simulate storm", flag.ContinueOnError)); err == nil || !strings.Contains(err.Error(), "burst or outage") {
		t.Errorf("New(storm) = %v, want the models named", err)
	}
}

// TestRunReportsAPlotItCannotWrite: the plot's error is Run's.
func TestRunReportsAPlotItCannotWrite(t *testing.T) {
	cmd, err := command(t, burstCommand, nil, "-strategies", "EB", "-clients", "50")
	if err != nil {
		t.Fatal(err)
	}
	err = cmd.Run(t.Context(), "table", filepath.Join(t.TempDir(), "missing", "x.svg"), &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "write plot") {
		t.Errorf("Run = %v, want the plot's error", err)
	}
}

func TestParseCompare(t *testing.T) {
	tests := []struct {
		in          string
		name        string
		assignments []string
		err         string
	}{
		{"REBOUND_BACKOFF=constant REBOUND_MIN_DELAY=5s", "BACKOFF=constant MIN_DELAY=5s",
			[]string{"REBOUND_BACKOFF=constant", "REBOUND_MIN_DELAY=5s"}, ""},
		{"  slow:REBOUND_MIN_DELAY=5s\t", "slow", []string{"REBOUND_MIN_DELAY=5s"}, ""},
		{"google-http: REBOUND_MIN_DELAY=500ms REBOUND_MULTIPLIER=1.5", "google-http",
			[]string{"REBOUND_MIN_DELAY=500ms", "REBOUND_MULTIPLIER=1.5"}, ""},
		{"REBOUND_ORIGIN_QUEUES=a:b", "ORIGIN_QUEUES=a:b", []string{"REBOUND_ORIGIN_QUEUES=a:b"}, ""}, // a colon in a value is not a name
		{"REBOUND_MAX_DELAY=", "MAX_DELAY=", []string{"REBOUND_MAX_DELAY="}, ""},                      // config judges the value
		{"", "", nil, "no assignment"},
		{"slow:", "", nil, "no assignment"},
		{"PATH=/bin", "", nil, `"PATH=/bin": want REBOUND_NAME=value`},
		{"REBOUND_min_delay=1s", "", nil, "want REBOUND_NAME=value"},
		{"REBOUND_=1", "", nil, "want REBOUND_NAME=value"},
		{"REBOUND_MIN_DELAY 1s", "", nil, "want REBOUND_NAME=value"},
		{"REBOUND_MIN_DELAY=1s REBOUND_MIN_DELAY=2s", "", nil, "REBOUND_MIN_DELAY is set twice"},
		{"-x: REBOUND_MIN_DELAY=1s", "", nil, `name "-x"`},
		{"a b: REBOUND_MIN_DELAY=1s", "", nil, "want REBOUND_NAME=value"},
	}
	for _, tt := range tests {
		name, assignments, err := parseCompare(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("parseCompare(%q) error %v, want %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || name != tt.name || !slices.Equal(assignments, tt.assignments) {
			t.Errorf("parseCompare(%q) = %q, %q, %v; want %q, %q", tt.in, name, assignments, err, tt.name, tt.assignments)
		}
	}
}

func TestOverlay(t *testing.T) {
	got := overlay([]string{"HOME=/root", "REBOUND_MIN_DELAY=1s", "REBOUND_JITTER=none"}, []string{"REBOUND_MIN_DELAY=5s"})
	want := []string{"HOME=/root", "REBOUND_JITTER=none", "REBOUND_MIN_DELAY=5s"}
	if !slices.Equal(got, want) {
		t.Errorf("overlay = %q, want %q", got, want)
	}
}

// FuzzSimulateCompare: parseCompare never panics, and what it accepts is
// well-formed: a name, REBOUND_ assignments without whitespace, each
// variable once, and the same result when written back out with its name.
func FuzzSimulateCompare(f *testing.F) {
	for _, s := range []string{
		"REBOUND_BACKOFF=constant REBOUND_MIN_DELAY=5s", "slow: REBOUND_MIN_DELAY=5s", "a:b:c",
		"REBOUND_X=1 REBOUND_X=2", ": REBOUND_A=1", "REBOUND_A==", "x:REBOUND_A=:", "\u00a0REBOUND_A=1\u2003",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		name, assignments, err := parseCompare(s)
		if err != nil {
			return
		}
		if name == "" || len(assignments) == 0 {
			t.Fatalf("parseCompare(%q) accepted with name %q and %d assignments", s, name, len(assignments))
		}
		seen := map[string]bool{}
		for _, a := range assignments {
			v, _, ok := strings.Cut(a, "=")
			if !ok || !strings.HasPrefix(v, "REBOUND_") || seen[v] || strings.ContainsFunc(a, unicode.IsSpace) {
				t.Fatalf("parseCompare(%q) accepted assignment %q", s, a)
			}
			seen[v] = true
		}
		again, same, err := parseCompare(name + ": " + strings.Join(assignments, " "))
		if isCompareName(name) && (err != nil || again != name || !slices.Equal(same, assignments)) {
			t.Fatalf("parseCompare(%q) = %q %q, but written back gives %q %q %v", s, name, assignments, again, same, err)
		}
	})
}

// TestTableCells: how the tables show what may be missing.
func TestTableCells(t *testing.T) {
	seven, half := 7, 0.5
	for _, tt := range []struct{ got, want string }{
		{rateText(0), "-"}, {rateText(40), "40/s"}, {rateText(2.5), "2.5/s"},
		{optInt(nil), "-"}, {optInt(&seven), "7"},
		{optSeconds(nil), "-"}, {optSeconds(&half), "0.5s"},
		{parkedText(nil), "0"}, {parkedText(map[string]int{"max-retries": 2, "max-duration": 1}), "max-duration 1, max-retries 2"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

// TestRunStopsWhenCancelled: a run cancelled before it plays prints
// nothing and says why.
func TestRunStopsWhenCancelled(t *testing.T) {
	cmd, err := command(t, outageCommand, nil, "-horizon", "2m", "-strategies", "policy")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var out bytes.Buffer
	if err := cmd.Run(ctx, "table", "", &out); !errors.Is(err, context.Canceled) || out.Len() > 0 {
		t.Errorf("Run = %v, printed %q: want context.Canceled and nothing", err, out.String())
	}
}

// TestRunReportsOutputItCannotWrite: a table or JSON that cannot be
// written is Run's error, for both models.
func TestRunReportsOutputItCannotWrite(t *testing.T) {
	for _, tt := range []struct {
		newCommand func(*flag.FlagSet) *Command
		args       []string
	}{
		{burstCommand, []string{"-strategies", "EB", "-clients", "50"}},
		{outageCommand, []string{"-strategies", "policy", "-horizon", "2m"}},
	} {
		for _, format := range []string{"table", "json"} {
			cmd, err := command(t, tt.newCommand, nil, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Run(t.Context(), format, "", failingWriter{}); err == nil || !strings.Contains(err.Error(), "disk full") {
				t.Errorf("%q as %s: Run = %v, want the writer's error", tt.args, format, err)
			}
		}
		cmd, err := command(t, tt.newCommand, nil, tt.args...)
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Run(t.Context(), "table", "", noteRefusingWriter{}); err == nil || !strings.Contains(err.Error(), "write table") {
			t.Errorf("%q: Run = %v with the note under the table refused, want the writer's error", tt.args, err)
		}
	}
}

// noteRefusingWriter takes a table's rows and refuses the note under
// them, which names the seed.
type noteRefusingWriter struct{}

func (noteRefusingWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("(seed ")) {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}
