package simulate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/policy"
)

// seeds are the seeds every qualitative finding must hold for.
var seeds = []uint64{1, 2, 3, 4, 5, 6, 7, 8}

// defaultPolicy is rebound's default policy, read the way the command
// reads it.
func defaultPolicy(t testing.TB) policy.Policy {
	t.Helper()
	cfg, err := config.Load(nil)
	if err != nil {
		t.Fatalf("default configuration: %v", err)
	}
	return cfg.PolicySet().Default().Policy
}

// burstAll runs every strategy of the text on c.
func burstAll(t testing.TB, c burstConfig, p policy.Policy) map[string]burstSummary {
	t.Helper()
	out := map[string]burstSummary{}
	for _, name := range burstStrategyNames() {
		s, err := defaultBackoffs(p).Strategy(name)
		if err != nil {
			t.Fatal(err)
		}
		r, err := playBurst(c, s)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = r.Summary
	}
	return out
}

// val reads a censored percentile: a client never answered is +Inf.
func val(p *int) float64 {
	if p == nil {
		return math.Inf(1)
	}
	return float64(*p)
}

// TestBurstFindings checks the findings of "Exploring backoff" on every
// seed: exponential backoff, with or without randomness, answers clients
// far sooner and with far fewer requests than no, constant or uniform
// backoff; EB comes in waves (aftershocks) and REB does not; EB has the
// better 75th percentile and sends fewer requests, REB the better tail.
func TestBurstFindings(t *testing.T) {
	p := defaultPolicy(t)
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			t.Parallel()
			c := defaultBurst()
			c.Seed = seed
			r := burstAll(t, c, p)
			for _, good := range []string{strategyEB, strategyREB} {
				g := r[good]
				if g.Completed != c.Clients {
					t.Errorf("seed %d: %s answered %d of %d clients, want all", seed, good, g.Completed, c.Clients)
				}
				for _, bad := range []string{strategyNB, strategyCB, strategyURB} {
					b := r[bad]
					if val(g.LatencyP90) >= val(b.LatencyP50) {
						t.Errorf("seed %d: %s p90 latency %v not below %s p50 %v", seed, good, val(g.LatencyP90), bad, val(b.LatencyP50))
					}
					if 5*g.Requests > b.Requests {
						t.Errorf("seed %d: %s sent %d requests, %s %d: want less than a fifth", seed, good, g.Requests, bad, b.Requests)
					}
					if b.Completed >= g.Completed {
						t.Errorf("seed %d: %s answered %d clients, %s %d", seed, bad, b.Completed, good, g.Completed)
					}
				}
			}
			eb, reb := r[strategyEB], r[strategyREB]
			if eb.Aftershocks < 2.5 || reb.Aftershocks > 1.5 {
				t.Errorf("seed %d: aftershock index EB %.2f, REB %.2f: want EB above 2.5 (waves) and REB under 1.5 (none)", seed, eb.Aftershocks, reb.Aftershocks)
			}
			if val(eb.LatencyP75) >= val(reb.LatencyP75) {
				t.Errorf("seed %d: p75 EB %v, REB %v: want EB's better", seed, val(eb.LatencyP75), val(reb.LatencyP75))
			}
			if val(reb.LatencyP99) >= val(eb.LatencyP99) || val(reb.LatencyMax) >= val(eb.LatencyMax) {
				t.Errorf("seed %d: tail p99/max REB %v/%v, EB %v/%v: want REB's better", seed,
					val(reb.LatencyP99), val(reb.LatencyMax), val(eb.LatencyP99), val(eb.LatencyMax))
			}
			if eb.Requests >= reb.Requests {
				t.Errorf("seed %d: EB sent %d requests, REB %d: want EB fewer", seed, eb.Requests, reb.Requests)
			}
		})
	}
}

