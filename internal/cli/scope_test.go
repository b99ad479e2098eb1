package cli

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/brokertest"
)

// TestCanaryWaitComesFromThePolicy: the case, a 5 min watch of
// canaries whose policy parks them after 23 min, could not see one fail.
func TestCanaryWaitComesFromThePolicy(t *testing.T) {
	cfg, err := config.Load([]string{
		`REBOUND_ORIGIN_QUEUES=^(orders|payments|email)\.`,
		"REBOUND_MIN_DELAY=2s", "REBOUND_MAX_DELAY=5m", "REBOUND_IMMEDIATE_RETRIES=1", "REBOUND_MAX_RETRIES=12", "REBOUND_MAX_DURATION=6h",
		"REBOUND_POLICIES=payments,email",
		`REBOUND_POLICY_PAYMENTS_QUEUES=^payments\.`, "REBOUND_POLICY_PAYMENTS_MAX_RETRIES=4",
		`REBOUND_POLICY_EMAIL_QUEUES=^email\.`, "REBOUND_POLICY_EMAIL_BACKOFF=constant", "REBOUND_POLICY_EMAIL_MIN_DELAY=1h", "REBOUND_POLICY_EMAIL_MAX_DELAY=1h",
		"REBOUND_POLICY_EMAIL_MAX_RETRIES=0", "REBOUND_POLICY_EMAIL_MAX_DURATION=24h",
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		origin, policy string
		want           time.Duration
	}{
		{`^payments\.`, "payments", 14*time.Second + config.CanaryMargin},
		{`^orders\.`, "default", 23*time.Minute + 36*time.Second + config.CanaryMargin},
		{"", "email", 24*time.Hour + config.CanaryMargin},
		{`^email\.`, "email", 24*time.Hour + config.CanaryMargin},
	} {
		var origins *regexp.Regexp
		if tc.origin != "" {
			origins = regexp.MustCompile(tc.origin)
		}
		got, p := config.CanaryWait(cfg.PolicySet(), origins)
		if got != tc.want || p.Name != tc.policy {
			t.Errorf("--origin %q: %s from %s, want %s from %s", tc.origin, got, p.Name, tc.want, tc.policy)
		}
	}
}

// TestReplaySkipsNonRetryable: a replay scoped by --origin (a regexp, as
// in delayed flush) leaves non-retryable messages parked unless asked.
func TestReplaySkipsNonRetryable(t *testing.T) {
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	parked := d.Vars["REBOUND_PARKING_QUEUE"]
	d.Declare(parked, nil)
	other := d.Prefix + "other"
	d.Declare(other, nil)
	msg := func(id, origin, reason string) amqp.Publishing {
		return amqp.Publishing{MessageId: id, Body: []byte(id), Headers: amqp.Table{
			"x-retry-origin-queue": origin, "x-retry-parked-reason": reason, "x-retry-parked-at": time.Now().UnixMilli(),
		}}
	}
	d.Publish(parked, msg("a", d.App, "max-retries"), msg("b", d.App, "non-retryable"), msg("c", other, "max-retries"))
	run := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if err := Run(t.Context(), args, d.Environ(), &stdout, &stderr); err != nil {
			t.Fatalf("%v: %v\n%s%s", args, err, stdout.String(), stderr.String())
		}
		return stdout.String()
	}
	out := run("parked", "replay", "--origin", "^"+regexp.QuoteMeta(d.App)+"$")
	if !strings.Contains(out, "replayed 1 of 1 matching") {
		t.Errorf("replay --origin: %s", out)
	}
	d.WaitQueueLen(d.App, 1, 10*time.Second)
	d.WaitQueueLen(parked, 2, 10*time.Second)
	out = run("parked", "replay", "--origin", "^"+regexp.QuoteMeta(d.App)+"$", "--include-non-retryable")
	if !strings.Contains(out, "replayed 1 of 1 matching") {
		t.Errorf("replay --include-non-retryable: %s", out)
	}
	d.WaitQueueLen(d.App, 2, 10*time.Second)
	d.WaitQueueLen(parked, 1, 10*time.Second)
	if got := d.QueueLen(other); got != 0 {
		t.Errorf("%d messages of another origin replayed", got)
	}
}
