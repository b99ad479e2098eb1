package config

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/policy"
)

// TestLoadDefaults checks that an empty environment gives DESIGN.md's
// configuration table.
func TestLoadDefaults(t *testing.T) {
	c, err := Load([]string{"PATH=/usr/bin", "HOME=/root", "NOT_REBOUND_MIN_DELAY=nonsense"})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := Config{
		AMQPURL:            "amqp://guest:guest@localhost:5672/",
		InboxQueue:         "rebound.inbox",
		DeadLetterExchange: "rebound.dlx",
		DelayExchange:      "rebound.delay",
		DelayQueuePrefix:   "rebound.delay.",
		ParkingQueue:       "rebound.parked",
		QueueType:          classic,
		PolicyConfig: PolicyConfig{
			Backoff:          policy.Exponential,
			MinDelay:         time.Second,
			MaxDelay:         time.Hour,
			Multiplier:       2,
			Jitter:           "full",
			JitterFactor:     0.5,
			JitterMax:        time.Second,
			ImmediateRetries: 0,
			MaxRetries:       10,
			MaxDuration:      24 * time.Hour,
			Deadline:         "clamp",
		},
		Prefetch: 1024, InflightBytes: 64 << 20, DelayQueueIdle: 15 * time.Minute,
		ConfirmTimeout:     30 * time.Second,
		ShutdownGrace:      20 * time.Second,
		HTTPAddr:           ":9464",
		ConsoleAddr:        "127.0.0.1:9465",
		LogLevel:           "info",
		LogFormat:          "json",
		EventsFormat:       "cloudevents",
		MetricsOriginLimit: 100,

		HeaderRetryCount:    "x-retry-count",
		HeaderTaskStartedAt: "x-task-started-at",
		HeaderLastDelay:     "x-retry-last-delay-ms",
		HeaderOriginQueue:   "x-retry-origin-queue",
		HeaderNonRetryable:  "x-retry-non-retryable",
		HeaderError:         "x-retry-error",
		HeaderParkedReason:  "x-retry-parked-reason",
		HeaderParkedAt:      "x-retry-parked-at",

		HeaderRetryAfter:     "x-retry-after",
		HeaderErrorRetry:     "x-retry-error-retry",
		HeaderGroup:          "x-retry-group",
		HeaderRedirectedFrom: "x-retry-redirected-from",

		HeaderFirstDeathReason: "x-retry-first-death-reason",
		HeaderFirstDeathQueue:  "x-retry-first-death-queue",
		HeaderPolicy:           "x-retry-policy",
		HeaderDueAt:            "x-retry-due-at",
		DelayDigits:            2,
		DelayMode:              delayQueues,
		HoldSlice:              5 * time.Minute,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Load(no REBOUND_*) =\n%+v\nwant\n%+v", c, want)
	}
	if c.headerNames() != headers.DefaultNames() {
		t.Errorf("headerNames() = %+v, want headers.DefaultNames()", c.headerNames())
	}
}

func TestLoadValues(t *testing.T) {
	c, err := Load([]string{
		"REBOUND_AMQP_URL=amqps://app:pw@broker.internal:5671/orders",
		"REBOUND_BACKOFF=geometric", "REBOUND_MIN_DELAY=5s", "REBOUND_MAX_DELAY=260s",
		"REBOUND_JITTER=gaussian", "REBOUND_JITTER_FACTOR=0.2", "REBOUND_JITTER_MAX=250ms",
		"REBOUND_IMMEDIATE_RETRIES=2", "REBOUND_MAX_RETRIES=12", "REBOUND_MAX_DURATION=0",
		"REBOUND_DEADLINE=strict", "REBOUND_QUEUE_TYPE=quorum", "REBOUND_PREFETCH=32",
		"REBOUND_HEADER_ERROR=x-app-error",
	})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := policy.Policy{
		Backoff: "geometric", MinDelay: 5 * time.Second, MaxDelay: 260 * time.Second, Multiplier: 2,
		Jitter: policy.GaussianJitter, JitterFactor: 0.2, JitterMax: 250 * time.Millisecond,
		ImmediateRetries: 2, MaxRetries: 12, MaxDuration: 0, Deadline: policy.Strict, DelayDigits: 2,
	}
	if c.defaultPolicy() != want {
		t.Errorf("defaultPolicy() = %+v, want %+v", c.defaultPolicy(), want)
	}
	if c.AMQPURL != "amqps://app:pw@broker.internal:5671/orders" || c.QueueType != quorum || c.Prefetch != 32 || c.headerNames().Error != "x-app-error" {
		t.Errorf("Load = %+v", c)
	}
}

