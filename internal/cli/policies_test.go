package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// twoServices is the configuration of a vhost with two services that
// want different retries: payments few over an hour, e-mail many over a
// day, and everything else the default.
var twoServices = []string{
	"REBOUND_POLICIES=payments,e-mail",
	`REBOUND_POLICY_PAYMENTS_QUEUES=^payments\.`, "REBOUND_POLICY_PAYMENTS_MAX_RETRIES=3", "REBOUND_POLICY_PAYMENTS_MAX_DURATION=1h",
	`REBOUND_POLICY_E_MAIL_QUEUES=^mail\.`, "REBOUND_POLICY_E_MAIL_MAX_RETRIES=20", "REBOUND_POLICY_E_MAIL_BACKOFF=constant",
	"REBOUND_POLICY_E_MAIL_MIN_DELAY=5m",
}

func TestConfigCheckListsThePolicies(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := Run(context.Background(), []string{"config", "check"}, append(twoServices, "REBOUND_MAX_RETRY=4"), &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	out := stdout.String()
	lines := strings.Split(out, "\n")
	var rows []string
	for _, l := range lines {
		if l == "findings:" {
			break
		}
		if strings.HasPrefix(l, "  ") && !strings.Contains(l, "NAME") {
			rows = append(rows, strings.Fields(l)[0])
		}
	}
	if strings.Join(rows, " ") != "payments e-mail default" {
		t.Errorf("policies listed %v, want payments, e-mail, default in that order:\n%s", rows, out)
	}
	for _, want := range []string{`^payments\.`, "every other origin", "3 retries", "20 retries over 1h40m", "then parked max-retries"} {
		if !strings.Contains(out, want) {
			t.Errorf("config check output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(stderr.String(), "warning: REBOUND_MAX_RETRY is not a variable rebound reads; did you mean REBOUND_MAX_RETRIES?") {
		t.Errorf("stderr %q: want the misspelt variable named with the nearest one", stderr.String())
	}
}

func TestScheduleOfAPolicy(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // the stop line
	}{
		{nil, "parked after retry 10: max retries 10 reached (REBOUND_MAX_RETRIES)"},
		{[]string{"--policy", "payments"}, "parked after retry 3: max retries 3 reached (REBOUND_POLICY_PAYMENTS_MAX_RETRIES)"},
		{[]string{"--origin", "mail.send"}, "parked after retry 20: max retries 20 reached (REBOUND_POLICY_E_MAIL_MAX_RETRIES)"},
		{[]string{"--origin", "orders"}, "parked after retry 10: max retries 10 reached (REBOUND_MAX_RETRIES)"},
	} {
		out, _, err := runCLI(t, twoServices, "schedule", tc.args...)
		if err != nil || !strings.Contains(out, tc.want) {
			t.Errorf("schedule %v: %v\n%s\nwant the line %q", tc.args, err, out, tc.want)
		}
	}
	for _, args := range [][]string{{"--policy", "refunds"}, {"--policy", "payments", "--origin", "x"}} {
		_, _, err := runCLI(t, twoServices, "schedule", args...)
		if !isUsageError(err) {
			t.Errorf("schedule %v: %v, want a usage error", args, err)
		}
	}
}

func TestSimulateAPolicy(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := Run(context.Background(), []string{"simulate", "burst", "--policy", "payments", "--strategies", "policy", "--format", "json", "--clients", "50"},
		twoServices, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	var def bytes.Buffer
	if err := Run(context.Background(), []string{"simulate", "burst", "--strategies", "policy", "--format", "json", "--clients", "50"},
		twoServices, &def, &stderr); err != nil {
		t.Fatal(err)
	}
	if stdout.String() == def.String() {
		t.Error("simulating the payments policy gave what the default policy gives")
	}
	if err := Run(context.Background(), []string{"simulate", "outage", "--policy", "nope"}, twoServices, &stdout, &stderr); !isUsageError(err) {
		t.Errorf("simulate outage --policy nope: %v, want a usage error", err)
	}
}

// TestTopologyPrintFollowsTheConfiguration: the dead-letter policy for
// application queues covers the queues rebound may send messages back
// to: REBOUND_ORIGIN_QUEUES, else the named policies' queues.
func TestTopologyPrintFollowsTheConfiguration(t *testing.T) {
	for _, tc := range []struct {
		name    string
		environ []string
		pattern string // "" for no dead-letter policy
	}{
		{"the allowlist", append([]string{`REBOUND_ORIGIN_QUEUES=^(payments|mail)\.`}, twoServices...), `^(payments|mail)\.`},
		{"the policies' queues", twoServices, `(?:^payments\.)|(?:^mail\.)`},
		{"neither", nil, ""},
	} {
		var stdout, stderr bytes.Buffer
		if err := Run(context.Background(), []string{"topology", "print"}, tc.environ, &stdout, &stderr); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var doc struct {
			Policies []struct{ Name, Pattern string } `json:"policies"`
		}
		if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := ""
		for _, p := range doc.Policies {
			if p.Name == deadLetterPolicyName {
				got = p.Pattern
			}
		}
		if got != tc.pattern {
			t.Errorf("%s: dead-letter policy pattern %q, want %q", tc.name, got, tc.pattern)
		}
		if tc.pattern == "" && !strings.Contains(stderr.String(), "no dead-letter policy for application queues") {
			t.Errorf("%s: stderr %q does not say there is no dead-letter policy", tc.name, stderr.String())
		}
	}
}
