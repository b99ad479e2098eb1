package simulate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/policy"
)

// textExponential is the 003 text's client with exponential backoff, as a
// rebound policy: from 100 ms, ×2.7 (its code's e), gaussian jitter of
// 0.1, capped at 5 minutes, retrying without a count limit.
func textExponential(t testing.TB) policy.Policy {
	return load(t, "REBOUND_MIN_DELAY=100ms", "REBOUND_MULTIPLIER=2.7", "REBOUND_JITTER=gaussian",
		"REBOUND_JITTER_FACTOR=0.1", "REBOUND_MAX_DELAY=5m", "REBOUND_MAX_RETRIES=0")
}

func load(t testing.TB, environ ...string) policy.Policy {
	t.Helper()
	cfg, err := config.Load(environ)
	if err != nil {
		t.Fatalf("config %v: %v", environ, err)
	}
	return cfg.PolicySet().Default().Policy
}

func outage(t testing.TB, c outageConfig, name string, p policy.Policy) outageResult {
	t.Helper()
	r, err := playOutage(c, outageStrategy{Name: name, Policy: p})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

// TestOutageFindings checks the 003 text's finding on every seed, with
// its parameters: fixed-interval retries (100 ms) never let the dependency
// recover, and exponential backoff with jitter does, both the text's and
// rebound's default. Retrying at once is no better than a fixed interval.
func TestOutageFindings(t *testing.T) {
	def := defaultPolicy(t)
	text := textExponential(t)
	never := []struct {
		name string
		p    policy.Policy
	}{
		{"fixed", fixedInterval(def, 100*time.Millisecond)},
		{"fixed, no retry limit (the text's client)", fixedInterval(text, 100*time.Millisecond)},
		{"immediate", immediate(def)},
	}
	recovers := []struct {
		name string
		p    policy.Policy
	}{
		{"default policy", def},
		{"the text's exponential backoff", text},
	}
	for _, seed := range seeds[:5] {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			t.Parallel()
			c := defaultOutage()
			c.Seed = seed
			var peakBad int
			for _, s := range never {
				r := outage(t, c, s.name, s.p).Summary
				if r.Recovered || r.RecoveryS != nil {
					t.Errorf("seed %d: %s recovered (%v s after): want never", seed, s.name, *r.RecoveryS)
				}
				if r.PeakConcurrency <= c.Concurrency {
					t.Errorf("seed %d: %s: the dependency held at most %d calls, want more than the consumer's %d (calls it gave up on)", seed, s.name, r.PeakConcurrency, c.Concurrency)
				}
				peakBad = max(peakBad, r.PeakDependencyRPS)
			}
			for _, s := range recovers {
				r := outage(t, c, s.name, s.p).Summary
				if !r.Recovered || r.RecoveryS == nil || *r.RecoveryS > 10 {
					t.Errorf("seed %d: %s: recovered %v after %v s, want within 10 s of the dependency resuming", seed, s.name, r.Recovered, r.RecoveryS)
				}
				if r.PeakDependencyRPS >= peakBad {
					t.Errorf("seed %d: %s peaks at %d calls/s, fixed or immediate at %d: want fewer", seed, s.name, r.PeakDependencyRPS, peakBad)
				}
				if r.LatencyP50S == nil || r.LatencyP99S == nil || r.Pending > int(c.Rate) {
					t.Errorf("seed %d: %s: p50 %v, p99 %v, %d pending: want nearly every message delivered", seed, s.name, r.LatencyP50S, r.LatencyP99S, r.Pending)
				}
				if r.DelayQueues < 2 || r.PeakDelayed == 0 {
					t.Errorf("seed %d: %s used %d delay queues, peak %d delayed: want jitter to spread delays over several", seed, s.name, r.DelayQueues, r.PeakDelayed)
				}
			}
		})
	}
}

// knee is the largest concurrency at which the dependency still answers
// within the timeout: no consumer this small can push it over.
func knee(c outageConfig) int {
	n := c.Limit
	for c.latencyDuration(n+1) < c.Timeout {
		n++
	}
	return n
}

// randomPolicy draws a policy as an operator could configure it, through
// config.Load, retrying until one is valid.
func randomPolicy(t testing.TB, r *rand.Rand) (policy.Policy, []string) {
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	for {
		env := []string{
			"REBOUND_BACKOFF=" + pick("constant", "linear", "arithmetic", "geometric", "exponential"),
			"REBOUND_JITTER=" + pick("none", "full", "equal", "bounded", "decorrelated", "proportional", "gaussian", "additive"),
			"REBOUND_DEADLINE=" + pick("clamp", "strict", "lenient"),
			"REBOUND_MIN_DELAY=" + pick("1ms", "50ms", "100ms", "1s", "5s"),
			"REBOUND_MAX_DELAY=" + pick("5s", "30s", "5m", "1h"),
			"REBOUND_MULTIPLIER=" + pick("1.5", "2", "3"),
			"REBOUND_MAX_RETRIES=" + pick("0", "2", "5", "10", "30"),
			"REBOUND_MAX_DURATION=" + pick("0", "30s", "10m", "24h"),
			"REBOUND_IMMEDIATE_RETRIES=" + pick("0", "0", "1", "3"),
		}
		if cfg, err := config.Load(env); err == nil {
			return cfg.PolicySet().Default().Policy, env
		}
	}
}