// TestBurstByHand runs setups small enough to follow tick by tick; each
// want is derived from the model's rules in the comment, not from a run.
func TestBurstByHand(t *testing.T) {
	two := burstConfig{Ticks: 100, SendTicks: 1, Clients: 2, Spike: 1, Capacity: 1,
		ServiceTicks: 5, RejectTicks: 1, Overwhelmed: 100, ShockWindow: 1, Seed: 1}
	backoffs := defaultBackoffs(policy.Policy{})
	tests := []struct {
		name     string
		c        burstConfig
		strategy string
		// The second client's outcome (the first is answered at once).
		latency, requests, rejected int
	}{
		// A is served over ticks 0..4. B is rejected at tick 0, hears it
		// at the end of the tick and retries every tick: rejected at 1..4
		// (A's slot frees only at the end of tick 4), accepted at 5, done
		// at the end of tick 9.
		{"NB retries each tick", two, strategyNB, 10, 6, 5},
		// B retries at 0+1+5 = 6, is accepted, done at the end of tick 10.
		{"CB waits 5 ticks", two, strategyCB, 11, 2, 1},
		// B waits 2^1 = 2: retries at 3, rejected; waits 2^2 = 4: retries
		// at 3+1+4 = 8, accepted, done at the end of tick 12.
		{"EB doubles", two, strategyEB, 13, 3, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := backoffs.Strategy(tt.strategy)
			if err != nil {
				t.Fatal(err)
			}
			r, err := playBurst(tt.c, s)
			if err != nil {
				t.Fatal(err)
			}
			first, second := r.Clients[0], r.Clients[1]
			if first.Latency != tt.c.ServiceTicks || first.Requests != 1 {
				t.Errorf("first client %+v, want answered in %d ticks at the first request", first, tt.c.ServiceTicks)
			}
			if second.Latency != tt.latency || second.Requests != tt.requests {
				t.Errorf("second client %+v, want latency %d after %d requests", second, tt.latency, tt.requests)
			}
			if r.Summary.Rejected != tt.rejected {
				t.Errorf("%d rejections, want %d", r.Summary.Rejected, tt.rejected)
			}
		})
	}
}

// TestBurstOverwhelmedProgress: past the threshold, only Overwhelmed held
// requests progress per tick. 40 clients at tick 0 on a service of
// capacity 40 that is overwhelmed past 10: everyone is accepted, and the
// 200 ticks of work they need get done at 10 a tick, so the last answer
// cannot come before tick 20, where an unthrottled service would answer
// all of them at tick 5.
func TestBurstOverwhelmedProgress(t *testing.T) {
	c := burstConfig{Ticks: 100, SendTicks: 1, Clients: 40, Spike: 1, Capacity: 40,
		ServiceTicks: 5, RejectTicks: 1, Overwhelmed: 10, ShockWindow: 1}
	for _, seed := range seeds {
		c.Seed = seed
		s, _ := defaultBackoffs(policy.Policy{}).Strategy(strategyNB)
		r, err := playBurst(c, s)
		if err != nil {
			t.Fatal(err)
		}
		// 200 units of work at 10 per tick while more than 10 are held:
		// the last answer cannot come before tick 20 (latency 20).
		if r.Summary.Completed != 40 || val(r.Summary.LatencyMax) < 20 {
			t.Errorf("seed %d: %d answered, max latency %v: want all 40, the last no sooner than 20", seed, r.Summary.Completed, val(r.Summary.LatencyMax))
		}
		if r.Summary.Rejected != 0 {
			t.Errorf("seed %d: %d rejections with room for everyone", seed, r.Summary.Rejected)
		}
	}
}

// TestBurstInvariants checks bookkeeping on random setups and strategies.
func TestBurstInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 0))
	for i := range 200 {
		c := burstConfig{
			Ticks: 50 + r.IntN(500), Clients: 1 + r.IntN(200), Spike: r.Float64(),
			Capacity: 1 + r.IntN(6), ServiceTicks: 1 + r.IntN(6), RejectTicks: 1 + r.IntN(3),
			Overwhelmed: 1 + r.IntN(30), Seed: r.Uint64(),
		}
		c.SendTicks = 1 + r.IntN(c.Ticks)
		c.ShockWindow = 1 + r.IntN(c.Ticks)
		name := burstStrategyNames()[r.IntN(len(burstStrategyNames()))]
		checkBurst(t, i, c, name, r.IntN(5))
	}
}

