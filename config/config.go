// Package config reads rebound's configuration from REBOUND_* environment
// variables into one Config and validates it as a whole.
//
// Every problem is reported at once, each naming the variable, the value
// and what is allowed, so an operator fixes a manifest in one pass. Nothing
// here connects anywhere: main exits with status 2 on a config error before
// it dials the broker.
package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
)

// Prefix starts the name of every variable rebound reads.
const Prefix = "REBOUND_"

// queueType is the type of the queues rebound declares.
type queueType string

// Queue types.
const (
	classic queueType = "classic"
	quorum  queueType = "quorum"
)

// delayMode is how rebound holds a copy until its delay ends.
type delayMode string

// Delay modes: a TTL queue per distinct delay, or one quorum hold queue
// (RabbitMQ 4.3+) whose copies a holder returns with a delivery time.
const (
	delayQueues delayMode = "queues"
	DelayHold   delayMode = "hold"
)

// Config is rebound's whole configuration. Field tags name the variable
// without the REBOUND_ prefix.
type Config struct {
	AMQPURL     string `env:"AMQP_URL" envDefault:"amqp://guest:guest@localhost:5672/"`
	AMQPURLFile string `env:"AMQP_URL_FILE"`
	TLSCAFile   string `env:"TLS_CA_FILE"`
	TLSCertFile string `env:"TLS_CERT_FILE"`
	TLSKeyFile  string `env:"TLS_KEY_FILE"`

	InboxQueue         string    `env:"INBOX_QUEUE" envDefault:"rebound.inbox"`
	DeadLetterExchange string    `env:"DEAD_LETTER_EXCHANGE" envDefault:"rebound.dlx"`
	DelayExchange      string    `env:"DELAY_EXCHANGE" envDefault:"rebound.delay"`
	DelayQueuePrefix   string    `env:"DELAY_QUEUE_PREFIX" envDefault:"rebound.delay."`
	ParkingQueue       string    `env:"PARKING_QUEUE" envDefault:"rebound.parked"`
	QueueType          queueType `env:"QUEUE_TYPE" envDefault:"classic"`
	// EventsExchange is the topic exchange a JSON event is published to on
	// every park; "" publishes none.
	EventsExchange string `env:"EVENTS_EXCHANGE"`
	// EventsFormat is the form of park events: "cloudevents" (CloudEvents
	// 1.0, structured JSON) or "schema1" (the form before it, kept for one
	// version).
	EventsFormat string `env:"EVENTS_FORMAT" envDefault:"cloudevents"`
	// OriginQueues is a regular expression of the queues rebound may send
	// messages back to, "" for any (RabbitMQ's policy syntax: unanchored).
	OriginQueues string `env:"ORIGIN_QUEUES"`
	// MetricsOrigins is a regular expression of the origin queues whose
	// retries and parks are counted under their own origin label, ""
	// for every one; the rest count under "other".
	MetricsOrigins string `env:"METRICS_ORIGINS"`
	// MetricsOriginLimit is the most origins one replica counts under
	// their own label (each is series in Prometheus); 0 leaves the label
	// empty.
	MetricsOriginLimit int `env:"METRICS_ORIGIN_LIMIT" envDefault:"100"`

	// PolicyConfig holds the default policy's variables: the policy of
	// every origin no named policy selects.
	PolicyConfig
	// Labels is REBOUND_LABELS: the default policy's routing labels
	// (team=payments,owner=alice), which rebound_policy_info carries and
	// the alerts join (see PolicyLabels).
	Labels string `env:"LABELS"`
	// Policies is REBOUND_POLICIES: the named policies, in order of
	// precedence, comma-separated; each is read into Named.
	Policies string `env:"POLICIES"`
	// DelayDigits is how many significant digits a delay keeps for its
	// delay queue, for every policy: fewer digits, fewer delay queues.
	DelayDigits int `env:"DELAY_DIGITS" envDefault:"2"`
	// DelayMode chooses delay queues or the hold queue; HoldSlice is the
	// longest a copy is held before it comes back to a holder, where
	// flush and cancel can reach it.
	DelayMode delayMode     `env:"DELAY_MODE" envDefault:"queues"`
	HoldSlice time.Duration `env:"HOLD_SLICE" envDefault:"5m"`

	// Prefetch is the most unacked inbox deliveries; the window follows the
	// sizes seen to keep their bytes within InflightBytes.
	Prefetch       int           `env:"PREFETCH" envDefault:"1024"`
	InflightBytes  byteSize      `env:"INFLIGHT_BYTES" envDefault:"64MiB"`
	DelayQueueIdle time.Duration `env:"DELAY_QUEUE_IDLE" envDefault:"15m"`
	ConfirmTimeout time.Duration `env:"CONFIRM_TIMEOUT" envDefault:"30s"`
	ShutdownGrace  time.Duration `env:"SHUTDOWN_GRACE" envDefault:"20s"`
	// ParkedRetention is how long `rebound parked expire` keeps parked
	// messages; 0 = none (expire refuses to run). The sidecar never reads
	// it: nothing deletes a parked message but an operator's command.
	ParkedRetention time.Duration `env:"PARKED_RETENTION"`
	HTTPAddr        string        `env:"HTTP_ADDR" envDefault:":9464"`
	// ConsoleAddr is where `rebound console` listens; with both TLS files
	// set it serves HTTPS. Loopback by default: people sign in with
	// broker passwords, which must not cross a network in clear.
	ConsoleAddr        string `env:"CONSOLE_ADDR" envDefault:"127.0.0.1:9465"`
	ConsoleTLSCertFile string `env:"CONSOLE_TLS_CERT_FILE"`
	ConsoleTLSKeyFile  string `env:"CONSOLE_TLS_KEY_FILE"`
	// ConsoleBehindTLSProxy says a TLS-terminating proxy (an ingress)
	// sits in front of the console: plain HTTP on a non-loopback
	// address is then allowed, and cookies are marked Secure.
	ConsoleBehindTLSProxy bool `env:"CONSOLE_BEHIND_TLS_PROXY"`
	// ConsoleTrustedProxies are the reverse proxies whose X-Forwarded-For
	// the console believes (see ConsoleProxies).
	ConsoleTrustedProxies string `env:"CONSOLE_TRUSTED_PROXIES"`
	LogLevel              string `env:"LOG_LEVEL" envDefault:"info"`
	LogFormat             string `env:"LOG_FORMAT" envDefault:"json"`

	HeaderRetryCount    string `env:"HEADER_RETRY_COUNT" envDefault:"x-retry-count"`
	HeaderTaskStartedAt string `env:"HEADER_TASK_STARTED_AT" envDefault:"x-task-started-at"`
	HeaderLastDelay     string `env:"HEADER_LAST_DELAY" envDefault:"x-retry-last-delay-ms"`
	HeaderOriginQueue   string `env:"HEADER_ORIGIN_QUEUE" envDefault:"x-retry-origin-queue"`
	HeaderNonRetryable  string `env:"HEADER_NON_RETRYABLE" envDefault:"x-retry-non-retryable"`
	HeaderError         string `env:"HEADER_ERROR" envDefault:"x-retry-error"`
	HeaderParkedReason  string `env:"HEADER_PARKED_REASON" envDefault:"x-retry-parked-reason"`
	HeaderParkedAt      string `env:"HEADER_PARKED_AT" envDefault:"x-retry-parked-at"`

	HeaderFirstDeathReason string `env:"HEADER_FIRST_DEATH_REASON" envDefault:"x-retry-first-death-reason"`
	HeaderFirstDeathQueue  string `env:"HEADER_FIRST_DEATH_QUEUE" envDefault:"x-retry-first-death-queue"`
	HeaderPolicy           string `env:"HEADER_POLICY" envDefault:"x-retry-policy"`
	HeaderDueAt            string `env:"HEADER_DUE_AT" envDefault:"x-retry-due-at"`
	HeaderRetryAfter       string `env:"HEADER_RETRY_AFTER" envDefault:"x-retry-after"`
	HeaderErrorRetry       string `env:"HEADER_ERROR_RETRY" envDefault:"x-retry-error-retry"`
	HeaderGroup            string `env:"HEADER_GROUP" envDefault:"x-retry-group"`
	HeaderRedirectedFrom   string `env:"HEADER_REDIRECTED_FROM" envDefault:"x-retry-redirected-from"`

	// Named holds the policies REBOUND_POLICIES lists, in its order, each
	// read from its REBOUND_POLICY_<NAME>_* variables.
	Named []namedPolicy `env:"-"`
	// Warnings name the REBOUND_ variables rebound does not read, each
	// with the nearest one it does, and those set for a policy whose
	// backoff or jitter does not read them: for the log at start and
	// `rebound config check`.
	Warnings []string `env:"-"`
}