// TestOutageBelowKnee is a property of the model: a consumer that cannot
// hold more calls than the dependency answers within the timeout cannot
// make it fall, whatever the policy. No call is ever given up on while the
// dependency runs, so it never holds more than the consumer's calls, and
// it recovers once the backlog is drained: exactly when nothing waits in
// the delay queues at the horizon.
func TestOutageBelowKnee(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	base := defaultOutage()
	base.Horizon = 5 * time.Minute
	top := knee(base)
	for i := range 12 {
		p, env := randomPolicy(t, r)
		c := base
		c.Seed = r.Uint64()
		c.Concurrency = 50 + r.IntN(top-50+1)
		res := outage(t, c, "random", p).Summary
		// Retries still waiting at the horizon (a long delay) are not a
		// recovery yet; every other run recovers.
		if res.Recovered == (res.Backlog > 0) || res.PeakConcurrency > c.Concurrency {
			t.Errorf("case %d: concurrency %d (knee %d), policy %v: recovered %v with %d waiting in delay queues, the dependency held up to %d calls",
				i, c.Concurrency, top, env, res.Recovered, res.Backlog, res.PeakConcurrency)
		}
	}
}

// TestOutageInvariants checks bookkeeping on random scenarios and
// policies: every message is delivered, parked or pending; percentiles
// are ordered; reasons are the policy's.
func TestOutageInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for i := range 25 {
		p, env := randomPolicy(t, r)
		c := outageConfig{
			Rate: 5 + 200*r.Float64(), Concurrency: 1 + r.IntN(3000),
			MinLatency: time.Duration(10+r.IntN(300)) * time.Millisecond, Limit: r.IntN(100),
			Factor: 1 + r.Float64()/5, K: 1 + 30*r.Float64(), Timeout: time.Duration(200+r.IntN(5000)) * time.Millisecond,
			At: time.Duration(r.IntN(30)) * time.Second, Outage: time.Duration(r.IntN(60)) * time.Second,
			Sustain: 10 * time.Second, Step: []time.Duration{time.Millisecond * 5, 10 * time.Millisecond, 50 * time.Millisecond}[r.IntN(3)],
			Seed: r.Uint64(),
		}
		c.Horizon = c.At + c.Outage + c.Sustain + time.Duration(r.IntN(120))*time.Second
		checkOutage(t, i, c, p, env)
	}
}

// FuzzOutage runs the outage model on scenarios the fuzzer picks, with a
// horizon of at most a few minutes: a valid one must keep every invariant
// checkOutage checks, an invalid one must be refused.
func FuzzOutage(f *testing.F) {
	f.Add(100.0, uint16(2000), uint16(100), uint8(30), 1.05, 15.0, uint16(2000), uint8(30), uint8(60), uint8(30), uint8(10), uint64(1), uint8(0))
	f.Add(0.0, uint16(0), uint16(0), uint8(0), 0.5, -1.0, uint16(0), uint8(0), uint8(0), uint8(0), uint8(0), uint64(2), uint8(3))
	f.Add(500.0, uint16(1), uint16(1), uint8(255), 2.0, 1.0, uint16(1), uint8(1), uint8(200), uint8(1), uint8(50), uint64(3), uint8(7))
	f.Fuzz(func(t *testing.T, rate float64, concurrency, minLatencyMs uint16, limit uint8, factor, k float64,
		timeoutMs uint16, atS, outageS, sustainS, stepMs uint8, seed uint64, pick uint8) {
		c := outageConfig{
			Rate: math.Mod(rate, 1000), Concurrency: int(concurrency % 5000),
			MinLatency: time.Duration(minLatencyMs%1000) * time.Millisecond, Limit: int(limit),
			Factor: factor, K: k, Timeout: time.Duration(timeoutMs%10000) * time.Millisecond,
			At: time.Duration(atS%60) * time.Second, Outage: time.Duration(outageS%120) * time.Second,
			Sustain: time.Duration(sustainS%60) * time.Second, Step: time.Duration(stepMs%101) * time.Millisecond, Seed: seed,
		}
		c.Horizon = c.At + c.Outage + c.Sustain + time.Duration(pick%60)*time.Second
		r := rand.New(rand.NewPCG(seed, uint64(pick)))
		p, env := randomPolicy(t, r)
		if c.validate() != nil {
			if _, err := playOutage(c, outageStrategy{Name: "fuzz", Policy: p}); err == nil {
				t.Fatalf("playOutage ran %+v, which validate refuses", c)
			}
			return
		}
		checkOutage(t, 0, c, p, env)
	})
}

