package config

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/policy"
)

// TestNamedPolicies: each listed policy reads its own variables, leaves
// the others to the default policy, and the set chooses by origin queue,
// the first listed match winning.
func TestNamedPolicies(t *testing.T) {
	c, err := Load([]string{
		"REBOUND_MAX_RETRIES=5", "REBOUND_MIN_DELAY=2s",
		"REBOUND_POLICIES=payments, e-mail,catch-all",
		`REBOUND_POLICY_PAYMENTS_QUEUES=^payments\.`, "REBOUND_POLICY_PAYMENTS_MAX_RETRIES=20", "REBOUND_POLICY_PAYMENTS_RETRY_RATE=40",
		`REBOUND_POLICY_E_MAIL_QUEUES=^mail\.`, "REBOUND_POLICY_E_MAIL_BACKOFF=constant", "REBOUND_POLICY_E_MAIL_MAX_DURATION=48h",
		`REBOUND_POLICY_CATCH_ALL_QUEUES=\.`, "REBOUND_POLICY_CATCH_ALL_JITTER=none",
	})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := []string{c.Named[0].Name, c.Named[1].Name, c.Named[2].Name}; !slices.Equal(got, []string{"payments", "e-mail", "catch-all"}) {
		t.Fatalf("named policies %v, want payments, e-mail, catch-all in that order", got)
	}
	set := c.PolicySet()
	def := c.defaultPolicy()
	for _, tc := range []struct {
		origin string
		name   string
		want   func(p policy.Policy) policy.Policy // the default policy, changed as the named one overrides it
	}{
		{"payments.capture", "payments", func(p policy.Policy) policy.Policy { p.MaxRetries, p.RetryRate = 20, 40; return p }},
		{"mail.send", "e-mail", func(p policy.Policy) policy.Policy {
			p.Backoff, p.MaxDuration = policy.Constant, 48*time.Hour
			return p
		}},
		{"orders.created", "catch-all", func(p policy.Policy) policy.Policy { p.Jitter = policy.NoJitter; return p }},
		{"orders", "default", func(p policy.Policy) policy.Policy { return p }},
		{"", "default", func(p policy.Policy) policy.Policy { return p }},
	} {
		got := set.For(tc.origin)
		if got.Name != tc.name || got.Policy != tc.want(def) {
			t.Errorf("origin %q: policy %s %+v, want %s %+v", tc.origin, got.Name, got.Policy, tc.name, tc.want(def))
		}
	}
	if def.MaxRetries != 5 || def.MinDelay != 2*time.Second || set.For("payments.capture").MinDelay != 2*time.Second || def.DelayDigits != 2 {
		t.Errorf("default %+v: want max retries 5, min delay 2s, inherited by payments", def)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings %v, want none", c.Warnings)
	}
}