// fieldError is one invalid variable: its full name, the value found and
// what is allowed.
type fieldError struct {
	Variable string
	Value    string
	Allowed  string
}

func (e fieldError) Error() string {
	return fmt.Sprintf("%s=%q: %s", e.Variable, e.Value, e.Allowed)
}

// Error lists every problem found in one configuration.
type Error struct {
	Problems []fieldError
}

func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = "  " + p.Error()
	}
	noun := "problems"
	if len(e.Problems) == 1 {
		noun = "problem"
	}
	return fmt.Sprintf("invalid configuration (%d %s):\n%s", len(e.Problems), noun, strings.Join(lines, "\n"))
}

// Load reads the configuration from environ (os.Environ form, KEY=VALUE)
// and validates it. It reads the file named by REBOUND_AMQP_URL_FILE, if
// set. A non-nil error is always an *Error.
func Load(environ []string) (Config, error) {
	vars := env.ToMap(environ)
	var c Config
	var problems []fieldError
	failed := map[string]bool{} // variables that did not parse: skip their checks
	err := parseEnv(&c, vars, func(pe env.ParseError) {
		name := Prefix + fieldVariable[Config](pe.Name)
		failed[name] = true
		problems = append(problems, fieldError{Variable: name, Value: vars[name], Allowed: allowedForType(pe.Type)})
	}, func(e error) {
		problems = append(problems, fieldError{Variable: "?", Value: "", Allowed: e.Error()})
	})
	if err != nil {
		return c, &Error{Problems: []fieldError{{Variable: Prefix + "*", Allowed: err.Error()}}}
	}
	if c.AMQPURLFile != "" {
		b, err := os.ReadFile(c.AMQPURLFile)
		if err != nil {
			problems = append(problems, fieldError{Variable: Prefix + "AMQP_URL_FILE", Value: c.AMQPURLFile, Allowed: "a readable file holding the broker URL: " + err.Error()})
		} else {
			c.AMQPURL = strings.TrimSpace(string(b))
		}
	}
	problems = append(problems, c.validate(failed)...)
	if _, err := PolicyLabels(c.Labels); err != nil {
		problems = append(problems, fieldError{Variable: Prefix + "LABELS", Value: c.Labels, Allowed: err.Error()})
	}
	named, ps := loadPolicies(vars, c.Policies, failed)
	c.Named = named
	problems = append(problems, ps...)
	c.Warnings = unknownVariables(vars)
	c.Warnings = append(c.Warnings, c.PolicyConfig.ignoredSettings(vars, Prefix, c.Named)...)
	for _, n := range c.Named {
		c.Warnings = append(c.Warnings, n.PolicyConfig.ignoredSettings(vars, PolicyVariable(n.Name), nil)...)
	}
	if len(problems) > 0 {
		return c, &Error{Problems: problems}
	}
	return c, nil
}

