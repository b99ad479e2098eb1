package config

import (
	"fmt"
	"maps"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/policy"
)

// PolicyConfig is the variables of one retry policy: REBOUND_<FIELD> for
// the default policy, REBOUND_POLICY_<NAME>_<FIELD> for a named one. Field
// tags name the variable without its prefix.
type PolicyConfig struct {
	Backoff          policy.Backoff  `env:"BACKOFF" envDefault:"exponential"`
	MinDelay         time.Duration   `env:"MIN_DELAY" envDefault:"1s"`
	MaxDelay         time.Duration   `env:"MAX_DELAY" envDefault:"1h"`
	Multiplier       float64         `env:"MULTIPLIER" envDefault:"2"`
	Jitter           policy.Jitter   `env:"JITTER" envDefault:"full"`
	JitterFactor     float64         `env:"JITTER_FACTOR" envDefault:"0.5"`
	JitterMax        time.Duration   `env:"JITTER_MAX" envDefault:"1s"`
	ImmediateRetries int             `env:"IMMEDIATE_RETRIES" envDefault:"0"`
	MaxRetries       int             `env:"MAX_RETRIES" envDefault:"10"`
	MaxDuration      time.Duration   `env:"MAX_DURATION" envDefault:"24h"`
	Deadline         policy.Deadline `env:"DEADLINE" envDefault:"clamp"`
	RetryRate        float64         `env:"RETRY_RATE" envDefault:"0"`
}

// policy returns the retry policy pc describes.
func (pc PolicyConfig) policy() policy.Policy {
	return policy.Policy{
		Backoff:          pc.Backoff,
		MinDelay:         pc.MinDelay,
		MaxDelay:         pc.MaxDelay,
		Multiplier:       pc.Multiplier,
		Jitter:           pc.Jitter,
		JitterFactor:     pc.JitterFactor,
		JitterMax:        pc.JitterMax,
		ImmediateRetries: pc.ImmediateRetries,
		MaxRetries:       pc.MaxRetries,
		MaxDuration:      pc.MaxDuration,
		Deadline:         pc.Deadline,
		RetryRate:        pc.RetryRate,
	}
}

// namedPolicy is one policy of REBOUND_POLICIES.
type namedPolicy struct {
	Name string
	// Queues is REBOUND_POLICY_<NAME>_QUEUES: a regular expression of the
	// origin queues the policy serves, unanchored.
	Queues string
	// Labels is REBOUND_POLICY_<NAME>_LABELS, the policy's routing labels
	// (see PolicyLabels); not inherited from the default policy, whose
	// team is not the named policy's.
	Labels string
	PolicyConfig
}

// maxRetryRate is the highest REBOUND_RETRY_RATE accepted: far above what
// a dependency that needs protecting answers, low enough that a typo
// (an extra digit or three) is caught.
const maxRetryRate = 100_000

// policyFields lists the variables of a policy, without prefix, in the
// order they are declared.
func policyFields() []string {
	t := reflect.TypeFor[PolicyConfig]()
	out := make([]string, t.NumField())
	for i := range out {
		out[i] = t.Field(i).Tag.Get("env")
	}
	return out
}

// PolicyVariable is the prefix of a named policy's variables:
// REBOUND_POLICY_PAYMENTS_ for payments, REBOUND_POLICY_E_MAIL_ for e-mail.
func PolicyVariable(name string) string {
	return Prefix + "POLICY_" + strings.ReplaceAll(strings.ToUpper(name), "-", "_") + "_"
}