// TestNamedPolicyProblems: every problem of the policy variables is
// refused at once, naming the variable, its value and what is allowed.
// One inherited from the default policy is reported once, for the
// default's variable.
func TestNamedPolicyProblems(t *testing.T) {
	for _, tc := range []struct {
		name     string
		environ  []string
		problems []string // "VARIABLE: part of what is allowed", in the order reported
	}{
		{"a name listed twice", []string{"REBOUND_POLICIES=a,a", "REBOUND_POLICY_A_QUEUES=x"},
			[]string{"REBOUND_POLICIES: each name once (a is listed twice)"}},
		{"an invalid name", []string{"REBOUND_POLICIES=Payments", "REBOUND_POLICY_PAYMENTS_QUEUES=x"},
			[]string{`REBOUND_POLICIES: lowercase letters, digits and '-'`, "REBOUND_POLICY_PAYMENTS_QUEUES: a variable of a policy listed"}},
		{"default listed", []string{"REBOUND_POLICIES=default"}, []string{"REBOUND_POLICIES: names other than default"}},
		{"labels without a value", []string{"REBOUND_POLICIES=a", "REBOUND_POLICY_A_QUEUES=x", "REBOUND_POLICY_A_LABELS=team"},
			[]string{`REBOUND_POLICY_A_LABELS: routing labels as key=value pairs`}},
		{"a label the alerts already carry", []string{"REBOUND_POLICIES=a", "REBOUND_POLICY_A_QUEUES=x", "REBOUND_POLICY_A_LABELS=team=x,origin=y"},
			[]string{`REBOUND_POLICY_A_LABELS: label names other than policy`}},
		{"the default's labels", []string{"REBOUND_LABELS=team-name=x"}, []string{`REBOUND_LABELS: label names of letters, digits and '_'`}},
		{"queues missing", []string{"REBOUND_POLICIES=a"}, []string{"REBOUND_POLICY_A_QUEUES: a regular expression of the origin queues policy a serves"}},
		{"queues that do not compile", []string{"REBOUND_POLICIES=a", "REBOUND_POLICY_A_QUEUES=^(a"},
			[]string{"REBOUND_POLICY_A_QUEUES: a regular expression (Go's RE2 syntax)"}},
		{"PCRE lookahead", []string{"REBOUND_POLICIES=a", "REBOUND_POLICY_A_QUEUES=^(?!tmp)"},
			[]string{"REBOUND_POLICY_A_QUEUES: a regular expression (Go's RE2 syntax)"}},
		{"a field that does not parse", []string{"REBOUND_POLICIES=a", "REBOUND_POLICY_A_QUEUES=x", "REBOUND_POLICY_A_MAX_DELAY=soon"},
			[]string{"REBOUND_POLICY_A_MAX_DELAY: a Go duration"}},
		{"a field out of range", []string{"REBOUND_POLICIES=a", "REBOUND_POLICY_A_QUEUES=x", "REBOUND_POLICY_A_JITTER=sometimes"},
			[]string{"REBOUND_POLICY_A_JITTER: one of none, full"}},
		{"a combination with an inherited value", []string{"REBOUND_MAX_RETRIES=0", "REBOUND_POLICIES=a", "REBOUND_POLICY_A_QUEUES=x", "REBOUND_POLICY_A_MAX_DURATION=0"},
			[]string{"REBOUND_POLICY_A_MAX_RETRIES: above 0 when REBOUND_POLICY_A_MAX_DURATION is 0"}},
		{"an inherited problem is the default's", []string{"REBOUND_MIN_DELAY=0s", "REBOUND_POLICIES=a,b", "REBOUND_POLICY_A_QUEUES=x", "REBOUND_POLICY_B_QUEUES=y"},
			[]string{"REBOUND_MIN_DELAY: a duration of at least 1ms"}},
		{"an inherited value that does not parse is the default's", []string{"REBOUND_MAX_DELAY=soon", "REBOUND_POLICIES=a", "REBOUND_POLICY_A_QUEUES=x"},
			[]string{"REBOUND_MAX_DELAY: a Go duration"}},
		{"an overridden value fixes an inherited problem", []string{"REBOUND_MIN_DELAY=0s", "REBOUND_POLICIES=a", "REBOUND_POLICY_A_QUEUES=x", "REBOUND_POLICY_A_MIN_DELAY=1s"},
			[]string{"REBOUND_MIN_DELAY: a duration of at least 1ms"}},
		{"a rate that is negative", []string{"REBOUND_POLICIES=a", "REBOUND_POLICY_A_QUEUES=x", "REBOUND_POLICY_A_RETRY_RATE=-1"},
			[]string{"REBOUND_POLICY_A_RETRY_RATE: copies per second to one origin queue, from 0 (no cap) to 100000"}},
		{"a variable of a name not listed", []string{"REBOUND_POLICIES=payments", "REBOUND_POLICY_PAYMENTS_QUEUES=x", "REBOUND_POLICY_PAYMENT_MAX_RETRIES=3"},
			[]string{`REBOUND_POLICY_PAYMENT_MAX_RETRIES: a variable of a policy listed in REBOUND_POLICIES (no policy "payment" is listed`}},
		{"a variable without REBOUND_POLICIES", []string{"REBOUND_POLICY_ORDERS_MAX_RETRIES=3"},
			[]string{`REBOUND_POLICY_ORDERS_MAX_RETRIES: a variable of a policy listed in REBOUND_POLICIES (no policy "orders" is listed`}},
		{"a field that does not exist", []string{"REBOUND_POLICIES=a", "REBOUND_POLICY_A_QUEUES=x", "REBOUND_POLICY_A_MAX_RETRY=3"},
			[]string{"REBOUND_POLICY_A_MAX_RETRY: REBOUND_POLICY_<NAME>_ and one of QUEUES, LABELS, BACKOFF"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.environ)
			var cerr *Error
			if !errors.As(err, &cerr) {
				t.Fatalf("Load = %v, want a configuration error", err)
			}
			var got []string
			for _, p := range cerr.Problems {
				got = append(got, p.Variable+": "+p.Allowed)
			}
			if len(got) != len(tc.problems) {
				t.Fatalf("problems:\n  %s\nwant %d:\n  %s", strings.Join(got, "\n  "), len(tc.problems), strings.Join(tc.problems, "\n  "))
			}
			for i, want := range tc.problems {
				variable, allowed, _ := strings.Cut(want, ": ")
				if cerr.Problems[i].Variable != variable || !strings.Contains(cerr.Problems[i].Allowed, allowed) {
					t.Errorf("problem %d: %s, want %s", i, got[i], want)
				}
			}
		})
	}
}

