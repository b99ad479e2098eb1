package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The case: a policy for payments' queues under an allowlist of
// orders' alone, in a file a shell could not source.
const outsideAllowlist = `# rebound.env
REBOUND_ORIGIN_QUEUES=^(orders)\.
REBOUND_POLICIES=payments
REBOUND_POLICY_PAYMENTS_QUEUES=^payments\.
REBOUND_POLICY_PAYMENTS_MAX_RETRIES=4
`

func writeEnvFile(t *testing.T, text string) string {
	t.Helper()
	name := filepath.Join(t.TempDir(), "rebound.env")
	if err := os.WriteFile(name, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestConfigCheckEnvFile(t *testing.T) {
	name := writeEnvFile(t, outsideAllowlist)
	// The process's environment is not read with --env-file.
	out, _, err := runCLI(t, []string{"REBOUND_ORIGIN_QUEUES=^payments"}, "config", "check", "--env-file", name)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`origin queues matching ^(orders)\.`, "4 retries", `policy payments: QUEUES ^payments\. matches no queue`, "origin-not-allowed"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	_, _, err = runCLI(t, nil, "config", "check", "--env-file", name, "--strict")
	if err == nil || !isUsageError(err) || !strings.Contains(err.Error(), "--strict: 1 warnings and findings") {
		t.Errorf("--strict with a finding: %v, want exit 2", err)
	}
}

func TestConfigCheckStrictRefusesUnknownVariables(t *testing.T) {
	name := writeEnvFile(t, "REBOUND_MAX_RETRY=4\n")
	if _, stderr, err := runCLI(t, nil, "config", "check", "--env-file", name); err != nil || !strings.Contains(stderr, "did you mean REBOUND_MAX_RETRIES?") {
		t.Errorf("without --strict: %v, stderr %q: want a warning", err, stderr)
	}
	if _, _, err := runCLI(t, nil, "config", "check", "--env-file", name, "--strict"); !isUsageError(err) {
		t.Errorf("with --strict: %v, want exit 2", err)
	}
	clean := writeEnvFile(t, "REBOUND_MAX_RETRIES=4\n")
	if _, _, err := runCLI(t, nil, "config", "check", "--env-file", clean, "--strict"); err != nil {
		t.Errorf("a clean file with --strict: %v", err)
	}
}

func TestConfigCheckRenderedConfigMap(t *testing.T) {
	name := writeEnvFile(t, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: rebound-config\ndata:\n  REBOUND_ORIGIN_QUEUES: ^(orders|payments)\\.\n  REBOUND_MAX_RETRIES: \"3\"\n")
	out, _, err := runCLI(t, nil, "config", "check", "--env-file", name, "--strict")
	if err != nil || !strings.Contains(out, "3 retries") {
		t.Errorf("%v\n%s", err, out)
	}
}

func TestScheduleOfAnOriginTheSidecarRefuses(t *testing.T) {
	env := []string{`REBOUND_ORIGIN_QUEUES=^orders\.`, "REBOUND_POLICIES=payments", `REBOUND_POLICY_PAYMENTS_QUEUES=^payments\.`}
	for _, tc := range []struct{ origin, want string }{
		{"payments.charge", "parked origin-not-allowed"},
		{"rebound.parked", "parked unknown-origin"},
		{"rebound.delay.2000", "parked unknown-origin"},
		{"orders.new", "max retries 10 reached"},
	} {
		out, _, err := runCLI(t, env, "schedule", "--origin", tc.origin)
		if err != nil || !strings.Contains(out, tc.want) {
			t.Errorf("schedule --origin %s: %v\n%s\nwant %q", tc.origin, err, out, tc.want)
		}
	}
	out, stderr, err := runCLI(t, env, "schedule", "--origin", "payments.charge", "--format", "json")
	if err != nil || strings.TrimSpace(out) != "[]" || !strings.Contains(stderr, "origin-not-allowed") {
		t.Errorf("json: %v %q %q", err, out, stderr)
	}
}