// FuzzBurst runs the burst model on configurations the fuzzer picks,
// within bounds that keep a run short: a valid one must keep every
// invariant checkBurst checks, an invalid one must be refused, never run.
func FuzzBurst(f *testing.F) {
	f.Add(uint16(3000), uint16(800), 0.2, uint8(5), uint8(5), uint8(1), uint8(25), uint16(1000), uint16(31), uint64(1), uint8(5), uint8(10))
	f.Add(uint16(1), uint16(1), 1.0, uint8(1), uint8(1), uint8(1), uint8(1), uint16(1), uint16(1), uint64(0), uint8(0), uint8(0))
	f.Add(uint16(50), uint16(0), -0.5, uint8(0), uint8(9), uint8(0), uint8(0), uint16(60), uint16(0), uint64(7), uint8(3), uint8(2))
	f.Fuzz(func(t *testing.T, ticks, clients uint16, spike float64, capacity, service, reject, overwhelmed uint8,
		send, window uint16, seed uint64, strategy, retries uint8) {
		c := burstConfig{
			Ticks: int(ticks % 4000), Clients: int(clients % 1000), Spike: spike,
			Capacity: int(capacity % 16), ServiceTicks: int(service % 16), RejectTicks: int(reject % 8),
			Overwhelmed: int(overwhelmed % 64), SendTicks: int(send % 4000), ShockWindow: int(window % 4000), Seed: seed,
		}
		name := burstStrategyNames()[int(strategy)%len(burstStrategyNames())]
		if c.validate() != nil {
			s, err := defaultBackoffs(testPolicy(0)).Strategy(name)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := playBurst(c, s); err == nil {
				t.Fatalf("playBurst ran %+v, which validate refuses", c)
			}
			return
		}
		checkBurst(t, 0, c, name, int(retries%12))
	})
}

// testPolicy is exponential backoff with full jitter from 1s to 1m, the
// given retry limit and an hour's budget.
func testPolicy(retries int) policy.Policy {
	return policy.Policy{Backoff: policy.Exponential, MinDelay: time.Second, MaxDelay: time.Minute,
		Multiplier: 2, Jitter: "full", MaxRetries: retries, MaxDuration: time.Hour, Deadline: "clamp"}
}

// checkBurst runs case i, strategy name (the policy strategy with retries
// as its limit), and checks what holds for every run: the per-tick counts
// add up to the summary, every accepted request is answered or still
// worked on, only the policy gives up, latencies are sorted and at least
// the service time, and percentiles increase.
func checkBurst(t *testing.T, i int, c burstConfig, name string, retries int) {
	t.Helper()
	s, err := defaultBackoffs(testPolicy(retries)).Strategy(name)
	if err != nil {
		t.Fatal(err)
	}
	res, err := playBurst(c, s)
	if err != nil {
		t.Fatalf("case %d %+v: %v", i, c, err)
	}
	sum := res.Summary
	var received, rejected, first int
	for _, tk := range res.Ticks {
		received += tk.Received
		rejected += tk.Rejected
		first += tk.First
		if tk.Rejected > tk.Received || tk.First > tk.Received || tk.Queued < tk.Received {
			t.Fatalf("case %d: tick %+v out of order", i, tk)
		}
	}
	if received != sum.Requests || rejected != sum.Rejected || first != c.Clients {
		t.Errorf("case %d: per tick %d received, %d rejected, %d first; summary %d, %d, %d clients", i, received, rejected, first, sum.Requests, sum.Rejected, c.Clients)
	}
	// Every accepted request is answered or still being worked on.
	if inFlight := sum.Requests - sum.Rejected - sum.Completed; inFlight < 0 || inFlight > c.Capacity {
		t.Errorf("case %d: %d accepted requests unanswered at the end, want 0 to capacity %d", i, inFlight, c.Capacity)
	}
	if sum.GaveUp > 0 && name != strategyPolicy {
		t.Errorf("case %d: %s gave up %d times; only the policy parks", i, name, sum.GaveUp)
	}
	if sum.Completed+sum.GaveUp > c.Clients {
		t.Errorf("case %d: %d answered and %d gave up of %d", i, sum.Completed, sum.GaveUp, c.Clients)
	}
	prevLatency := 0
	for j, cl := range res.Clients {
		if cl.Latency >= 0 && (cl.Latency < c.ServiceTicks || cl.Latency < prevLatency) {
			t.Fatalf("case %d: client %d latency %d: want at least %d, sorted", i, j, cl.Latency, c.ServiceTicks)
		}
		if cl.Latency >= 0 {
			prevLatency = cl.Latency
		}
		if cl.Requests < 1 {
			t.Fatalf("case %d: client %d sent nothing", i, j)
		}
	}
	ps := []*int{sum.LatencyP50, sum.LatencyP75, sum.LatencyP90, sum.LatencyP99, sum.LatencyMax}
	for j := 1; j < len(ps); j++ {
		if val(ps[j]) < val(ps[j-1]) {
			t.Errorf("case %d: percentiles %v not increasing", i, ps)
		}
	}
	if (sum.Completed == c.Clients) != (sum.LatencyMax != nil) {
		t.Errorf("case %d: %d of %d answered, max latency %v: want a max exactly when all were", i, sum.Completed, c.Clients, sum.LatencyMax)
	}
}