// parseEnv fills target from environment as package env does, reading
// the variables of Prefix. Each field env could not parse goes to
// badField, each other problem it lists to badOther; an error it returns
// in place of that list is parseEnv's.
func parseEnv(target any, environment map[string]string, badField func(env.ParseError), badOther func(error)) error {
	err := env.ParseWithOptions(target, env.Options{Environment: environment, Prefix: Prefix})
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return err
	}
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) {
			badField(pe)
		} else {
			badOther(e)
		}
	}
	return nil
}

// fieldVariable maps the name of a field of T (Config, the default
// policy's fields included, or PolicyConfig) to its variable name (no
// prefix).
func fieldVariable[T any](field string) string {
	f, ok := reflect.TypeFor[T]().FieldByName(field)
	if !ok {
		return field
	}
	return f.Tag.Get("env")
}

func allowedForType(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[time.Duration]():
		return "a Go duration such as 500ms, 90s or 24h"
	case reflect.TypeFor[int]():
		return "a whole number"
	case reflect.TypeFor[float64]():
		return "a number"
	case reflect.TypeFor[byteSize]():
		return "a size: a whole number of bytes with an optional unit, B, KiB, MiB, GiB, KB, MB or GB, such as 64MiB"
	}
	return "a value of type " + t.String()
}