// checkOutage runs case i with policy p (from the variables env) and
// checks what holds for every run: every message is delivered, parked or
// pending, for reasons the policy has; attempts and latencies are ordered;
// the timeline has a second per second of the horizon and none of the
// outage is healthy; no more calls reach the dependency than are made.
func checkOutage(t *testing.T, i int, c outageConfig, p policy.Policy, env []string) {
	t.Helper()
	res := outage(t, c, "random", p)
	s := res.Summary
	parked := 0
	for reason, n := range s.Parked {
		if !slices.Contains(policy.Reasons, policy.Reason(reason)) || n <= 0 {
			t.Errorf("case %d: parked %d for %q", i, n, reason)
		}
		parked += n
	}
	if s.Delivered+parked+s.Pending != s.Messages {
		t.Errorf("case %d: %d delivered + %d parked + %d pending != %d messages", i, s.Delivered, parked, s.Pending, s.Messages)
	}
	if s.AttemptsP50 > s.AttemptsP99 || s.AttemptsP99 < 0 {
		t.Errorf("case %d: attempts p50 %d, p99 %d", i, s.AttemptsP50, s.AttemptsP99)
	}
	if s.LatencyP50S != nil && *s.LatencyP50S < c.MinLatency.Seconds() {
		t.Errorf("case %d: p50 latency %v s under the dependency's %s", i, *s.LatencyP50S, c.MinLatency)
	}
	ls := []*float64{s.LatencyP50S, s.LatencyP90S, s.LatencyP99S}
	for j := 1; j < len(ls); j++ {
		if ls[j-1] == nil && ls[j] != nil || ls[j-1] != nil && ls[j] != nil && *ls[j] < *ls[j-1] {
			t.Errorf("case %d: latency percentiles not ordered", i)
		}
	}
	if s.Recovered != (s.RecoveryS != nil) {
		t.Errorf("case %d: recovered %v with recovery_s %v", i, s.Recovered, s.RecoveryS)
	}
	if want := int(math.Ceil(c.Horizon.Seconds())); len(res.Timeline) != want {
		t.Errorf("case %d: %d seconds of timeline, want %d", i, len(res.Timeline), want)
	}
	for sec, tl := range res.Timeline {
		during := time.Duration(sec+1)*time.Second > c.At && time.Duration(sec)*time.Second < c.At+c.Outage
		if during && tl.Healthy {
			t.Errorf("case %d (%v): second %d healthy during the outage", i, env, sec)
		}
		if tl.Calls > tl.Attempts {
			t.Errorf("case %d: second %d: %d calls reached the dependency of %d made", i, sec, tl.Calls, tl.Attempts)
		}
	}
}

// TestOutageWithoutOutage: a dependency that never stops answers every
// message at the first attempt, in its minimum latency plus at most the
// step the consumer waits for.
func TestOutageWithoutOutage(t *testing.T) {
	c := defaultOutage()
	c.Outage, c.Horizon = 0, 2*time.Minute
	for _, seed := range seeds[:3] {
		c.Seed = seed
		s := outage(t, c, "default", defaultPolicy(t)).Summary
		lo, hi := c.MinLatency.Seconds(), (c.MinLatency + c.Step).Seconds()
		if !s.Recovered || *s.RecoveryS != 0 || s.AttemptsP99 != 1 || len(s.Parked) != 0 || s.DelayQueues != 0 {
			t.Errorf("seed %d: %+v: want recovered at once, one attempt each, nothing parked or delayed", seed, s)
		}
		if *s.LatencyP50S < lo || *s.LatencyP99S > hi {
			t.Errorf("seed %d: latency p50 %v, p99 %v: want within [%v, %v]", seed, *s.LatencyP50S, *s.LatencyP99S, lo, hi)
		}
		if want := c.Rate * c.Horizon.Seconds(); math.Abs(float64(s.Messages)-want) > 4*math.Sqrt(want) {
			t.Errorf("seed %d: %d messages, want about %v (Poisson)", seed, s.Messages, want)
		}
	}
}