// TestLoadInvalid checks that each invalid value or combination is
// reported once, naming the variable, the value as written and what is
// allowed.
func TestLoadInvalid(t *testing.T) {
	tests := []struct {
		name     string
		environ  []string
		variable string
		value    string
		allowed  string // a part of the Allowed text
	}{
		{"unknown backoff", []string{"REBOUND_BACKOFF=fibonacci"}, "REBOUND_BACKOFF", "fibonacci", "one of constant, linear, arithmetic, geometric, exponential"},
		{"unknown jitter", []string{"REBOUND_JITTER=random"}, "REBOUND_JITTER", "random", "one of none, full, equal, bounded, decorrelated, proportional, gaussian, additive"},
		{"unknown deadline", []string{"REBOUND_DEADLINE=soft"}, "REBOUND_DEADLINE", "soft", "one of clamp, strict, lenient"},
		{"unknown queue type", []string{"REBOUND_QUEUE_TYPE=stream"}, "REBOUND_QUEUE_TYPE", "stream", "one of classic, quorum"},
		{"unknown delay mode", []string{"REBOUND_DELAY_MODE=plugin"}, "REBOUND_DELAY_MODE", "plugin", "one of queues, hold"},
		{"hold slice too short", []string{"REBOUND_HOLD_SLICE=100ms"}, "REBOUND_HOLD_SLICE", "100ms", "a duration from 1s to 24h"},
		{"hold slice too long", []string{"REBOUND_HOLD_SLICE=48h"}, "REBOUND_HOLD_SLICE", "48h0m0s", "a duration from 1s to 24h"},
		{"unknown log level", []string{"REBOUND_LOG_LEVEL=trace"}, "REBOUND_LOG_LEVEL", "trace", "one of debug, info, warn, error"},
		{"unknown log format", []string{"REBOUND_LOG_FORMAT=xml"}, "REBOUND_LOG_FORMAT", "xml", "one of json, console"},
		{"unknown events format", []string{"REBOUND_EVENTS_FORMAT=cloudevent"}, "REBOUND_EVENTS_FORMAT", "cloudevent", "one of cloudevents, schema1 (did you mean cloudevents?)"},
		{"duration that does not parse", []string{"REBOUND_MIN_DELAY=soon"}, "REBOUND_MIN_DELAY", "soon", "a Go duration such as 500ms"},
		{"duration without unit", []string{"REBOUND_MAX_DURATION=3600"}, "REBOUND_MAX_DURATION", "3600", "a Go duration"},
		{"delay digits out of range", []string{"REBOUND_DELAY_DIGITS=4"}, "REBOUND_DELAY_DIGITS", "4", "1, 2 or 3 significant digits"},
		{"delay digits not a number", []string{"REBOUND_DELAY_DIGITS=two"}, "REBOUND_DELAY_DIGITS", "two", "a whole number"},
		{"retry rate absurd", []string{"REBOUND_RETRY_RATE=1e9"}, "REBOUND_RETRY_RATE", "1e+09", "from 0 (no cap) to 100000"},
		{"retry rate not a number", []string{"REBOUND_RETRY_RATE=fast"}, "REBOUND_RETRY_RATE", "fast", "a number"},
		{"inflight bytes zero", []string{"REBOUND_INFLIGHT_BYTES=0"}, "REBOUND_INFLIGHT_BYTES", "0B", "a size above 0"},
		{"inflight bytes negative", []string{"REBOUND_INFLIGHT_BYTES=-5MiB"}, "REBOUND_INFLIGHT_BYTES", "-5MiB", "a size above 0"},
		{"inflight bytes not a size", []string{"REBOUND_INFLIGHT_BYTES=lots"}, "REBOUND_INFLIGHT_BYTES", "lots", "a size: a whole number of bytes"},
		{"inflight bytes in a unit it does not know", []string{"REBOUND_INFLIGHT_BYTES=5TB"}, "REBOUND_INFLIGHT_BYTES", "5TB", "a size: a whole number of bytes"},
		{"prefetch zero", []string{"REBOUND_PREFETCH=0"}, "REBOUND_PREFETCH", "0", "from 1 to 65535"},
		{"zero min delay", []string{"REBOUND_MIN_DELAY=0s"}, "REBOUND_MIN_DELAY", "0s", "at least 1ms"},
		{"min delay under a millisecond", []string{"REBOUND_MIN_DELAY=500us"}, "REBOUND_MIN_DELAY", "500µs", "at least 1ms"},
		{"negative max delay", []string{"REBOUND_MAX_DELAY=-1s"}, "REBOUND_MAX_DELAY", "-1s", "from 1ms to 720h0m0s"},
		{"negative delay queue idle", []string{"REBOUND_DELAY_QUEUE_IDLE=-1m"}, "REBOUND_DELAY_QUEUE_IDLE", "-1m0s", "0 or more"},
		{"max delay beyond the header's range", []string{"REBOUND_MAX_DELAY=1000h"}, "REBOUND_MAX_DELAY", "1000h0m0s", "from 1ms to 720h0m0s"},
		{"HTTP address without a port", []string{"REBOUND_HTTP_ADDR=localhost"}, "REBOUND_HTTP_ADDR", "localhost", "host:port or :port"},
		{"console address without a port", []string{"REBOUND_CONSOLE_ADDR=localhost"}, "REBOUND_CONSOLE_ADDR", "localhost", "host:port or :port"},
		{"console certificate without its key", []string{"REBOUND_CONSOLE_TLS_CERT_FILE=/etc/console.pem"}, "REBOUND_CONSOLE_TLS_CERT_FILE", "/etc/console.pem", "both or neither"},
		{"min above max", []string{"REBOUND_MIN_DELAY=2h"}, "REBOUND_MIN_DELAY", "2h0m0s", "at most REBOUND_MAX_DELAY (1h0m0s)"},
		{"multiplier of 1", []string{"REBOUND_MULTIPLIER=1"}, "REBOUND_MULTIPLIER", "1", "a finite number above 1"},
		{"infinite multiplier", []string{"REBOUND_MULTIPLIER=Inf"}, "REBOUND_MULTIPLIER", "+Inf", "a finite number above 1"},
		{"NaN multiplier", []string{"REBOUND_MULTIPLIER=NaN"}, "REBOUND_MULTIPLIER", "NaN", "a finite number above 1"},
		{"multiplier not a number", []string{"REBOUND_MULTIPLIER=double"}, "REBOUND_MULTIPLIER", "double", "a number"},
		{"proportional factor above 1", []string{"REBOUND_JITTER=proportional", "REBOUND_JITTER_FACTOR=1.5"}, "REBOUND_JITTER_FACTOR", "1.5", "from 0 to 1 with proportional jitter"},
		{"gaussian factor below 0", []string{"REBOUND_JITTER=gaussian", "REBOUND_JITTER_FACTOR=-0.1"}, "REBOUND_JITTER_FACTOR", "-0.1", "from 0 to 1 with gaussian jitter"},
		{"negative jitter max", []string{"REBOUND_JITTER_MAX=-1s"}, "REBOUND_JITTER_MAX", "-1s", "0 or more"},
		{"negative immediate retries", []string{"REBOUND_IMMEDIATE_RETRIES=-1"}, "REBOUND_IMMEDIATE_RETRIES", "-1", "0 or more"},
		{"negative max retries", []string{"REBOUND_MAX_RETRIES=-1"}, "REBOUND_MAX_RETRIES", "-1", "a whole number from 0"},
		{"max retries beyond the header's range", []string{"REBOUND_MAX_RETRIES=2000000"}, "REBOUND_MAX_RETRIES", "2000000", "to 1000000"},
		{"fractional max retries", []string{"REBOUND_MAX_RETRIES=2.5"}, "REBOUND_MAX_RETRIES", "2.5", "a whole number"},
		{"negative budget", []string{"REBOUND_MAX_DURATION=-1h"}, "REBOUND_MAX_DURATION", "-1h0m0s", "0 or more"},
		{"no limit at all", []string{"REBOUND_MAX_RETRIES=0", "REBOUND_MAX_DURATION=0"}, "REBOUND_MAX_RETRIES", "0", "one limit is needed"},
		{"fitted over one retry", []string{"REBOUND_BACKOFF=linear", "REBOUND_MAX_RETRIES=1"}, "REBOUND_MAX_RETRIES", "1", "at least REBOUND_IMMEDIATE_RETRIES (0) + 2 with REBOUND_BACKOFF=linear"},
		{"fitted without a count", []string{"REBOUND_BACKOFF=arithmetic", "REBOUND_MAX_RETRIES=0"}, "REBOUND_MAX_RETRIES", "0", "REBOUND_BACKOFF=arithmetic"},
		{"fitted over one delayed retry", []string{"REBOUND_BACKOFF=geometric", "REBOUND_MAX_RETRIES=4", "REBOUND_IMMEDIATE_RETRIES=3"}, "REBOUND_MAX_RETRIES", "4", "at least REBOUND_IMMEDIATE_RETRIES (3) + 2 with REBOUND_BACKOFF=geometric"},
		{"prefetch too large", []string{"REBOUND_PREFETCH=70000"}, "REBOUND_PREFETCH", "70000", "from 1 to 65535"},
		{"origin limit negative", []string{"REBOUND_METRICS_ORIGIN_LIMIT=-1"}, "REBOUND_METRICS_ORIGIN_LIMIT", "-1", "0 to 2000 (0 leaves the label empty)"},
		{"origin limit absurd", []string{"REBOUND_METRICS_ORIGIN_LIMIT=100000"}, "REBOUND_METRICS_ORIGIN_LIMIT", "100000", "0 to 2000"},
		{"zero confirm timeout", []string{"REBOUND_CONFIRM_TIMEOUT=0s"}, "REBOUND_CONFIRM_TIMEOUT", "0s", "above 0"},
		{"negative grace", []string{"REBOUND_SHUTDOWN_GRACE=-1s"}, "REBOUND_SHUTDOWN_GRACE", "-1s", "0 or more"},
		{"negative retention", []string{"REBOUND_PARKED_RETENTION=-1h"}, "REBOUND_PARKED_RETENTION", "-1h0m0s", "a duration of at least 1m"},
		{"retention of seconds", []string{"REBOUND_PARKED_RETENTION=30s"}, "REBOUND_PARKED_RETENTION", "30s", "a duration of at least 1m"},
		{"retention not a duration", []string{"REBOUND_PARKED_RETENTION=2 weeks"}, "REBOUND_PARKED_RETENTION", "2 weeks", ""},
		{"group header taken", []string{"REBOUND_HEADER_GROUP=x-retry-error"}, "REBOUND_HEADER_GROUP", "x-retry-error", "no other REBOUND_HEADER_* variable uses"},
		{"reserved queue name", []string{"REBOUND_INBOX_QUEUE=amq.inbox"}, "REBOUND_INBOX_QUEUE", "amq.inbox", "not starting with amq."},
		{"dead-letter exchange named as a delay exchange", []string{"REBOUND_DEAD_LETTER_EXCHANGE=rebound.delay.1500"}, "REBOUND_DEAD_LETTER_EXCHANGE", "rebound.delay.1500", "a delay queue's exchange"},
		{"long exchange name", []string{"REBOUND_DELAY_EXCHANGE=" + strings.Repeat("x", 201)}, "REBOUND_DELAY_EXCHANGE", strings.Repeat("x", 201), "at most 200 bytes"},
		{"header RabbitMQ owns", []string{"REBOUND_HEADER_ERROR=x-death"}, "REBOUND_HEADER_ERROR", "x-death", "a header name RabbitMQ does not own"},
		{"header RabbitMQ owns by prefix", []string{"REBOUND_HEADER_RETRY_COUNT=x-first-death-reason"}, "REBOUND_HEADER_RETRY_COUNT", "x-first-death-reason", "RabbitMQ does not own"},
		{"long header", []string{"REBOUND_HEADER_PARKED_AT=" + strings.Repeat("h", 129)}, "REBOUND_HEADER_PARKED_AT", strings.Repeat("h", 129), "1 to 128 bytes"},
		// Always the later of the two, whatever map order would say.
		{"header used twice", []string{"REBOUND_HEADER_PARKED_REASON=x-a", "REBOUND_HEADER_ERROR=x-a"}, "REBOUND_HEADER_PARKED_REASON", "x-a", "(REBOUND_HEADER_ERROR does)"},
		{"header clashing with a default", []string{"REBOUND_HEADER_PARKED_AT=x-retry-count"}, "REBOUND_HEADER_PARKED_AT", "x-retry-count", "(REBOUND_HEADER_RETRY_COUNT does)"},
		{"not an AMQP URL", []string{"REBOUND_AMQP_URL=http://localhost:5672/"}, "REBOUND_AMQP_URL", "http://localhost:5672/", "an amqp:// or amqps:// URL"},
		{"one bad URL in a list", []string{"REBOUND_AMQP_URL=amqp://a:5672/,http://b:5672/"}, "REBOUND_AMQP_URL", "amqp://a:5672/,http://b:5672/", "(URL 2 of 2 is not)"},
		{"URLs naming different vhosts", []string{"REBOUND_AMQP_URL=amqp://a/orders, amqp://b/billing"}, "REBOUND_AMQP_URL", "amqp://a/orders,amqp://b/billing", `URL 2 names "billing", URL 1 "orders"`},
		{"only commas", []string{"REBOUND_AMQP_URL=, ,"}, "REBOUND_AMQP_URL", ",,", "an amqp:// or amqps:// URL"},
		{"empty AMQP URL file", []string{"REBOUND_AMQP_URL_FILE=" + os.DevNull}, "REBOUND_AMQP_URL_FILE", os.DevNull, "a file holding an amqp:// or amqps:// URL"},
		{"missing AMQP URL file", []string{"REBOUND_AMQP_URL_FILE=/nonexistent/url"}, "REBOUND_AMQP_URL_FILE", "/nonexistent/url", "a readable file holding the broker URL"},
		{"TLS cert without key", []string{"REBOUND_TLS_CERT_FILE=/tls/cert.pem"}, "REBOUND_TLS_CERT_FILE", "/tls/cert.pem", "both or neither"},
		{"origin pattern that does not compile", []string{`REBOUND_ORIGIN_QUEUES=^orders\.(`}, "REBOUND_ORIGIN_QUEUES", `^orders\.(`, "a regular expression of the queues rebound may send messages back to"},
		{"header RabbitMQ routes on", []string{"REBOUND_HEADER_ERROR=BCC"}, "REBOUND_HEADER_ERROR", "BCC", "a header name RabbitMQ does not own"},
		{"header RabbitMQ counts deliveries in", []string{"REBOUND_HEADER_RETRY_COUNT=x-delivery-count"}, "REBOUND_HEADER_RETRY_COUNT", "x-delivery-count", "RabbitMQ does not own"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(tt.environ)
			var cfgErr *Error
			if !errors.As(err, &cfgErr) {
				t.Fatalf("Load = %v (%T), want an *Error", err, err)
			}
			if len(cfgErr.Problems) != 1 {
				t.Fatalf("%d problems, want 1:\n%v", len(cfgErr.Problems), err)
			}
			p := cfgErr.Problems[0]
			if p.Variable != tt.variable || p.Value != tt.value || !strings.Contains(p.Allowed, tt.allowed) {
				t.Errorf("problem %+v\nwant variable %s, value %q, allowed containing %q", p, tt.variable, tt.value, tt.allowed)
			}
			if msg := err.Error(); !strings.Contains(msg, tt.variable) || !strings.Contains(msg, tt.allowed) {
				t.Errorf("message %q does not name the variable and what is allowed", msg)
			}
		})
	}
}