// validate checks values and combinations. It does not touch the network.
// failed holds the variables (full names) that did not parse: their zero
// values are not what the operator wrote, so no rule reports on them or
// judges another variable against them.
func (c Config) validate(failed map[string]bool) []fieldError {
	var ps []fieldError
	add := func(variable string, value any, allowed string) {
		if !failed[Prefix+variable] {
			ps = append(ps, fieldError{Variable: Prefix + variable, Value: fmt.Sprint(value), Allowed: allowed})
		}
	}
	oneOf := func(variable string, value string, allowed []string) {
		if !slices.Contains(allowed, value) {
			add(variable, value, "one of "+strings.Join(allowed, ", ")+suggestion(value, allowed))
		}
	}
	oneOf("QUEUE_TYPE", string(c.QueueType), []string{string(classic), string(quorum)})
	oneOf("DELAY_MODE", string(c.DelayMode), []string{string(delayQueues), string(DelayHold)})
	oneOf("LOG_LEVEL", c.LogLevel, []string{"debug", "info", "warn", "error"})
	oneOf("LOG_FORMAT", c.LogFormat, []string{"json", "console"})
	oneOf("EVENTS_FORMAT", c.EventsFormat, []string{"cloudevents", "schema1"})

	if allowed := c.checkBrokerURLs(); allowed != "" {
		if c.AMQPURLFile != "" {
			// Name the file, not its content: the content holds a password.
			add("AMQP_URL_FILE", c.AMQPURLFile, "a file holding "+allowed)
		} else {
			add("AMQP_URL", Redact(c.AMQPURL), allowed)
		}
	}
	if _, port, err := net.SplitHostPort(c.HTTPAddr); err != nil || port == "" {
		add("HTTP_ADDR", c.HTTPAddr, "host:port or :port to listen on, such as :9464")
	}
	if _, port, err := net.SplitHostPort(c.ConsoleAddr); err != nil || port == "" {
		add("CONSOLE_ADDR", c.ConsoleAddr, "host:port or :port to listen on, such as :9465")
	}
	if (c.ConsoleTLSCertFile == "") != (c.ConsoleTLSKeyFile == "") {
		add("CONSOLE_TLS_CERT_FILE", c.ConsoleTLSCertFile, "set together with REBOUND_CONSOLE_TLS_KEY_FILE (both or neither)")
	}
	if _, err := parseTrustedProxies(c.ConsoleTrustedProxies); err != nil {
		add("CONSOLE_TRUSTED_PROXIES", c.ConsoleTrustedProxies, "IP addresses or CIDR prefixes of the reverse proxies in front of the console, separated by commas, such as 10.0.0.0/8,192.0.2.10 ("+err.Error()+")")
	}
	if _, err := regexp.Compile(c.OriginQueues); err != nil {
		add("ORIGIN_QUEUES", c.OriginQueues, "a regular expression of the queues rebound may send messages back to, such as ^orders\\. ("+err.Error()+")")
	}
	if _, err := regexp.Compile(c.MetricsOrigins); err != nil {
		add("METRICS_ORIGINS", c.MetricsOrigins, "a regular expression of the origin queues counted under their own origin label, such as ^(orders|payments)\\. ("+err.Error()+")")
	}
	if c.MetricsOriginLimit < 0 || c.MetricsOriginLimit > maxMetricsOriginLimit {
		add("METRICS_ORIGIN_LIMIT", fmt.Sprint(c.MetricsOriginLimit), fmt.Sprintf("the most origin queues a replica counts under their own origin label, 0 to %d (0 leaves the label empty)", maxMetricsOriginLimit))
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		add("TLS_CERT_FILE", c.TLSCertFile, "set together with REBOUND_TLS_KEY_FILE (both or neither)")
	}

	for _, p := range c.PolicyConfig.validate(Prefix, failed) {
		ps = append(ps, p.fieldError)
	}
	if c.DelayDigits < 1 || c.DelayDigits > 3 {
		add("DELAY_DIGITS", c.DelayDigits, "1, 2 or 3 significant digits of milliseconds a delay keeps (fewer: fewer delay queues, coarser delays)")
	}
	if c.HoldSlice < time.Second || c.HoldSlice > 24*time.Hour {
		add("HOLD_SLICE", c.HoldSlice, "a duration from 1s to 24h: the longest a copy is held before a holder sees it again")
	}
	if c.Prefetch < 1 || c.Prefetch > 65535 {
		add("PREFETCH", c.Prefetch, "a whole number from 1 to 65535")
	}
	if c.InflightBytes < 1 {
		add("INFLIGHT_BYTES", c.InflightBytes, "a size above 0, such as 64MiB (a message larger than it still passes, alone)")
	}
	if c.DelayQueueIdle < 0 {
		add("DELAY_QUEUE_IDLE", c.DelayQueueIdle, "a duration of 0 or more (0 = never delete idle delay queues)")
	}
	if c.ConfirmTimeout <= 0 {
		add("CONFIRM_TIMEOUT", c.ConfirmTimeout, "a duration above 0")
	}
	if c.ShutdownGrace < 0 {
		add("SHUTDOWN_GRACE", c.ShutdownGrace, "a duration of 0 or more")
	}
	if c.ParkedRetention != 0 && c.ParkedRetention < time.Minute {
		add("PARKED_RETENTION", c.ParkedRetention, "unset or 0 (keep parked messages until an operator acts), or a duration of at least 1m, such as 336h")
	}
	for variable, name := range map[string]string{
		"INBOX_QUEUE": c.InboxQueue, "DEAD_LETTER_EXCHANGE": c.DeadLetterExchange,
		"DELAY_EXCHANGE": c.DelayExchange, "DELAY_QUEUE_PREFIX": c.DelayQueuePrefix,
		"PARKING_QUEUE": c.ParkingQueue,
	} {
		if name == "" || len(name) > 200 || strings.HasPrefix(name, "amq.") {
			add(variable, name, "a non-empty name of at most 200 bytes not starting with amq.")
		}
	}
	if e := c.EventsExchange; e != "" && (len(e) > 200 || strings.HasPrefix(e, "amq.") || e == c.DeadLetterExchange || strings.HasPrefix(e, c.DelayExchange+".")) {
		add("EVENTS_EXCHANGE", e, "empty (no events), or a name of at most 200 bytes not starting with amq. and not one of rebound's other exchanges")
	}
	// Each delay queue's exchange is DELAY_EXCHANGE + "." + milliseconds:
	// a dead-letter exchange named so would be bound to a delay queue.
	if ms, ok := strings.CutPrefix(c.DeadLetterExchange, c.DelayExchange+"."); ok && ms != "" && strings.Trim(ms, "0123456789") == "" {
		add("DEAD_LETTER_EXCHANGE", c.DeadLetterExchange, "a name other than REBOUND_DELAY_EXCHANGE + \".\" + digits, which names a delay queue's exchange")
	}
	hs := c.headerNames()
	seen := map[string]string{}
	// In a fixed order, so that of two variables naming the same header it
	// is always the later one that is reported.
	for _, h := range []struct{ variable, name string }{
		{"HEADER_RETRY_COUNT", hs.RetryCount}, {"HEADER_TASK_STARTED_AT", hs.TaskStartedAt},
		{"HEADER_LAST_DELAY", hs.LastDelay}, {"HEADER_ORIGIN_QUEUE", hs.OriginQueue},
		{"HEADER_NON_RETRYABLE", hs.NonRetryable}, {"HEADER_ERROR", hs.Error},
		{"HEADER_PARKED_REASON", hs.ParkedReason}, {"HEADER_PARKED_AT", hs.ParkedAt},
		{"HEADER_FIRST_DEATH_REASON", hs.FirstDeathReason}, {"HEADER_FIRST_DEATH_QUEUE", hs.FirstDeathQueue},
		{"HEADER_POLICY", hs.Policy}, {"HEADER_DUE_AT", hs.DueAt},
		{"HEADER_RETRY_AFTER", hs.RetryAfter}, {"HEADER_ERROR_RETRY", hs.ErrorRetry},
		{"HEADER_GROUP", hs.Group}, {"HEADER_REDIRECTED_FROM", hs.RedirectedFrom},
	} {
		variable, name := h.variable, h.name
		switch {
		case name == "" || len(name) > 128:
			add(variable, name, "a header name of 1 to 128 bytes")
		case headers.BrokerOwned(name):
			add(variable, name, "a header name RabbitMQ does not own")
		case seen[name] != "":
			add(variable, name, "a header name no other REBOUND_HEADER_* variable uses (REBOUND_"+seen[name]+" does)")
		}
		seen[name] = variable
	}
	// Map iteration above is unordered; keep reports stable for people and tests.
	slices.SortStableFunc(ps, func(a, b fieldError) int { return strings.Compare(a.Variable, b.Variable) })
	return ps
}

