package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/parking"
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

// TestPrintMessage: `parked show` prints the properties set, the headers
// in name order and a text body as it is; a binary one in base64 with a
// hex dump of its start.
func TestPrintMessage(t *testing.T) {
	parkedAt := time.Date(2026, 11, 27, 9, 0, 0, 0, time.UTC)
	m := parking.Message{
		Delivery: amqp.Delivery{
			MessageId: "m-1", ContentType: "application/json", CorrelationId: "c-1", AppId: "orders-api",
			Headers: amqp.Table{"x-retry-count": int64(3), "tenant": "eu"},
			Body:    []byte(`{"order":42}`),
		},
		Origin: "orders.new", Reason: "max-retries", Policy: "default:ab12", Group: "g-1",
		Error: "timeout\ncalling payments", ErrorStamped: true, ErrorRetry: 3, Retries: 3,
		ParkedAt: parkedAt, StartedAt: parkedAt.Add(-time.Hour), FirstDeathReason: "rejected", FirstDeathQueue: "orders.new",
	}
	var out bytes.Buffer
	printMessage(&out, m)
	text := out.String()
	for _, want := range []string{
		"message id:", "m-1", "origin:", "orders.new", "reason:", "max-retries", "error:", "timeout calling payments",
		"retry 3, the failure that parked it", "2026-11-27T09:00:00Z", "rejected in orders.new", "correlation id:",
		"app id:", "orders-api", "headers:\n  tenant:", "body (12 bytes, text):\n{\"order\":42}",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("parked show lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "redirected from") || strings.Contains(text, "reply to") {
		t.Errorf("parked show prints properties that are not set:\n%s", text)
	}
	if strings.Index(text, "tenant") > strings.Index(text, "x-retry-count") {
		t.Errorf("headers out of name order:\n%s", text)
	}
	m.Delivery.Body = []byte{0xff, 0x00, 0x01}
	out.Reset()
	printMessage(&out, m)
	if !strings.Contains(out.String(), "body (3 bytes, binary, base64):\n/wAB\nfirst 3 bytes:\n00000000  ff 00 01") {
		t.Errorf("binary body:\n%s", out.String())
	}
}

// TestParkedCells: how parked list and show word what may be missing.
func TestParkedCells(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{errorReportedAt(parking.Message{}), "not recorded (set by the consumer, or before rebound stamped errors)"},
		{errorReportedAt(parking.Message{ErrorStamped: true, ErrorRetry: -1}), "before the message was last replayed"},
		{errorReportedAt(parking.Message{ErrorStamped: true, ErrorRetry: 2, Retries: 5}), "retry 2 (parked at 5: an earlier attempt's; the group is its origin's and reason's)"},
		{firstDeath("", ""), "-"}, {firstDeath("expired", ""), "expired"}, {firstDeath("", "orders"), "- in orders"},
		{oneLine("a\n  b\tc", 10), "a b c"}, {oneLine("abcdefghij", 5), "abcd…"},
		{counts(nil), "none"}, {counts(map[string]int{"b": 1, "a": 1, "c": 3}), "c=3 a=1 b=1"},
		{more(map[string]int{"max-retries": 4}), "max-retries"}, {more(map[string]int{"": 4, "deadline": 1}), "- (+1)"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
	if got := dashed(map[string]int{"": 2, "-": 1, "a": 1}); got["-"] != 3 || got["a"] != 1 || len(got) != 2 {
		t.Errorf("dashed = %v, want - 3 and a 1", got)
	}
}