// TestLoadValidCombinations checks values next to the limits that are
// allowed, so the rules above are not stricter than they say.
func TestLoadValidCombinations(t *testing.T) {
	for _, environ := range [][]string{
		{"REBOUND_BACKOFF=linear", "REBOUND_MAX_RETRIES=5", "REBOUND_IMMEDIATE_RETRIES=3"},
		{"REBOUND_BACKOFF=constant", "REBOUND_MULTIPLIER=1"}, // the multiplier only matters to exponential
		{"REBOUND_JITTER=full", "REBOUND_JITTER_FACTOR=7"},   // the factor only matters to proportional and gaussian
		{"REBOUND_MIN_DELAY=1ms", "REBOUND_MAX_DELAY=1ms"},
		{"REBOUND_MAX_RETRIES=0", "REBOUND_MAX_DURATION=15m"},
		{"REBOUND_MAX_DURATION=0"},
		{"REBOUND_BACKOFF="}, // empty means unset: the default
		{"REBOUND_AMQP_URL=amqps://user:p%40ss@broker:5671/vhost"},
		{"REBOUND_TLS_CERT_FILE=/c.pem", "REBOUND_TLS_KEY_FILE=/k.pem"},
		{`REBOUND_ORIGIN_QUEUES=^(orders|billing)\.`},
	} {
		if _, err := Load(environ); err != nil {
			t.Errorf("Load(%q) = %v, want no error", environ, err)
		}
	}
}