var policyName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,39}$`)

// loadPolicies reads REBOUND_POLICIES and every REBOUND_POLICY_* variable
// of vars. def is the default policy as parsed, defFailed its variables
// that did not parse. It returns the named policies in order, and every
// problem, each naming the variable, the value and what is allowed. A
// field a named policy leaves unset inherits the default policy's value,
// and a problem only inherited is the default policy's, reported once.
func loadPolicies(vars map[string]string, listed string, failed map[string]bool) ([]namedPolicy, []fieldError) {
	var problems []fieldError
	add := func(variable, value, allowed string) {
		problems = append(problems, fieldError{Variable: variable, Value: value, Allowed: allowed})
	}
	var named []namedPolicy
	seen := map[string]bool{}
	for _, name := range strings.Split(listed, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "" && strings.TrimSpace(listed) == "":
			continue
		case name == policy.DefaultName:
			add(Prefix+"POLICIES", listed, "names other than default, which is the policy of REBOUND_BACKOFF, REBOUND_MIN_DELAY and the rest, for every origin no named policy selects")
			continue
		case !policyName.MatchString(name):
			add(Prefix+"POLICIES", listed, fmt.Sprintf("comma-separated policy names of 1 to 40 lowercase letters, digits and '-', starting with a letter or digit (%q is not)", name))
			continue
		case seen[name]:
			add(Prefix+"POLICIES", listed, fmt.Sprintf("each name once (%s is listed twice)", name))
			continue
		}
		seen[name] = true
		p, ps := loadPolicy(vars, name, failed)
		problems = append(problems, ps...)
		named = append(named, p)
	}
	problems = append(problems, strayPolicyVariables(vars, named)...)
	return named, problems
}

// loadPolicy reads the variables of the policy name: its QUEUES, and each
// field, inherited from the default policy when unset.
func loadPolicy(vars map[string]string, name string, defFailed map[string]bool) (namedPolicy, []fieldError) {
	prefix := PolicyVariable(name)
	p := namedPolicy{Name: name, Queues: vars[prefix+"QUEUES"], Labels: vars[prefix+"LABELS"]}
	var problems []fieldError
	if _, err := PolicyLabels(p.Labels); err != nil {
		problems = append(problems, fieldError{Variable: prefix + "LABELS", Value: p.Labels, Allowed: err.Error()})
	}
	switch queues, set := vars[prefix+"QUEUES"]; {
	case !set || strings.TrimSpace(queues) == "":
		problems = append(problems, fieldError{Variable: prefix + "QUEUES", Value: queues,
			Allowed: "a regular expression of the origin queues policy " + name + " serves, such as ^" + name + `\. (required for every name in REBOUND_POLICIES)`})
	default:
		if _, err := regexp.Compile(queues); err != nil {
			problems = append(problems, fieldError{Variable: prefix + "QUEUES", Value: queues,
				Allowed: "a regular expression (Go's RE2 syntax) of the origin queues policy " + name + " serves (" + err.Error() + ")"})
		}
	}
	// The policy's environment: the default policy's variables, each
	// replaced by the policy's own where it sets one.
	merged := map[string]string{}
	own := map[string]bool{}
	for _, field := range policyFields() {
		if v, ok := vars[prefix+field]; ok {
			merged[Prefix+field] = v
			own[field] = true
		} else if v, ok := vars[Prefix+field]; ok {
			merged[Prefix+field] = v
		}
	}
	failed := map[string]bool{}
	badOther := func(e error) {
		problems = append(problems, fieldError{Variable: prefix + "*", Allowed: e.Error()})
	}
	err := parseEnv(&p.PolicyConfig, merged, func(pe env.ParseError) {
		field := fieldVariable[PolicyConfig](pe.Name)
		failed[prefix+field] = true
		if own[field] {
			problems = append(problems, fieldError{Variable: prefix + field, Value: vars[prefix+field], Allowed: allowedForType(pe.Type)})
		}
	}, badOther)
	if err != nil {
		badOther(err)
	}
	for field := range defFailed {
		if f, ok := strings.CutPrefix(field, Prefix); ok && !own[f] {
			failed[prefix+f] = true // the default's problem, reported there
		}
	}
	// A problem is this policy's when one of the variables it involves is
	// the policy's own; one in inherited values alone is the default
	// policy's, reported for it.
	for _, fe := range p.validate(prefix, failed) {
		if slices.ContainsFunc(fe.involves, func(field string) bool { return own[field] }) {
			problems = append(problems, fe.fieldError)
		}
	}
	return p, problems
}

// strayPolicyVariables reports the REBOUND_POLICY_* variables no listed
// policy reads: a name missing from REBOUND_POLICIES, or a field that does
// not exist. Either is usually a typo, and ignoring it would apply a
// policy other than the one meant.
func strayPolicyVariables(vars map[string]string, named []namedPolicy) []fieldError {
	known := map[string]bool{}
	for _, p := range named {
		prefix := PolicyVariable(p.Name)
		known[prefix+"QUEUES"] = true
		known[prefix+"LABELS"] = true
		for _, f := range policyFields() {
			known[prefix+f] = true
		}
	}
	fields := append([]string{"QUEUES", "LABELS"}, policyFields()...)
	var problems []fieldError
	for _, variable := range slices.Sorted(maps.Keys(vars)) {
		rest, ok := strings.CutPrefix(variable, Prefix+"POLICY_")
		if !ok || known[variable] {
			continue
		}
		allowed := "a variable of a policy listed in REBOUND_POLICIES"
		for _, p := range named {
			if field, ok := strings.CutPrefix(variable, PolicyVariable(p.Name)); ok {
				allowed = fmt.Sprintf("REBOUND_POLICY_<NAME>_ and one of %s", strings.Join(fields, ", "))
				if near := nearest(field, fields); near != "" {
					allowed += fmt.Sprintf(" (did you mean %s%s?)", PolicyVariable(p.Name), near)
				}
				break
			}
		}
		if strings.HasPrefix(allowed, "a variable of a policy") {
			name := rest
			for _, f := range fields {
				if n, ok := strings.CutSuffix(rest, "_"+f); ok {
					name = n
					break
				}
			}
			allowed += fmt.Sprintf(" (no policy %q is listed: REBOUND_POLICIES names the policies, as lowercase names with '-' for '_')",
				strings.ReplaceAll(strings.ToLower(name), "_", "-"))
		}
		problems = append(problems, fieldError{Variable: variable, Value: vars[variable], Allowed: allowed})
	}
	return problems
}

// policyProblem is a problem with a policy's values, with the fields it
// involves: a named policy reports it only when one of them is its own.
type policyProblem struct {
	fieldError
	involves []string
}

// validate checks the policy's values and combinations; prefix names its
// variables (REBOUND_ or REBOUND_POLICY_<NAME>_). failed holds the
// variables (full names) that did not parse: no rule reports on them or
// judges another variable against them.
func (pc PolicyConfig) validate(prefix string, failed map[string]bool) []policyProblem {
	var ps []policyProblem
	add := func(field string, value any, allowed string, others ...string) {
		if !failed[prefix+field] {
			ps = append(ps, policyProblem{fieldError{Variable: prefix + field, Value: fmt.Sprint(value), Allowed: allowed}, append(others, field)})
		}
	}
	parsed := func(fields ...string) bool {
		for _, f := range fields {
			if failed[prefix+f] {
				return false
			}
		}
		return true
	}
	oneOf := func(field string, value string, allowed []string) {
		if !slices.Contains(allowed, value) {
			add(field, value, "one of "+strings.Join(allowed, ", ")+suggestion(value, allowed))
		}
	}
	oneOf("BACKOFF", string(pc.Backoff), names(policy.Backoffs))
	oneOf("JITTER", string(pc.Jitter), names(policy.Jitters))
	oneOf("DEADLINE", string(pc.Deadline), names(policy.Deadlines))

	// Delay queues count whole milliseconds (x-message-ttl): a shorter
	// delay would be queued as 0 or 1ms, not as configured.
	if pc.MinDelay < time.Millisecond {
		add("MIN_DELAY", pc.MinDelay, "a duration of at least 1ms")
	}
	if pc.MaxDelay < time.Millisecond || pc.MaxDelay > headers.MaxLastDelay {
		add("MAX_DELAY", pc.MaxDelay, fmt.Sprintf("a duration from 1ms to %s (what the last-delay header carries)", headers.MaxLastDelay))
	}
	if pc.MinDelay >= time.Millisecond && pc.MaxDelay >= time.Millisecond && pc.MinDelay > pc.MaxDelay && parsed("MAX_DELAY") {
		add("MIN_DELAY", pc.MinDelay, fmt.Sprintf("at most %sMAX_DELAY (%s)", prefix, pc.MaxDelay), "MAX_DELAY")
	}
	if pc.Backoff == policy.Exponential && !(pc.Multiplier > 1 && !math.IsInf(pc.Multiplier, 1)) {
		add("MULTIPLIER", pc.Multiplier, "a finite number above 1", "BACKOFF")
	}
	if (pc.Jitter == policy.ProportionalJitter || pc.Jitter == policy.GaussianJitter) && !(pc.JitterFactor >= 0 && pc.JitterFactor <= 1) {
		add("JITTER_FACTOR", pc.JitterFactor, fmt.Sprintf("a number from 0 to 1 with %s jitter", pc.Jitter), "JITTER")
	}
	if pc.JitterMax < 0 {
		add("JITTER_MAX", pc.JitterMax, "a duration of 0 or more")
	}
	if pc.ImmediateRetries < 0 {
		add("IMMEDIATE_RETRIES", pc.ImmediateRetries, "a whole number of 0 or more")
	}
	if pc.MaxRetries < 0 || pc.MaxRetries > headers.MaxRetryCount {
		add("MAX_RETRIES", pc.MaxRetries, fmt.Sprintf("a whole number from 0 (no limit by count) to %d (the largest count the header carries)", headers.MaxRetryCount))
	}
	if pc.MaxDuration < 0 {
		add("MAX_DURATION", pc.MaxDuration, "a duration of 0 or more (0 = no budget)")
	}
	if pc.MaxRetries == 0 && pc.MaxDuration == 0 && parsed("MAX_DURATION") {
		add("MAX_RETRIES", pc.MaxRetries, fmt.Sprintf("above 0 when %sMAX_DURATION is 0: one limit is needed or retrying never ends", prefix), "MAX_DURATION")
	}
	// A fitted curve runs from MIN_DELAY at the first delayed retry to
	// MAX_DELAY at the last: it needs two delayed retries to fit.
	if pc.Backoff.Fitted() && pc.MaxRetries >= 0 && pc.ImmediateRetries >= 0 && pc.MaxRetries-pc.ImmediateRetries < 2 && parsed("IMMEDIATE_RETRIES") {
		add("MAX_RETRIES", pc.MaxRetries, fmt.Sprintf(
			"at least %[1]sIMMEDIATE_RETRIES (%[2]d) + 2 with %[1]sBACKOFF=%[3]s: the curve is fitted over the delayed retries, %[1]sMAX_RETRIES - %[1]sIMMEDIATE_RETRIES",
			prefix, pc.ImmediateRetries, pc.Backoff), "IMMEDIATE_RETRIES", "BACKOFF")
	}
	if !(pc.RetryRate >= 0 && pc.RetryRate <= maxRetryRate) {
		add("RETRY_RATE", pc.RetryRate, fmt.Sprintf("copies per second to one origin queue, from 0 (no cap) to %d", maxRetryRate))
	}
	return ps
}

// ignoredSettings names the variables of a policy (prefix: REBOUND_ or
// REBOUND_POLICY_<NAME>_) set in vars that its backoff or jitter does not
// read: MULTIPLIER beside a linear backoff shapes nothing, and its author
// surely meant it to. For the default policy, inheritors are the named
// policies, which inherit a field they do not set: a default MULTIPLIER
// an exponential named policy reads is not ignored.
func (pc PolicyConfig) ignoredSettings(vars map[string]string, prefix string, inheritors []namedPolicy) []string {
	reads := map[string]func(PolicyConfig) bool{
		"MULTIPLIER": func(p PolicyConfig) bool { return p.Backoff == policy.Exponential },
		"JITTER_FACTOR": func(p PolicyConfig) bool {
			return p.Jitter == policy.ProportionalJitter || p.Jitter == policy.GaussianJitter
		},
		"JITTER_MAX": func(p PolicyConfig) bool { return p.Jitter == "additive" },
	}
	var out []string
	ignored := func(field, readBy, chosen string) {
		if _, set := vars[prefix+field]; !set || reads[field](pc) {
			return
		}
		for _, n := range inheritors {
			if _, own := vars[PolicyVariable(n.Name)+field]; !own && reads[field](n.PolicyConfig) {
				return
			}
		}
		out = append(out, fmt.Sprintf("%s%s is set but %s; %s does not read it", prefix, field, readBy, chosen))
	}
	ignored("MULTIPLIER", "only BACKOFF=exponential reads it", "BACKOFF="+string(pc.Backoff))
	ignored("JITTER_FACTOR", "only JITTER=proportional and gaussian read it", "JITTER="+string(pc.Jitter))
	ignored("JITTER_MAX", "only JITTER=additive reads it", "JITTER="+string(pc.Jitter))
	return out
}

// Routing labels: a policy's owners, in Prometheus's terms, so that an
// alert about the policy's origins reaches its team without a rule per
// service. They are label names on rebound_policy_info, so they follow
// Prometheus's syntax, and not those the alerts already group by.
var (
	policyLabelName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]{0,62}$`)
	reservedLabels  = []string{"policy", "vhost", "origin", "reason", "kind", "queue", "instance", "job", "namespace", "pod", "container", "severity", "alertname"}
)