func TestBurstDeterministic(t *testing.T) {
	p := defaultPolicy(t)
	for _, name := range burstStrategyNames() {
		s, _ := defaultBackoffs(p).Strategy(name)
		c := defaultBurst()
		a, err := playBurst(c, s)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := playBurst(c, s)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: two runs with seed %d differ", name, c.Seed)
		}
		c.Seed++
		d, _ := playBurst(c, s)
		if reflect.DeepEqual(a.Ticks, d.Ticks) {
			t.Errorf("%s: seeds %d and %d give the same run", name, c.Seed-1, c.Seed)
		}
	}
}

func TestBurstStrategies(t *testing.T) {
	constant := policy.Policy{Backoff: policy.Constant, MinDelay: 2 * time.Second, MaxDelay: 2 * time.Second,
		Jitter: policy.NoJitter, MaxRetries: 3, Deadline: "clamp"}
	b := backoffs{Constant: 5, UniformMax: 5, ExpCap: 30, Policy: constant, Tick: time.Second}
	r := rand.New(rand.NewPCG(1, 1))
	tests := []struct {
		strategy string
		attempts int
		lo, hi   float64 // want lo <= delay <= hi
		giveUp   bool
	}{
		{strategyNB, 1, 0, 0, false},
		{strategyNB, 50, 0, 0, false},
		{strategyCB, 3, 5, 5, false},
		{strategyURB, 1, 0, 5, false},
		{strategyEB, 1, 2, 2, false},
		{strategyEB, 4, 16, 16, false},
		{strategyEB, 5, 30, 30, false}, // 32 capped at 30, not raised to it
		{strategyEB, 40, 30, 30, false},
		{strategyREB, 2, 0, 4, false},
		{strategyREB, 9, 0, 30, false},
		{strategyPolicy, 1, 2, 2, false}, // 2s at one second a tick
		{strategyPolicy, 3, 2, 2, false},
		{strategyPolicy, 4, 0, 0, true}, // the fourth failure: 3 retries spent, parked
	}
	for _, tt := range tests {
		s, err := b.Strategy(tt.strategy)
		if err != nil {
			t.Fatal(err)
		}
		for range 100 {
			d, chosen, giveUp := s.Delay(failure{Attempts: tt.attempts, Elapsed: 10 * tt.attempts}, r)
			if chosen != d {
				t.Errorf("%s: chose %v, waits %v: only the policy strategy chooses other than it waits", tt.strategy, chosen, d)
			}
			if giveUp != tt.giveUp || (!giveUp && (d < tt.lo || d > tt.hi)) {
				t.Fatalf("%s after %d attempts: delay %v, give up %v; want [%v, %v], give up %v", tt.strategy, tt.attempts, d, giveUp, tt.lo, tt.hi, tt.giveUp)
			}
		}
	}
	if _, err := b.Strategy("fibonacci"); err == nil || !strings.Contains(err.Error(), "NB, CB, URB, EB, REB, policy") {
		t.Errorf("unknown strategy: error %v, want one naming the choices", err)
	}
	b.Tick = 0
	if _, err := b.Strategy(strategyPolicy); err == nil {
		t.Error("policy strategy with a zero tick: no error")
	}
}