func TestLoadReportsEveryProblem(t *testing.T) {
	_, err := Load([]string{
		"REBOUND_PREFETCH=lots", "REBOUND_JITTER=random", "REBOUND_MIN_DELAY=0s",
		"REBOUND_MULTIPLIER=0.5", "REBOUND_DEADLINE=never",
	})
	var cfgErr *Error
	if !errors.As(err, &cfgErr) {
		t.Fatalf("Load = %v, want an *Error", err)
	}
	var got []string
	for _, p := range cfgErr.Problems {
		got = append(got, p.Variable)
	}
	// Parse errors first, then the rest by variable name.
	want := "REBOUND_PREFETCH REBOUND_DEADLINE REBOUND_JITTER REBOUND_MIN_DELAY REBOUND_MULTIPLIER"
	if strings.Join(got, " ") != want {
		t.Errorf("problems for %v, want %s", got, want)
	}
	if !strings.HasPrefix(err.Error(), "invalid configuration (5 problems):\n") {
		t.Errorf("message %q", err)
	}
	if _, err := Load([]string{"REBOUND_JITTER=bogus"}); err == nil || !strings.HasPrefix(err.Error(), "invalid configuration (1 problem):\n") {
		t.Errorf("one problem: message %q, want it counted in the singular", err)
	}
}

