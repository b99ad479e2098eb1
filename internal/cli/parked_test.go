package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestParseDays(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1d", 24 * time.Hour, true},
		{"2d12h", 60 * time.Hour, true},
		{"1.5d", 36 * time.Hour, true},
		{"0d", 0, true},
		{"36h", 36 * time.Hour, true},
		{"90m", 90 * time.Minute, true},
		{"1d30m", 24*time.Hour + 30*time.Minute, true},
		{"-1d", -24 * time.Hour, true}, // refused by checkFilter, with the flag's name
		{"d", 0, false},
		{"1w", 0, false},
		{"1d1d", 0, false},
		{"1e3d", 0, false},
		{"2d-1h", 0, false},
		{"", 0, false},
	} {
		got, err := parseDays(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseDays(%q) = %v, %v; want %v (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestParkedErrorNamesTheCommandOnce: a failed connection reads
// "rebound parked list: connect: ...", the command named once.
func TestParkedErrorNamesTheCommandOnce(t *testing.T) {
	environ := []string{"REBOUND_AMQP_URL=amqp://guest:guest@127.0.0.1:1/"}
	for _, cmd := range []string{"list", "replay", "purge --yes", "show some-id"} {
		args := append([]string{"parked"}, strings.Fields(cmd)...)
		var stderr bytes.Buffer
		err := Run(t.Context(), args, environ, &bytes.Buffer{}, &bytes.Buffer{})
		if code := ExitCode(err, &stderr); code != 1 {
			t.Errorf("%v: exit %d, want 1 (%v)", args, code, err)
		}
		name := "parked " + strings.Fields(cmd)[0]
		if got := stderr.String(); !strings.HasPrefix(got, "rebound "+name+": connect: ") || strings.Count(got, name) != 1 {
			t.Errorf("%v: printed %q, want %q once, then connect:", args, got, "rebound "+name)
		}
	}
}

func TestParkedHelpWritesFlagsWithTwoDashes(t *testing.T) {
	var stdout bytes.Buffer
	if err := Run(t.Context(), []string{"parked", "list", "-h"}, nil, &stdout, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\n  --older-than duration\n", "2d12h", "\n  --reason reason\n", "delivery-limit"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, stdout.String())
		}
	}
	if strings.Contains(stdout.String(), "\n  -older-than") {
		t.Errorf("help writes a flag with one dash:\n%s", stdout.String())
	}
}

// TestParkedGroupFlagsAreChecked: what the group commands refuse before
// they connect, as usage errors (exit 2).
func TestParkedGroupFlagsAreChecked(t *testing.T) {
	environ := []string{"REBOUND_AMQP_URL=amqp://guest:guest@127.0.0.1:1/"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"parked", "groups", "--group-by", "colour"}, `--group-by "colour": want one of group, origin, reason, policy, error`},
		{[]string{"parked", "list", "--group-by", "colour"}, `--group-by "colour"`},
		{[]string{"parked", "replay", "--group", "not-a-group"}, `--group "not-a-group": want a group id`},
		{[]string{"parked", "purge", "--yes", "--group", "0123456789AB"}, "want a group id"},
		{[]string{"parked", "show"}, "missing message ID or --group"},
		{[]string{"parked", "show", "m-1", "--group", "0123456789ab"}, "not both"},
		{[]string{"parked", "show", "m-1", "--limit", "3"}, "--limit goes with --group"},
		{[]string{"parked", "expire"}, "add --yes"},
	} {
		var stderr bytes.Buffer
		err := Run(t.Context(), tc.args, environ, &bytes.Buffer{}, &bytes.Buffer{})
		if code := ExitCode(err, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
