package cli

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// runCLI runs "rebound command args..." in-process, the way main would.
func runCLI(t *testing.T, environ []string, command string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = Run(t.Context(), append([]string{command}, args...), environ, &out, &errOut)
	return out.String(), errOut.String(), err
}

// runCLILines runs a command that must succeed, as runCLI does, and
// returns its output whole and as lines.
func runCLILines(t *testing.T, environ []string, command string, args ...string) (out string, lines []string) {
	t.Helper()
	out, _, err := runCLI(t, environ, command, args...)
	if err != nil {
		t.Fatalf("%s: %v", command, err)
	}
	return out, strings.Split(strings.TrimSpace(out), "\n")
}

func TestConfigErrorsExitTwoBeforeConnecting(t *testing.T) {
	// The URL points nowhere: a run that got past validation would fail to
	// connect instead of reporting the configuration.
	environ := []string{
		"REBOUND_AMQP_URL=amqp://user:s3cret@127.0.0.1:1/",
		"REBOUND_BACKOFF=fibonacci",
		"REBOUND_MIN_DELAY=2h",
		"REBOUND_MAX_DELAY=1h",
		"REBOUND_PREFETCH=lots",
	}
	for _, args := range [][]string{{"run"}, {"config", "check"}, nil} {
		var stderr bytes.Buffer
		err := Run(context.Background(), args, environ, &bytes.Buffer{}, &stderr)
		code := ExitCode(err, &stderr)
		if code != 2 {
			t.Fatalf("%v: exit %d, want 2 (err %v)", args, code, err)
		}
		out := stderr.String()
		for _, want := range []string{
			`REBOUND_BACKOFF="fibonacci"`, "constant, linear, arithmetic, geometric, exponential",
			`REBOUND_MIN_DELAY="2h0m0s"`, `REBOUND_PREFETCH="lots"`,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: error output lacks %q:\n%s", args, want, out)
			}
		}
		if strings.Contains(out, "s3cret") {
			t.Errorf("%v: the password appears in the error output:\n%s", args, out)
		}
	}
}

func TestConfigCheckAcceptsDefaults(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := Run(context.Background(), []string{"config", "check"}, nil, &stdout, &stderr); err != nil {
		t.Fatalf("defaults rejected: %v", err)
	}
	for _, want := range []string{"configuration OK", "origin queues any (REBOUND_ORIGIN_QUEUES unset)"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output %q lacks %q", stdout.String(), want)
		}
	}
	stdout.Reset()
	if err := Run(context.Background(), []string{"config", "check"}, []string{`REBOUND_ORIGIN_QUEUES=^orders\.`}, &stdout, &stderr); err != nil ||
		!strings.Contains(stdout.String(), `origin queues matching ^orders\.`) {
		t.Errorf("config check with an allowlist: %v, %q", err, stdout.String())
	}
}

func TestUnknownCommandIsAUsageError(t *testing.T) {
	var stderr bytes.Buffer
	err := Run(context.Background(), []string{"frobnicate"}, nil, &bytes.Buffer{}, &stderr)
	if code := ExitCode(err, &stderr); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
}

// Every command answers -h the same way: its usage on stdout, nothing on
// stderr, exit 0, even when the configuration would not load.
func TestEveryCommandHelpGoesToStdout(t *testing.T) {
	broken := []string{"REBOUND_JITTER=bogus"}
	for _, c := range commands() {
		args := append(strings.Fields(c.name), "-h")
		var stdout, stderr bytes.Buffer
		err := Run(t.Context(), args, broken, &stdout, &stderr)
		if err != nil || stderr.Len() > 0 {
			t.Errorf("%v: err %v, stderr %q; want help on stdout and nothing else", args, err, stderr.String())
		}
		if want := "usage: rebound " + c.name; !strings.HasPrefix(stdout.String(), want) {
			t.Errorf("%v: stdout starts %q, want %q", args, firstLine(stdout.String()), want)
		}
	}
	for _, args := range [][]string{{"-h"}, {"help"}, {"parked", "-h"}, {"topology", "--help"}, {"config", "-h"}} {
		var stdout, stderr bytes.Buffer
		if err := Run(t.Context(), args, nil, &stdout, &stderr); err != nil || stdout.Len() == 0 || stderr.Len() > 0 {
			t.Errorf("%v: err %v, %d bytes of help, stderr %q", args, err, stdout.Len(), stderr.String())
		}
	}
}