// TestLoadNoSpuriousProblems checks that a variable that fails to parse is
// reported once, not again through a rule that saw its zero value.
func TestLoadNoSpuriousProblems(t *testing.T) {
	for _, environ := range [][]string{
		{"REBOUND_MAX_RETRIES=0", "REBOUND_MAX_DURATION=forever"},
		{"REBOUND_MIN_DELAY=quick"},
		{"REBOUND_BACKOFF=linear", "REBOUND_MAX_RETRIES=5", "REBOUND_IMMEDIATE_RETRIES=some"},
		{"REBOUND_MULTIPLIER=double"},
	} {
		_, err := Load(environ)
		var cfgErr *Error
		if !errors.As(err, &cfgErr) || len(cfgErr.Problems) != 1 {
			t.Errorf("Load(%q) = %v, want exactly one problem", environ, err)
		}
	}
}

func TestLoadAMQPURLFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "url")
	// A mounted secret often ends with a newline.
	if err := os.WriteFile(path, []byte("amqps://app:s3cr3t@broker:5671/orders\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load([]string{"REBOUND_AMQP_URL=amqp://ignored/", "REBOUND_AMQP_URL_FILE=" + path})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if c.AMQPURL != "amqps://app:s3cr3t@broker:5671/orders" {
		t.Errorf("AMQPURL = %q, want the file's URL", Redact(c.AMQPURL))
	}

	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("app:s3cr3t@broker:5671"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load([]string{"REBOUND_AMQP_URL_FILE=" + bad})
	if err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("Load with a bad URL in the file = %v, want an error without the password", err)
	}
}