// TestPolicyBackoffIsDecide: the policy strategy is policy.Decide, its
// delay converted to ticks, on random states of random policies.
func TestPolicyBackoffIsDecide(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for range 500 {
		p := policy.Policy{
			Backoff: policy.Backoffs[r.IntN(len(policy.Backoffs))], Jitter: policy.Jitters[r.IntN(len(policy.Jitters))],
			Deadline: policy.Deadlines[r.IntN(len(policy.Deadlines))], MinDelay: time.Duration(1+r.IntN(5000)) * time.Millisecond,
			Multiplier: 1.5 + r.Float64(), JitterFactor: r.Float64(), JitterMax: time.Second,
			MaxRetries: 2 + r.IntN(10), MaxDuration: time.Duration(r.IntN(3)) * time.Hour,
		}
		p.MaxDelay = p.MinDelay * time.Duration(1+r.IntN(100))
		tick := time.Duration(1+r.IntN(2000)) * time.Millisecond
		f := failure{Attempts: 1 + r.IntN(15), Elapsed: r.IntN(5000), LastDelay: float64(r.IntN(50))}
		seed := r.Uint64()
		got, chosen, gotStop := policyBackoff(p, tick).Delay(f, rand.New(rand.NewPCG(seed, 0)))
		want := p.Decide(policy.State{Retries: f.Attempts - 1, StartedAt: epoch(), LastDelay: time.Duration(f.LastDelay * float64(tick))},
			epoch().Add(time.Duration(f.Elapsed)*tick), rand.New(rand.NewPCG(seed, 0)))
		if gotStop == want.Retry || (want.Retry && (got != float64(want.Delay)/float64(tick) || chosen != float64(want.Drawn)/float64(tick))) {
			t.Fatalf("policy %+v tick %s failure %+v: got %v, chose %v (give up %v), Decide says %+v", p, tick, f, got, chosen, gotStop, want)
		}
	}
}

func TestBurstValidate(t *testing.T) {
	tests := []struct {
		field string
		edit  func(*burstConfig)
	}{
		{"ticks", func(c *burstConfig) { c.Ticks = 0 }},
		{"send-ticks", func(c *burstConfig) { c.SendTicks = c.Ticks + 1 }},
		{"clients", func(c *burstConfig) { c.Clients = 0 }},
		{"spike", func(c *burstConfig) { c.Spike = 1.5 }},
		{"spike", func(c *burstConfig) { c.Spike = math.NaN() }},
		{"capacity", func(c *burstConfig) { c.Capacity = 0 }},
		{"service-ticks", func(c *burstConfig) { c.ServiceTicks = 0 }},
		{"reject-ticks", func(c *burstConfig) { c.RejectTicks = -1 }},
		{"overwhelmed", func(c *burstConfig) { c.Overwhelmed = 0 }},
		{"shock-window", func(c *burstConfig) { c.ShockWindow = 0 }},
	}
	for _, tt := range tests {
		c := defaultBurst()
		tt.edit(&c)
		err := c.validate()
		if err == nil || !strings.HasPrefix(err.Error(), tt.field+" ") {
			t.Errorf("%s: error %v, want one naming it", tt.field, err)
		}
		if _, err := playBurst(c, burstStrategy{Name: strategyNB, Delay: func(failure, *rand.Rand) (float64, float64, bool) { return 0, 0, false }}); err == nil {
			t.Errorf("%s: playBurst ran an invalid configuration", tt.field)
		}
	}
	if err := defaultBurst().validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

func TestAftershocks(t *testing.T) {
	series := func(f func(i int) int) []burstTick {
		ts := make([]burstTick, 1000)
		for i := range ts {
			ts[i].Received = f(i)
		}
		return ts
	}
	r := rand.New(rand.NewPCG(3, 3))
	poisson := func(mean float64) int { // Knuth's method, fine for small means
		l, k, p := math.Exp(-mean), 0, 1.0
		for {
			p *= r.Float64()
			if p < l {
				return k
			}
			k++
		}
	}
	tests := []struct {
		name   string
		ticks  []burstTick
		lo, hi float64
	}{
		{"steady", series(func(int) int { return 7 }), 0, 0.001},
		{"none", series(func(int) int { return 0 }), 0, 0},
		{"poisson", series(func(int) int { return poisson(5) }), 0.8, 1.2},
		{"poisson, falling", series(func(i int) int { return poisson(10 - float64(i)/120) }), 0.8, 1.2},
		{"waves every 30", series(func(i int) int {
			if i%30 < 3 {
				return 50
			}
			return 0
		}), 10, math.Inf(1)},
	}
	for _, tt := range tests {
		if got := aftershocks(tt.ticks, 31, 1000); got < tt.lo || got > tt.hi {
			t.Errorf("%s: index %.3f, want %v to %v", tt.name, got, tt.lo, tt.hi)
		}
	}
}