// TestOutageDelayQueues: a fixed interval needs one delay queue,
// immediate retries none (they go straight back to the queue).
func TestOutageDelayQueues(t *testing.T) {
	c := defaultOutage()
	c.Horizon = 2 * time.Minute
	def := defaultPolicy(t)
	fixed := outage(t, c, "fixed", fixedInterval(def, 100*time.Millisecond)).Summary
	immediate := outage(t, c, "immediate", immediate(def)).Summary
	if fixed.DelayQueues != 1 || fixed.PeakDelayed == 0 {
		t.Errorf("fixed: %d delay queues, peak %d delayed: want 1, some", fixed.DelayQueues, fixed.PeakDelayed)
	}
	if immediate.DelayQueues != 0 || immediate.PeakDelayed != 0 {
		t.Errorf("immediate: %d delay queues, peak %d delayed: want none", immediate.DelayQueues, immediate.PeakDelayed)
	}
	if fixed.Parked[string(policy.MaxRetries)] == 0 {
		t.Errorf("fixed: parked %v: want messages parked for max-retries (the default budget)", fixed.Parked)
	}
}

func TestOutageDeterministic(t *testing.T) {
	c := defaultOutage()
	c.Horizon = 3 * time.Minute
	p := defaultPolicy(t)
	a, b := outage(t, c, "p", p), outage(t, c, "p", p)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("two runs with seed %d differ", c.Seed)
	}
	c.Seed++
	if d := outage(t, c, "p", p); reflect.DeepEqual(a.Timeline, d.Timeline) {
		t.Errorf("seeds %d and %d give the same run", c.Seed-1, c.Seed)
	}
}

func TestLatency(t *testing.T) {
	c := defaultOutage()
	tests := []struct {
		n    int
		want time.Duration
	}{
		{0, 100 * time.Millisecond},
		{30, 100 * time.Millisecond},
		{45, 105 * time.Millisecond},  // one K past the limit: ×1.05
		{330, 265 * time.Millisecond}, // 20 K past: ×1.05^20 = 2.653
		{1_000_000, math.MaxInt64},    // saturates instead of overflowing
	}
	for _, tt := range tests {
		if got := c.latencyDuration(tt.n); got.Round(time.Millisecond) != tt.want {
			t.Errorf("Latency(%d) = %s, want %s", tt.n, got, tt.want)
		}
	}
	if k := knee(c); k < 940 || k > 960 {
		t.Errorf("the defaults answer within the 2 s timeout up to %d calls, want about 950", k)
	}
}

func TestFixedIntervalAndImmediate(t *testing.T) {
	def := defaultPolicy(t)
	start := epoch()
	for n := range def.MaxRetries + 1 {
		now := start.Add(time.Duration(n) * time.Minute)
		s := policy.State{Retries: n, StartedAt: start}
		f := fixedInterval(def, 100*time.Millisecond).Decide(s, now, nil)
		i := immediate(def).Decide(s, now, nil)
		want := def.Decide(s, now, rand.New(rand.NewPCG(1, 1)))
		if f.Retry != want.Retry || i.Retry != want.Retry || f.Reason != want.Reason || i.Reason != want.Reason {
			t.Fatalf("retry %d: fixed %+v, immediate %+v, the policy %+v: want the same budget", n, f, i, want)
		}
		if want.Retry && (f.Delay != 100*time.Millisecond || i.Delay != 0) {
			t.Errorf("retry %d: fixed after %s, immediate after %s: want 100ms and 0", n, f.Delay, i.Delay)
		}
	}
}

func TestOutageValidate(t *testing.T) {
	tests := []struct {
		field string
		edit  func(*outageConfig)
	}{
		{"rate", func(c *outageConfig) { c.Rate = 0 }},
		{"rate", func(c *outageConfig) { c.Rate = math.NaN() }},
		{"concurrency", func(c *outageConfig) { c.Concurrency = 0 }},
		{"min-latency", func(c *outageConfig) { c.MinLatency = 0 }},
		{"limit", func(c *outageConfig) { c.Limit = -1 }},
		{"factor", func(c *outageConfig) { c.Factor = 0.5 }},
		{"k", func(c *outageConfig) { c.K = 0 }},
		{"timeout", func(c *outageConfig) { c.Timeout = 0 }},
		{"step", func(c *outageConfig) { c.Step = 3 * time.Millisecond }},
		{"at", func(c *outageConfig) { c.At = -time.Second }},
		{"outage", func(c *outageConfig) { c.Outage = -time.Second }},
		{"sustain", func(c *outageConfig) { c.Sustain = 0 }},
		{"horizon", func(c *outageConfig) { c.Horizon = c.At + c.Outage }},
		{"horizon", func(c *outageConfig) { c.Horizon = 48 * time.Hour }},
	}
	for _, tt := range tests {
		c := defaultOutage()
		tt.edit(&c)
		err := c.validate()
		if err == nil || !strings.Contains(fmt.Sprintf("\n%v", err), "\n"+tt.field+" ") {
			t.Errorf("%s: error %v, want one naming it", tt.field, err)
		}
		if _, err := playOutage(c, outageStrategy{Name: "p", Policy: defaultPolicy(t)}); err == nil {
			t.Errorf("%s: playOutage ran an invalid configuration", tt.field)
		}
	}
	if err := defaultOutage().validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}