// TestLoadNeverEchoesPassword feeds URLs that hold a password in every
// malformed way we could think of: the error must never contain it.
func TestLoadNeverEchoesPassword(t *testing.T) {
	for _, raw := range []string{
		"http://app:s3cr3t@broker:5672/",
		"guest:s3cr3t@broker:5672",
		"amqp//guest:s3cr3t@broker",
		"amqp:guest:s3cr3t@broker",
		"amqp:/guest:s3cr3t@broker",
		"http://broker/guest:s3cr3t@x",
		"amqp://app:s3cr3t@broker:port/",
		"amqp://app:s3cr3t%zz@broker/",
		"amqp://app:s3cr3t@bro ker/",
		" amqp://app:s3cr3t@broker/",
		"amqps://app:s3cr3t@[::1/",
		"AMQP_URL=amqp://app:s3cr3t@broker\n",
	} {
		_, err := Load([]string{"REBOUND_AMQP_URL=" + raw})
		if err == nil {
			continue // accepted as a URL: nothing is echoed
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("Load(REBOUND_AMQP_URL=%q) echoes the password: %v", raw, err)
		}
	}
}

func TestBrokerURLs(t *testing.T) {
	tests := []struct {
		raw  string
		want []string
	}{
		{"amqp://guest:guest@localhost:5672/", []string{"amqp://guest:guest@localhost:5672/"}},
		{"amqp://n1:5672/, amqp://n2:5672/ ,,amqp://n3:5672/", []string{"amqp://n1:5672/", "amqp://n2:5672/", "amqp://n3:5672/"}},
		{"amqp://u:a%2Cb@n1/", []string{"amqp://u:a%2Cb@n1/"}},
	}
	for _, tt := range tests {
		c, err := Load([]string{"REBOUND_AMQP_URL=" + tt.raw})
		if err != nil {
			t.Errorf("Load(REBOUND_AMQP_URL=%q): %v", tt.raw, err)
			continue
		}
		if got := c.BrokerURLs(); !slices.Equal(got, tt.want) {
			t.Errorf("BrokerURLs() of %q = %q, want %q", tt.raw, got, tt.want)
		}
	}
}