// TestNamedPolicyFieldNamesMisspeltAreSuggested: the nearest field is
// named.
func TestNamedPolicyFieldNamesMisspeltAreSuggested(t *testing.T) {
	_, err := Load([]string{"REBOUND_POLICIES=a", "REBOUND_POLICY_A_QUEUES=x", "REBOUND_POLICY_A_MAX_RETRY=3"})
	if err == nil || !strings.Contains(err.Error(), "did you mean REBOUND_POLICY_A_MAX_RETRIES?") {
		t.Errorf("Load = %v, want the nearest field named", err)
	}
}

// TestUnknownVariablesWarn: a REBOUND_ variable rebound does not read is
// a warning naming the nearest one it does; Kubernetes' service variables
// for a Service named rebound are not.
func TestUnknownVariablesWarn(t *testing.T) {
	c, err := Load([]string{
		"REBOUND_MAX_RETRY=3", "REBOUND_PREFECTH=10", "REBOUND_SOMETHING_ELSE_ENTIRELY=1",
		"REBOUND_SERVICE_HOST=10.0.0.1", "REBOUND_SERVICE_PORT=9464", "REBOUND_PORT=tcp://10.0.0.1:9464",
		"REBOUND_PORT_9464_TCP=tcp://10.0.0.1:9464", "REBOUND_PORT_9464_TCP_ADDR=10.0.0.1",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"REBOUND_MAX_RETRY is not a variable rebound reads; did you mean REBOUND_MAX_RETRIES?",
		"REBOUND_PREFECTH is not a variable rebound reads; did you mean REBOUND_PREFETCH?",
		"REBOUND_SOMETHING_ELSE_ENTIRELY is not a variable rebound reads",
	}
	if !slices.Equal(c.Warnings, want) {
		t.Errorf("warnings:\n  %s\nwant:\n  %s", strings.Join(c.Warnings, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"a", "", 1}, {"", "abc", 3}, {"MAX_RETRY", "MAX_RETRIES", 3}, {"PREFECTH", "PREFETCH", 2},
		{"kitten", "sitting", 3}, {"same", "same", 0},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := editDistance(tc.b, tc.a); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d (symmetry)", tc.b, tc.a, got, tc.want)
		}
	}
}

// FuzzPolicyVariables: whatever REBOUND_POLICIES and REBOUND_POLICY_*
// hold, Load answers without panicking; what it accepts is a policy set
// whose every named policy has a name, queues that compile and a
// fingerprint, and that chooses a policy for any origin.
func FuzzPolicyVariables(f *testing.F) {
	f.Add("payments,e-mail", "PAYMENTS_QUEUES", `^payments\.`, "E_MAIL_MAX_RETRIES", "20", "payments.x")
	f.Add("a", "A_QUEUES", "(", "A_BACKOFF", "linear", "")
	f.Add("a,a", "A_QUEUES", ".", "B_QUEUES", ".", "b")
	f.Add("", "X_QUEUES", ".", "X_RETRY_RATE", "NaN", "x")
	f.Fuzz(func(t *testing.T, listed, var1, value1, var2, value2, origin string) {
		environ := []string{
			"REBOUND_POLICIES=" + listed,
			"REBOUND_POLICY_" + var1 + "=" + value1,
			"REBOUND_POLICY_" + var2 + "=" + value2,
		}
		c, err := Load(environ)
		if err != nil {
			var cerr *Error
			if !errors.As(err, &cerr) || len(cerr.Problems) == 0 {
				t.Fatalf("Load error %v is not a list of problems", err)
			}
			return
		}
		set := c.PolicySet()
		for _, n := range set.All() {
			if n.Name == "" || len(n.Fingerprint) != 8 {
				t.Fatalf("policy %+v: a name and an 8-digit fingerprint expected", n)
			}
		}
		if chosen := set.For(origin); chosen == nil {
			t.Fatalf("no policy for origin %q", origin)
		}
	})
}

func TestByteSize(t *testing.T) {
	for _, tc := range []struct {
		text string
		want byteSize
		ok   bool
	}{
		{"64MiB", 64 << 20, true}, {"64 MiB", 64 << 20, true}, {"1048576", 1 << 20, true}, {"512KiB", 512 << 10, true},
		{"2GiB", 2 << 30, true}, {"10KB", 10_000, true}, {"3MB", 3_000_000, true}, {"1GB", 1e9, true}, {"700B", 700, true},
		{"", 0, false}, {"MiB", 0, false}, {"1.5MiB", 0, false}, {"5TB", 0, false}, {"9999999999GiB", 0, false}, {"lots", 0, false},
	} {
		var b byteSize
		err := b.UnmarshalText([]byte(tc.text))
		if (err == nil) != tc.ok || (tc.ok && b != tc.want) {
			t.Errorf("%q: %v, %v; want %v (ok %v)", tc.text, b, err, tc.want, tc.ok)
		}
	}
	for b, want := range map[byteSize]string{64 << 20: "64MiB", 1 << 30: "1GiB", 1536: "1536B" /* not a whole KiB */, 2048: "2KiB", 0: "0B", -5 << 20: "-5MiB"} {
		if got := b.String(); got != want {
			t.Errorf("byteSize(%d).String() = %s, want %s", int64(b), got, want)
		}
	}
}

func TestPolicyLabels(t *testing.T) {
	c, err := Load([]string{"REBOUND_LABELS=team=platform", "REBOUND_POLICIES=payments,orders",
		"REBOUND_POLICY_PAYMENTS_QUEUES=^payments\\.", "REBOUND_POLICY_PAYMENTS_LABELS= team=payments , owner=alice",
		"REBOUND_POLICY_ORDERS_QUEUES=^orders\\."})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]string{
		"payments": {"team": "payments", "owner": "alice"},
		"orders":   {}, // not inherited: the default's team is not the named policy's
		"default":  {"team": "platform"},
	}
	for _, p := range c.PolicySet().All() {
		if !maps.Equal(p.Labels, want[p.Name]) {
			t.Errorf("policy %s labels %v, want %v", p.Name, p.Labels, want[p.Name])
		}
	}
	for _, bad := range []string{"a=1,a=2", "_ok=1,9x=2", "__name__=x", "x=" + strings.Repeat("v", 129),
		"a=1,b=1,c=1,d=1,e=1,f=1,g=1,h=1,i=1", "=x"} {
		if _, err := PolicyLabels(bad); err == nil {
			t.Errorf("PolicyLabels(%q) accepted", bad)
		}
	}
}
