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
	clean := writeEnvFile(t, "REBOUND_ORIGIN_QUEUES=^orders\\.\nREBOUND_MAX_RETRIES=4\n")
	if _, _, err := runCLI(t, nil, "config", "check", "--env-file", clean, "--strict"); err != nil {
		t.Errorf("a clean file with --strict: %v", err)
	}
}

// TestConfigCheckStrictRefusesWhatItCannotMean: --strict refuses each
// configuration the sidecar starts with but whose author surely meant
// something else, naming it, and shows warnings beside errors.
func TestConfigCheckStrictRefusesWhatItCannotMean(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"an empty file: no allowlist", "", "REBOUND_ORIGIN_QUEUES is unset"},
		{"an allowlist of rebound's own queues", "REBOUND_ORIGIN_QUEUES=^rebound\\.\n", "matches rebound's own queues (rebound.inbox, rebound.parked, rebound.delay."},
		{"the inbox inside the allowlist", "REBOUND_ORIGIN_QUEUES=^orders\\.\nREBOUND_INBOX_QUEUE=orders.retry\n", "matches rebound's own queues (orders.retry)"},
		{"MULTIPLIER with a linear backoff", "REBOUND_ORIGIN_QUEUES=^orders\\.\nREBOUND_BACKOFF=linear\nREBOUND_MAX_RETRIES=4\nREBOUND_MULTIPLIER=3\n",
			"REBOUND_MULTIPLIER is set but only BACKOFF=exponential reads it; BACKOFF=linear does not read it"},
		{"JITTER_MAX with full jitter, in a named policy", "REBOUND_ORIGIN_QUEUES=^orders\\.\nREBOUND_POLICIES=bulk\nREBOUND_POLICY_BULK_QUEUES=^orders\\.bulk\nREBOUND_POLICY_BULK_JITTER_MAX=5s\n",
			"REBOUND_POLICY_BULK_JITTER_MAX is set but only JITTER=additive reads it; JITTER=full does not read it"},
		{"JITTER_FACTOR with equal jitter", "REBOUND_ORIGIN_QUEUES=^orders\\.\nREBOUND_JITTER=equal\nREBOUND_JITTER_FACTOR=0.2\n", "REBOUND_JITTER_FACTOR is set but"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := writeEnvFile(t, tc.file)
			stdout, stderr, err := runCLI(t, nil, "config", "check", "--env-file", name, "--strict")
			if !isUsageError(err) {
				t.Errorf("--strict: %v, want exit 2", err)
			}
			if !strings.Contains(stdout+stderr, tc.want) {
				t.Errorf("report lacks %q:\n%s%s", tc.want, stdout, stderr)
			}
		})
	}
	t.Run("warnings beside errors", func(t *testing.T) {
		name := writeEnvFile(t, "REBOUND_MAX_RETRY=4\nREBOUND_BACKOFF=sideways\n")
		_, stderr, err := runCLI(t, nil, "config", "check", "--env-file", name)
		if !isUsageError(err) || !strings.Contains(err.Error(), "REBOUND_BACKOFF") || !strings.Contains(stderr, "did you mean REBOUND_MAX_RETRIES?") {
			t.Errorf("an invalid file with an unread variable: %v, stderr %q; want exit 2 naming REBOUND_BACKOFF and the warning", err, stderr)
		}
	})
	t.Run("a default MULTIPLIER an exponential named policy inherits", func(t *testing.T) {
		name := writeEnvFile(t, "REBOUND_ORIGIN_QUEUES=^orders\\.\nREBOUND_BACKOFF=linear\nREBOUND_MAX_RETRIES=4\nREBOUND_MULTIPLIER=3\nREBOUND_POLICIES=bulk\nREBOUND_POLICY_BULK_QUEUES=^orders\\.bulk\nREBOUND_POLICY_BULK_BACKOFF=exponential\n")
		if stdout, stderr, err := runCLI(t, nil, "config", "check", "--env-file", name, "--strict"); err != nil {
			t.Errorf("--strict: %v\n%s%s", err, stdout, stderr)
		}
	})
	t.Run("anchored to the application's queues, every setting read", func(t *testing.T) {
		name := writeEnvFile(t, "REBOUND_ORIGIN_QUEUES=^orders\\.\nREBOUND_BACKOFF=exponential\nREBOUND_MULTIPLIER=3\nREBOUND_JITTER=additive\nREBOUND_JITTER_MAX=2s\n")
		if stdout, stderr, err := runCLI(t, nil, "config", "check", "--env-file", name, "--strict"); err != nil {
			t.Errorf("--strict: %v\n%s%s", err, stdout, stderr)
		}
	})
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

// TestDidYouMean: a misspelt command or flag is answered with the one
// meant.
func TestDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"parkd"}, `unknown command "parkd" (did you mean parked?)`},
		{[]string{"parked", "lsit"}, `unknown command "lsit" (did you mean list?)`},
		{[]string{"schedule", "--polcy", "x"}, "--polcy (did you mean --policy?)"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"` + "\n"},
	} {
		_, _, err := runCLI(t, nil, tc.args[0], tc.args[1:]...)
		if !isUsageError(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("rebound %v: %v, want exit 2 saying %q", tc.args, err, tc.want)
		}
	}
}
