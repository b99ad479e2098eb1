package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

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
		err := run(context.Background(), args, environ, &bytes.Buffer{}, &stderr)
		code := exitCode(err, &stderr)
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
	if err := run(context.Background(), []string{"config", "check"}, nil, &stdout, &stderr); err != nil {
		t.Fatalf("defaults rejected: %v", err)
	}
	if !strings.Contains(stdout.String(), "configuration OK") {
		t.Errorf("output %q lacks the confirmation", stdout.String())
	}
}

func TestUnknownCommandIsAUsageError(t *testing.T) {
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"frobnicate"}, nil, &bytes.Buffer{}, &stderr)
	if code := exitCode(err, &stderr); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
}