// maxPolicyLabels is the most routing labels a policy carries; every name
// any policy uses is a label of rebound_policy_info.
const maxPolicyLabels = 8

// PolicyLabels parses a policy's routing labels, "team=payments,owner=alice"
// ("" for none), into a map; the error says what is allowed.
func PolicyLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return labels, nil
	}
	for _, pair := range strings.Split(s, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(pair), "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		switch {
		case !ok || value == "":
			return nil, fmt.Errorf("routing labels as key=value pairs separated by commas, such as team=payments,owner=alice (%q has no value)", pair)
		case !policyLabelName.MatchString(key) || strings.HasPrefix(key, "__"):
			return nil, fmt.Errorf("label names of letters, digits and '_', not starting with a digit or '__' (%q is not)", key)
		case slices.Contains(reservedLabels, key):
			return nil, fmt.Errorf("label names other than %s, which rebound's series and alerts already carry (%q is one)", strings.Join(reservedLabels, ", "), key)
		case len(value) > 128:
			return nil, fmt.Errorf("values of at most 128 characters (%s's has %d)", key, len(value))
		case labels[key] != "":
			return nil, fmt.Errorf("each label once (%s is set twice)", key)
		}
		labels[key] = value
	}
	if len(labels) > maxPolicyLabels {
		return nil, fmt.Errorf("at most %d routing labels a policy (%d given)", maxPolicyLabels, len(labels))
	}
	return labels, nil
}