func names[T ~string](values []T) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = string(v)
	}
	return out
}

// headerNames returns the header names the configuration selects.
// The AMQP 1.0 annotations' names are fixed: a consumer's client writes
// them, and RabbitMQ keeps only annotations named x-opt-*.
func (c Config) headerNames() headers.Names {
	fixed := headers.DefaultNames()
	return headers.Names{
		RetryAfter:      c.HeaderRetryAfter,
		ErrorRetry:      c.HeaderErrorRetry,
		Group:           c.HeaderGroup,
		RedirectedFrom:  c.HeaderRedirectedFrom,
		OptError:        fixed.OptError,
		OptNonRetryable: fixed.OptNonRetryable,
		OptRetryAfter:   fixed.OptRetryAfter,

		RetryCount:    c.HeaderRetryCount,
		TaskStartedAt: c.HeaderTaskStartedAt,
		LastDelay:     c.HeaderLastDelay,
		OriginQueue:   c.HeaderOriginQueue,
		NonRetryable:  c.HeaderNonRetryable,
		Error:         c.HeaderError,
		ParkedReason:  c.HeaderParkedReason,
		ParkedAt:      c.HeaderParkedAt,

		FirstDeathReason: c.HeaderFirstDeathReason,
		FirstDeathQueue:  c.HeaderFirstDeathQueue,
		Policy:           c.HeaderPolicy,
		DueAt:            c.HeaderDueAt,
	}
}