func TestRedact(t *testing.T) {
	tests := []struct{ raw, want string }{
		{"amqp://guest:guest@localhost:5672/", "amqp://guest:xxxxx@localhost:5672/"},
		{"amqps://broker:5671/vhost", "amqps://broker:5671/vhost"},
		{"guest:s3cr3t@broker:5672", "<URL hidden: it holds an @ outside the user info>"},
		{"amqp://app:s3cr3t%zz@broker/", "<unparseable URL>"},
		{"amqp://a:s3cr3t@n1/,amqp://a:s3cr3t@n2/", "amqp://a:xxxxx@n1/,amqp://a:xxxxx@n2/"},
		{"amqp://a:s3cr3t@n1/, guest:s3cr3t@n2", "amqp://a:xxxxx@n1/,<URL hidden: it holds an @ outside the user info>"},
	}
	for _, tt := range tests {
		if got := Redact(tt.raw); got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.raw, got, tt.want)
		}
	}
}

// FuzzLoad feeds Load arbitrary values. It must never panic; an error is
// always an *Error naming REBOUND_ variables and never holding the
// password; and a configuration it accepts gives a policy that keeps
// every delay within [0, REBOUND_MAX_DELAY] and its schedule finite.
func FuzzLoad(f *testing.F) {
	f.Add("exponential", "full", "clamp", "1s", "1h", "2", "0.5", "0", "10", "24h", "amqp://app", "broker:5672/")
	f.Add("linear", "gaussian", "strict", "5s", "260s", "1", "1.5", "2", "3", "0", "guest", "localhost")
	f.Add("geometric", "decorrelated", "lenient", "1ms", "1ms", "NaN", "-1", "-1", "0", "-1s", "http://h/p", "x")
	f.Add("", "", "", "", "", "", "", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, backoff, jitter, deadline, minDelay, maxDelay, multiplier, factor, immediate, maxRetries, maxDuration, urlHead, urlTail string) {
		const password = "Pw9zq7"
		// The URL puts the password where user info goes, with whatever
		// around it; a head or tail that holds the password or an @ makes
		// the password's place ambiguous, so it is not checked.
		url := urlHead + ":" + password + "@" + urlTail
		checkPassword := !strings.Contains(urlHead+urlTail, password) && !strings.Contains(urlHead+urlTail, "@")
		environ := []string{
			"REBOUND_BACKOFF=" + backoff, "REBOUND_JITTER=" + jitter, "REBOUND_DEADLINE=" + deadline,
			"REBOUND_MIN_DELAY=" + minDelay, "REBOUND_MAX_DELAY=" + maxDelay, "REBOUND_MULTIPLIER=" + multiplier,
			"REBOUND_JITTER_FACTOR=" + factor, "REBOUND_IMMEDIATE_RETRIES=" + immediate,
			"REBOUND_MAX_RETRIES=" + maxRetries, "REBOUND_MAX_DURATION=" + maxDuration,
			"REBOUND_AMQP_URL=" + url,
		}
		c, err := Load(environ)
		if err != nil {
			var cfgErr *Error
			if !errors.As(err, &cfgErr) || len(cfgErr.Problems) == 0 {
				t.Fatalf("Load = %v (%T), want an *Error with problems", err, err)
			}
			for _, p := range cfgErr.Problems {
				if !strings.HasPrefix(p.Variable, Prefix) {
					t.Errorf("problem %+v does not name a variable", p)
				}
			}
			if checkPassword && strings.Contains(err.Error(), password) {
				t.Fatalf("error echoes the password: %v", err)
			}
			return
		}
		p := c.defaultPolicy()
		started := time.Unix(1_700_000_000, 0)
		r := rand.New(rand.NewPCG(1, 2))
		for n := range 20 {
			d := p.Decide(policy.State{Retries: n, StartedAt: started}, started.Add(time.Duration(n)*time.Minute), r)
			if d.Delay < 0 || d.Delay > p.MaxDelay {
				t.Fatalf("policy %+v: retry %d delay %v outside [0, MaxDelay]", p, n, d.Delay)
			}
		}
		if steps, _ := p.Schedule(50); len(steps) > 50 {
			t.Fatalf("Schedule(50) gave %d steps", len(steps))
		}
	})
}

