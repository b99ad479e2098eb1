package policy

import (
	"regexp"
	"testing"
	"time"
)

// defaultPolicy is DESIGN.md's default policy.
var defaultPolicy = Policy{
	Backoff: Exponential, MinDelay: time.Second, MaxDelay: time.Hour, Multiplier: 2, Jitter: fullJitter,
	JitterFactor: 0.5, JitterMax: time.Second, MaxRetries: 10, MaxDuration: 24 * time.Hour, Deadline: clamp,
}

// defaultWith is defaultPolicy as change leaves it.
func defaultWith(change func(*Policy)) Policy {
	p := defaultPolicy
	change(&p)
	return p
}

// TestFingerprintIsStable: fingerprints are public interface (every copy
// carries one, and replicas of different versions compare them), so
// these values may never change.
func TestFingerprintIsStable(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Policy
		want string
	}{
		{"the default policy", defaultPolicy, "75dc41b8"},
		{"a retry rate", defaultWith(func(p *Policy) { p.RetryRate = 40 }), "d5149883"},
		{"more retries", defaultWith(func(p *Policy) { p.MaxRetries = 20 }), "ad8d5eef"},
		{"two delay digits spelt out", defaultWith(func(p *Policy) { p.DelayDigits = 2 }), "75dc41b8"},
	} {
		if got := tc.p.fingerprint(); got != tc.want {
			t.Errorf("%s: fingerprint %s, want %s (fingerprints must not change across versions)", tc.name, got, tc.want)
		}
	}
}

// TestFingerprintTellsParametersApart: every parameter counts; equal
// parameters give equal fingerprints.
func TestFingerprintTellsParametersApart(t *testing.T) {
	changes := map[string]func(*Policy){
		"backoff":       func(p *Policy) { p.Backoff = Constant },
		"min delay":     func(p *Policy) { p.MinDelay = 2 * time.Second },
		"max delay":     func(p *Policy) { p.MaxDelay = time.Minute },
		"multiplier":    func(p *Policy) { p.Multiplier = 2.5 },
		"jitter":        func(p *Policy) { p.Jitter = EqualJitter },
		"jitter factor": func(p *Policy) { p.JitterFactor = 0.25 },
		"jitter max":    func(p *Policy) { p.JitterMax = 2 * time.Second },
		"immediate":     func(p *Policy) { p.ImmediateRetries = 1 },
		"max retries":   func(p *Policy) { p.MaxRetries = 11 },
		"max duration":  func(p *Policy) { p.MaxDuration = time.Hour },
		"deadline":      func(p *Policy) { p.Deadline = Strict },
		"retry rate":    func(p *Policy) { p.RetryRate = 0.5 },
		"delay digits":  func(p *Policy) { p.DelayDigits = 3 },
	}
	seen := map[string]string{defaultPolicy.fingerprint(): "the default"}
	for name, change := range changes {
		p := defaultPolicy
		change(&p)
		fp := p.fingerprint()
		if other, ok := seen[fp]; ok {
			t.Errorf("changing the %s gives %s's fingerprint %s", name, other, fp)
		}
		seen[fp] = name
		q := defaultPolicy
		change(&q)
		if q.fingerprint() != fp {
			t.Errorf("%s: equal parameters, fingerprints %s and %s", name, fp, q.fingerprint())
		}
	}
}

func TestSet(t *testing.T) {
	payments := Named{Name: "payments", Queues: regexp.MustCompile(`^payments\.`), Policy: defaultPolicy}
	payments.MaxRetries = 20
	all := Named{Name: "all", Queues: regexp.MustCompile(`.`), Policy: defaultPolicy}
	all.Jitter = NoJitter
	s := NewSet(defaultPolicy, payments, all)
	for origin, want := range map[string]string{
		"payments.capture": "payments", "old.payments.capture": "all", "orders": "all", "": DefaultName,
	} {
		if got := s.For(origin).Name; got != want {
			t.Errorf("For(%q) = %s, want %s", origin, got, want)
		}
	}
	if len(s.All()) != 3 || s.All()[2] != s.Default() || s.Default().Policy != defaultPolicy {
		t.Errorf("All = %v: want payments, all, then the default", s.All())
	}
	if p, ok := s.Lookup("payments"); !ok || p.Label() != "payments:"+payments.Policy.fingerprint() {
		t.Errorf("Lookup(payments) = %v, %v", p, ok)
	}
	if _, ok := s.Lookup("orders"); ok {
		t.Error("Lookup found a policy the set does not have")
	}
	single := NewSet(defaultPolicy)
	if single.For("anything").Label() != "default:75dc41b8" {
		t.Errorf("Single's policy is %s", single.For("anything").Label())
	}
}

func TestConflict(t *testing.T) {
	payments := Named{Name: "payments", Queues: regexp.MustCompile(`^payments\.`), Policy: defaultPolicy}
	payments.MaxRetries = 20
	s := NewSet(defaultPolicy, payments)
	chosen, _ := s.Lookup("payments")
	for _, tc := range []struct {
		label    string
		conflict bool
	}{
		{"", false},                                // a first failure, or an earlier rebound's copy
		{chosen.Label(), false},                    // configured alike
		{"payments:00000000", true},                // configured otherwise elsewhere
		{"refunds:" + chosen.Fingerprint, true},    // a policy this replica lacks
		{s.Default().Label(), true},                // another policy of this replica: chosen by other queues elsewhere
		{"default:00000000", true},                 // another policy of this replica, configured otherwise elsewhere
		{"payments", true},                         // no fingerprint
		{"::::" + string(make([]byte, 300)), true}, // garbage
	} {
		if got := s.Conflict(tc.label, chosen); (got != "") != tc.conflict {
			t.Errorf("Conflict(%q) = %q, want a conflict: %v", tc.label, got, tc.conflict)
		}
	}
}

func TestSummary(t *testing.T) {
	for _, tc := range []struct {
		p    Policy
		want string
	}{
		{defaultPolicy, "exponential 1s to 1h ×2, full jitter: 10 retries over 17m7s (1s, 2s, 4s, …, 8m30s), then parked max-retries"},
		{defaultWith(func(p *Policy) { p.Backoff, p.MaxRetries, p.ImmediateRetries = Constant, 3, 1 }),
			"constant 1s, full jitter, 1 immediate: 3 retries over 2s (0s, 1s, 1s), then parked max-retries"},
		{defaultWith(func(p *Policy) { p.MaxRetries, p.RetryRate = 1, 40 }),
			"exponential 1s to 1h ×2, full jitter, at most 40/s per origin: 1 retry over 1s (1s), then parked max-retries"},
		{defaultWith(func(p *Policy) { p.MaxRetries, p.MinDelay, p.MaxDelay = 0, 10*time.Millisecond, 10*time.Millisecond }),
			"exponential 10ms to 10ms ×2, full jitter: more than 1000 retries, the first 1000 over 10s (10ms, 10ms, 10ms, …, 10ms)"},
		{defaultWith(func(p *Policy) { p.Backoff, p.MaxRetries = linear, 4 }),
			"linear 1s to 1h, full jitter: 4 retries over 2h0m1s (1s, 20m, 40m, 1h), then parked max-retries"},
	} {
		if got := tc.p.Summary(); got != tc.want {
			t.Errorf("Summary = %q\n            want %q", got, tc.want)
		}
	}
}