// A command line rebound does not understand exits 2, and the message
// names the command it came from, once.
func TestUsageErrorsExitTwoNamingTheCommand(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		prefix string
	}{
		{[]string{"frobnicate"}, "rebound unknown command"},
		{[]string{"parked"}, "rebound parked: missing command"},
		{[]string{"parked", "frobnicate"}, "rebound parked: unknown command"},
		{[]string{"parked", "list", "--format", "xml"}, "rebound parked list: --format"},
		{[]string{"parked", "list", "--older-than", "soon"}, "rebound parked list: invalid value"},
		{[]string{"parked", "list", "--limit", "-1"}, "rebound parked list: --limit"},
		{[]string{"parked", "list", "--reason", "bogus"}, `rebound parked list: --reason "bogus": want one of max-retries, max-duration, non-retryable, unknown-origin, origin-not-allowed, origin-refused, delivery-limit`},
		{[]string{"parked", "replay", "--older-than", "1w"}, `rebound parked replay: invalid value "1w" for flag --older-than: want a duration in Go's units or with d for days`},
		{[]string{"parked", "purge", "--older-than", "-1d", "--yes"}, "rebound parked purge: --older-than"},
		{[]string{"parked", "show"}, "rebound parked show: missing message ID"},
		{[]string{"parked", "show", "a", "b"}, "rebound parked show: unexpected argument"},
		{[]string{"parked", "replay", "extra"}, "rebound parked replay: unexpected argument"},
		{[]string{"parked", "purge"}, "rebound parked purge: purge deletes messages for good"},
		{[]string{"topology"}, "rebound topology: missing command"},
		{[]string{"topology", "print", "extra"}, "rebound topology print: unexpected argument"},
		{[]string{"topology", "declare", "--nope"}, "rebound topology declare: flag provided but not defined"},
		{[]string{"schedule", "-format", "yaml"}, "rebound schedule: --format"},
		{[]string{"run", "extra"}, "rebound run: unexpected argument"},
		{[]string{"config"}, "rebound config: missing command"},
		{[]string{"config", "check", "now"}, "rebound config check: unexpected argument"},
	} {
		var stderr bytes.Buffer
		err := Run(t.Context(), tc.args, nil, io.Discard, io.Discard)
		if code := ExitCode(err, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%v)", tc.args, code, err)
		}
		if !strings.HasPrefix(stderr.String(), tc.prefix) {
			t.Errorf("%v: printed %q, want it to start %q", tc.args, firstLine(stderr.String()), tc.prefix)
		}
	}
}

// Bad configuration exits 2 before anything connects, for every command
// that reads it.
func TestConfigErrorsBeforeConnectingInEveryCommand(t *testing.T) {
	environ := []string{"REBOUND_AMQP_URL=http://user:s3cret@127.0.0.1:1/"}
	for _, args := range [][]string{
		{"run"}, {"schedule"}, {"config", "check"}, {"topology", "print"}, {"topology", "declare"},
		{"parked", "list"}, {"parked", "show", "x"}, {"parked", "replay"}, {"parked", "purge", "--yes"},
	} {
		var stderr bytes.Buffer
		err := Run(t.Context(), args, environ, io.Discard, io.Discard)
		if code := ExitCode(err, &stderr); code != 2 || !strings.Contains(stderr.String(), "REBOUND_AMQP_URL") {
			t.Errorf("%v: exit %d, %q; want 2 naming REBOUND_AMQP_URL", args, code, stderr.String())
		}
		if strings.Contains(stderr.String(), "s3cret") {
			t.Errorf("%v: the password appears: %q", args, stderr.String())
		}
	}
}

func TestTLSFileProblemsAreConfigErrors(t *testing.T) {
	for _, args := range [][]string{{"run"}, {"config", "check"}} {
		var stderr strings.Builder
		err := Run(t.Context(), args, []string{
			"REBOUND_AMQP_URL=amqps://localhost:1/", "REBOUND_TLS_CA_FILE=/nonexistent/ca.pem",
		}, io.Discard, io.Discard)
		if code := ExitCode(err, &stderr); code != 2 || !strings.Contains(stderr.String(), "REBOUND_TLS_CA_FILE") {
			t.Errorf("%v: exit %d, output %q; want 2 naming REBOUND_TLS_CA_FILE", args, code, stderr.String())
		}
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