func TestOriginAllowed(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		queue   string
		want    bool
	}{
		{"", "anything", true},
		{`^orders\.`, "orders.created", true},
		{`^orders\.`, "payments", false},
		{`^orders\.`, "old.orders.created", false},
		// RabbitMQ's policy patterns are unanchored, and so is this one.
		{`orders`, "old.orders.created", true},
		{`^(orders|billing)\.[a-z]+$`, "billing.refunds", true},
		{`^(orders|billing)\.[a-z]+$`, "billing.refunds.v2", false},
	} {
		environ := []string{"REBOUND_ORIGIN_QUEUES=" + tc.pattern}
		c, err := Load(environ)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Topology().Allows(tc.queue); got != tc.want {
			t.Errorf("REBOUND_ORIGIN_QUEUES=%q allows %q: %v, want %v", tc.pattern, tc.queue, got, tc.want)
		}
	}
}

// The console believes X-Forwarded-For only from the proxies named, and
// never from everyone.
func TestParseTrustedProxies(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want string // the prefixes, joined; "error" when refused
	}{
		{"", ""},
		{"10.0.0.0/8", "10.0.0.0/8"},
		{" 10.1.2.3/8 , 192.168.1.10,fd00::/8 ", "10.0.0.0/8 192.168.1.10/32 fd00::/8"},
		{"::ffff:10.0.0.1", "10.0.0.1/32"},
		{"0.0.0.0/0", "error"},
		{"::/0", "error"},
		{"10.0.0.0/33", "error"},
		{"proxy.internal", "error"},
		{"fe80::1%eth0", "error"},
	} {
		got, err := parseTrustedProxies(tt.in)
		s := make([]string, len(got))
		for i, p := range got {
			s[i] = p.String()
		}
		switch {
		case tt.want == "error" && err == nil:
			t.Errorf("%q: %v, want an error", tt.in, got)
		case tt.want != "error" && (err != nil || strings.Join(s, " ") != tt.want):
			t.Errorf("%q: %v, %v; want %s", tt.in, s, err, tt.want)
		}
	}
}

// Plain HTTP is served on loopback only, unless TLS is configured or a
// TLS-terminating proxy is said to sit in front; cookies are Secure in
// the last two cases.
func TestCheckConsoleListen(t *testing.T) {
	for _, tt := range []struct {
		addr         string
		cert, proxy  bool
		refused, sec bool
	}{
		{"127.0.0.1:9465", false, false, false, false},
		{"127.0.0.2:9465", false, false, false, false},
		{"[::1]:9465", false, false, false, false},
		{"localhost:9465", false, false, false, false},
		{":9465", false, false, true, false},
		{"0.0.0.0:9465", false, false, true, false},
		{"[::]:9465", false, false, true, false},
		{"10.0.0.5:9465", false, false, true, false},
		{"console.internal:9465", false, false, true, false},
		{":9465", true, false, false, true},
		{":9465", false, true, false, true},
		{"127.0.0.1:9465", false, true, false, true},
	} {
		c := Config{ConsoleAddr: tt.addr, ConsoleBehindTLSProxy: tt.proxy}
		if tt.cert {
			c.ConsoleTLSCertFile, c.ConsoleTLSKeyFile = "/tls/crt", "/tls/key"
		}
		err := c.CheckConsoleListen()
		var cfgErr *Error
		switch {
		case tt.refused && (!errors.As(err, &cfgErr) || !strings.Contains(err.Error(), "REBOUND_CONSOLE_ADDR") ||
			!strings.Contains(err.Error(), tt.addr) || !strings.Contains(err.Error(), "REBOUND_CONSOLE_BEHIND_TLS_PROXY")):
			t.Errorf("%s (cert %v, proxy %v): %v, want a configuration error naming the variable, value and the ways out", tt.addr, tt.cert, tt.proxy, err)
		case !tt.refused && err != nil:
			t.Errorf("%s (cert %v, proxy %v): %v, want allowed", tt.addr, tt.cert, tt.proxy, err)
		}
		if got := c.ConsoleSecure(); got != tt.sec {
			t.Errorf("%s (cert %v, proxy %v): ConsoleSecure %v, want %v", tt.addr, tt.cert, tt.proxy, got, tt.sec)
		}
	}
}