// BrokerURLs lists the broker URLs in REBOUND_AMQP_URL: one, or several
// separated by commas (the nodes of a cluster). A comma inside a password
// must be written %2C.
func (c Config) BrokerURLs() []string {
	var urls []string
	for _, u := range strings.Split(c.AMQPURL, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	return urls
}

// Vhost is the virtual host the broker URLs name, "/" if they name none.
// Only for a Config that Load accepted.
func (c Config) Vhost() string {
	urls := c.BrokerURLs()
	if len(urls) == 0 {
		return "/" // a Config Load did not fill: Topology may still be asked of it
	}
	u, err := amqp.ParseURI(urls[0])
	if err != nil || u.Vhost == "" {
		return "/"
	}
	return u.Vhost
}

// maxMetricsOriginLimit bounds REBOUND_METRICS_ORIGIN_LIMIT: each origin
// is up to a series per reason and policy on every replica.
const maxMetricsOriginLimit = 2000

// MetricsOriginsRegexp returns REBOUND_METRICS_ORIGINS compiled, nil
// when unset (every origin).
func (c Config) MetricsOriginsRegexp() *regexp.Regexp {
	if c.MetricsOrigins == "" {
		return nil
	}
	re, err := regexp.Compile(c.MetricsOrigins)
	if err != nil {
		return nil // Load refused it
	}
	return re
}

// Topology returns the names of everything rebound declares on the
// broker, with the allowlist of origin queues (REBOUND_ORIGIN_QUEUES). Only
// for a Config that Load accepted.
func (c Config) Topology() topology.Topology {
	t := topology.Topology{
		Vhost:              c.Vhost(),
		InboxQueue:         c.InboxQueue,
		DeadLetterExchange: c.DeadLetterExchange,
		DelayExchange:      c.DelayExchange,
		DelayQueuePrefix:   c.DelayQueuePrefix,
		ParkingQueue:       c.ParkingQueue,
		Quorum:             c.QueueType == quorum,
		Hold:               c.DelayMode == DelayHold,
	}
	if c.OriginQueues != "" {
		t.OriginQueues = regexp.MustCompile(c.OriginQueues)
	}
	return t
}

// Router returns the rules of where a message goes that the
// configuration describes: the topology (with the allowlist), the
// policies and the header names. Only for a Config that Load accepted.
func (c Config) Router() route.Router {
	return route.Router{Topology: c.Topology(), Policies: c.PolicySet(), Codec: headers.NewCodec(c.headerNames())}
}

// defaultPolicy returns the default policy: REBOUND_BACKOFF and the rest, with
// REBOUND_DELAY_DIGITS.
func (c Config) defaultPolicy() policy.Policy {
	p := c.PolicyConfig.policy()
	p.DelayDigits = c.DelayDigits
	return p
}

// PolicySet returns the policies the configuration describes, chosen by
// origin queue: the named ones in order, then the default. Only for a
// Config that Load accepted.
func (c Config) PolicySet() policy.Set {
	named := make([]policy.Named, len(c.Named))
	for i, p := range c.Named {
		labels, _ := PolicyLabels(p.Labels) // Load checked them
		named[i] = policy.Named{Name: p.Name, Queues: regexp.MustCompile(p.Queues), Policy: p.policy(), Labels: labels}
		named[i].DelayDigits = c.DelayDigits
	}
	set := policy.NewSet(c.defaultPolicy(), named...)
	set.Default().Labels, _ = PolicyLabels(c.Labels)
	return set
}

// TLS builds the TLS configuration for amqps:// from the CA, certificate
// and key files, reading them now. nil means the library's defaults. A
// file that cannot be used is a configuration error (*Error): rebound
// exits with status 2 before connecting.
func (c Config) TLS() (*tls.Config, error) {
	if c.TLSCAFile == "" && c.TLSCertFile == "" {
		return nil, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.TLSCAFile != "" {
		pem, err := os.ReadFile(c.TLSCAFile)
		if err != nil {
			return nil, tlsError("TLS_CA_FILE", c.TLSCAFile, err.Error())
		}
		t.RootCAs = x509.NewCertPool()
		if !t.RootCAs.AppendCertsFromPEM(pem) {
			return nil, tlsError("TLS_CA_FILE", c.TLSCAFile, "no PEM certificate in the file")
		}
	}
	if c.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
		if err != nil {
			return nil, tlsError("TLS_CERT_FILE", c.TLSCertFile, "with REBOUND_TLS_KEY_FILE: "+err.Error())
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// ConsoleTLS loads the console's certificate and key, reading them now:
// nil when neither is set (the console serves plain HTTP). A pair that
// cannot be used is a configuration error (*Error), and so is plain HTTP
// where CheckConsoleListen refuses it.
func (c Config) ConsoleTLS() (*tls.Config, error) {
	if c.ConsoleTLSCertFile == "" {
		return nil, c.CheckConsoleListen()
	}
	cert, err := tls.LoadX509KeyPair(c.ConsoleTLSCertFile, c.ConsoleTLSKeyFile)
	if err != nil {
		return nil, tlsError("CONSOLE_TLS_CERT_FILE", c.ConsoleTLSCertFile, "with REBOUND_CONSOLE_TLS_KEY_FILE: "+err.Error())
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
}

// CheckConsoleListen refuses plain HTTP on an address other than
// loopback, unless TLS is configured or ConsoleBehindTLSProxy says a
// TLS-terminating proxy sits in front. It reads no file: manifests are
// checked with it.
func (c Config) CheckConsoleListen() error {
	if c.ConsoleSecure() || loopbackAddr(c.ConsoleAddr) {
		return nil
	}
	return &Error{Problems: []fieldError{{
		Variable: Prefix + "CONSOLE_ADDR", Value: c.ConsoleAddr,
		Allowed: "a loopback address such as 127.0.0.1:9465 when the console serves plain HTTP; " +
			"for any other, set REBOUND_CONSOLE_TLS_CERT_FILE and _KEY_FILE, or " +
			"REBOUND_CONSOLE_BEHIND_TLS_PROXY=true when a TLS-terminating proxy sits in front",
	}}}
}

// loopbackAddr reports whether host:port listens on loopback only:
// 127.0.0.0/8, ::1 or localhost. An empty host (":9465") is every
// interface.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// ConsoleSecure reports whether people reach the console over TLS, its
// own or a proxy's: its cookies are then marked Secure.
func (c Config) ConsoleSecure() bool {
	return c.ConsoleTLSCertFile != "" || c.ConsoleBehindTLSProxy
}

// ConsoleProxies are the reverse proxies whose X-Forwarded-For the
// console believes (REBOUND_CONSOLE_TRUSTED_PROXIES); none by default.
func (c Config) ConsoleProxies() []netip.Prefix {
	proxies, _ := parseTrustedProxies(c.ConsoleTrustedProxies) // checked by Load
	return proxies
}

// parseTrustedProxies reads IP addresses and CIDR prefixes, separated by
// commas ("" is none). A /0 prefix is refused: it would believe
// X-Forwarded-For from anyone, who could then choose the address a
// sign-in is throttled by.
func parseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, field := range strings.Split(s, ",") {
		field = strings.TrimSpace(field)
		if field == "" {
			continue
		}
		var p netip.Prefix
		if strings.Contains(field, "/") {
			var err error
			if p, err = netip.ParsePrefix(field); err != nil {
				return nil, fmt.Errorf("%q is not an IP address or CIDR prefix", field)
			}
		} else {
			a, err := netip.ParseAddr(field)
			if err != nil || a.Zone() != "" {
				return nil, fmt.Errorf("%q is not an IP address or CIDR prefix", field)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		if p.Bits() == 0 {
			return nil, fmt.Errorf("%q trusts every address: anyone could then choose the address they are throttled by", field)
		}
		out = append(out, netip.PrefixFrom(p.Addr().Unmap(), min(p.Bits(), p.Addr().Unmap().BitLen())).Masked())
	}
	return out, nil
}

func tlsError(variable, path, problem string) error {
	return &Error{Problems: []fieldError{{
		Variable: Prefix + variable, Value: path, Allowed: "a readable PEM file (" + problem + ")",
	}}}
}

// checkBrokerURLs returns what is allowed if REBOUND_AMQP_URL is not a
// list of amqp:// or amqps:// URLs that all name the same virtual host, or
// "" if it is. The nodes of one cluster share their virtual hosts; URLs
// naming different ones would move rebound's topology between sessions.
func (c Config) checkBrokerURLs() string {
	const allowed = "an amqp:// or amqps:// URL, or several separated by commas"
	urls := c.BrokerURLs()
	if len(urls) == 0 {
		return allowed
	}
	vhost := ""
	for i, raw := range urls {
		u, err := amqp.ParseURI(raw)
		if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") {
			if len(urls) > 1 {
				return fmt.Sprintf("%s (URL %d of %d is not)", allowed, i+1, len(urls))
			}
			return allowed
		}
		if i == 0 {
			vhost = u.Vhost
		} else if u.Vhost != vhost {
			return fmt.Sprintf("%s, all naming the same virtual host (URL %d names %q, URL 1 %q)", allowed, i+1, u.Vhost, vhost)
		}
	}
	return ""
}

// Redact returns the URL with any password replaced, for logs and errors;
// each URL of a comma-separated list is redacted on its own. A value that
// does not parse as a URL is hidden whole, and so is one with an @ that
// url.Parse did not read as the end of the user info (a missing "//", as
// in guest:secret@host, or a slash too many): the password may sit right
// before it.
func Redact(raw string) string {
	if strings.Contains(raw, ",") {
		parts := strings.Split(raw, ",")
		for i, p := range parts {
			parts[i] = redactOne(strings.TrimSpace(p))
		}
		return strings.Join(parts, ",")
	}
	return redactOne(raw)
}

func redactOne(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparseable URL>"
	}
	if u.User == nil && strings.Contains(raw, "@") {
		return "<URL hidden: it holds an @ outside the user info>"
	}
	return u.Redacted()
}
