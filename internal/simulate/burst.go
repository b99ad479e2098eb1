package simulate

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/rebound-mq/rebound/policy"
)

// This file is the model of "Exploring backoff": discrete time, clients
// that each want one request answered, and a service of small capacity that
// is overwhelmed by a spike.
//
// The reading of the text this model commits to:
//
//   - Outstanding requests are every request the service holds and still
//     owes a response, successful or failed: those it processes (at most
//     Capacity) and those it will reject. The text: "If the service has a
//     very large number of outstanding requests that need responses, either
//     successful or failed, it is considered overwhelmed".
//   - A request that arrives while Capacity requests are processed is not
//     answered at once: the service needs RejectTicks ticks of work on it
//     before the client hears it failed ("it will wait 1 time step before
//     informing the client"). An accepted request needs ServiceTicks ticks
//     of work.
//   - Progress is one tick of that work. With at most Overwhelmed requests
//     outstanding, every one progresses each tick. Past that the service is
//     overwhelmed and moves forward exactly Overwhelmed of them, drawn
//     uniformly at random from everything it holds: its work per tick is
//     what it manages when not overwhelmed, spread evenly over what it
//     holds, so that "if there are many more failed requests, each
//     successful request is unlikely to make progress".
//   - Within a tick, requests arrive first (in random order, so that no
//     client is systematically first to a free slot), then the service
//     works. A request arriving at tick t and never held up is answered at
//     the end of tick t+ServiceTicks-1: its latency is ServiceTicks.
//   - A client that hears of a failure at the end of tick t sends again at
//     tick t+1+round(delay), delay being what its strategy draws, in ticks,
//     rounded to the nearest tick: "retry at once" is the next tick.
//   - Latency is counted from a client's first request to the end of the
//     tick its successful response is sent, in ticks.

// burstConfig is the experiment's setup. defaultBurst returns the text's.
type burstConfig struct {
	Ticks        int     // length of the run
	SendTicks    int     // first requests fall in [0, SendTicks); retries go on after
	Clients      int     // clients, one request each to get answered
	Spike        float64 // share of clients whose first request is at tick 0, in [0, 1]
	Capacity     int     // requests the service processes at once
	ServiceTicks int     // ticks of work an accepted request needs
	RejectTicks  int     // ticks of work a rejection needs before the client hears it
	Overwhelmed  int     // outstanding requests past which the service is overwhelmed
	ShockWindow  int     // ticks of the moving average the aftershock index compares retries with
	Seed         uint64  // seeds every random draw of the run
}

// defaultBurst returns the setup of "Exploring backoff": 3000 ticks, 800
// clients sending their first request in the first 1000 ticks, 20 % of them
// at tick 0, a service processing 5 requests of 5 ticks each, rejections
// after 1 tick, overwhelmed past 25 outstanding requests; aftershocks are
// measured against a 31-tick moving average, one period of EB once capped.
func defaultBurst() burstConfig {
	return burstConfig{
		Ticks: 3000, SendTicks: 1000, Clients: 800, Spike: 0.2,
		Capacity: 5, ServiceTicks: 5, RejectTicks: 1, Overwhelmed: 25,
		ShockWindow: 31, Seed: 1,
	}
}

// validate reports every field outside its range, naming the field.
func (c burstConfig) validate() error {
	var errs []error
	check := func(ok bool, field string, value any, allowed string) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s %v: %s", field, value, allowed))
		}
	}
	check(c.Ticks >= 1 && c.Ticks <= 10_000_000, "ticks", c.Ticks, "want 1 to 10000000")
	check(c.SendTicks >= 1 && c.SendTicks <= c.Ticks, "send-ticks", c.SendTicks, "want 1 to ticks")
	check(c.Clients >= 1 && c.Clients <= 10_000_000, "clients", c.Clients, "want 1 to 10000000")
	check(c.Spike >= 0 && c.Spike <= 1, "spike", c.Spike, "want a share from 0 to 1")
	check(c.Capacity >= 1, "capacity", c.Capacity, "want at least 1")
	check(c.ServiceTicks >= 1, "service-ticks", c.ServiceTicks, "want at least 1")
	check(c.RejectTicks >= 1, "reject-ticks", c.RejectTicks, "want at least 1")
	check(c.Overwhelmed >= 1, "overwhelmed", c.Overwhelmed, "want at least 1")
	check(c.ShockWindow >= 1 && c.ShockWindow <= c.Ticks, "shock-window", c.ShockWindow, "want 1 to ticks")
	return errors.Join(errs...)
}

// failure is what a client knows when it hears that a request failed.
type failure struct {
	Attempts int // requests it has sent, the failed one included: 1 after the first failure
	Elapsed  int // ticks from its first request to now
	// LastDelay is the delay its strategy chose before the failed
	// request, in ticks, as it reported it (for the policy strategy the
	// delay as drawn, before rebound rounds it for its delay queue: what
	// rebound carries in x-retry-last-delay-ms); 0 before the first retry.
	LastDelay float64
}

// burstStrategy is how a client backs off. Delay returns how many ticks to
// wait before the next request and the delay it chose, which the next
// Failure carries as LastDelay (the same but for the policy strategy), or
// giveUp to stop trying (the client is then never answered). It must draw
// only from r.
type burstStrategy struct {
	Name  string
	Delay func(f failure, r *rand.Rand) (wait, chosen float64, giveUp bool)
	// RetryRate is the retry rate budget Delay applies, for the summary;
	// 0 for none.
	RetryRate float64
}

// Names of the strategies of "Exploring backoff", and of the configured
// policy.
const (
	strategyNB     = "NB"     // no backoff: retry at once
	strategyCB     = "CB"     // constant backoff
	strategyURB    = "URB"    // uniformly random backoff
	strategyEB     = "EB"     // exponential backoff
	strategyREB    = "REB"    // random exponential backoff
	strategyPolicy = "policy" // rebound's policy, converted to ticks
)

// burstStrategyNames lists the strategy names in the text's order.
func burstStrategyNames() []string {
	return []string{strategyNB, strategyCB, strategyURB, strategyEB, strategyREB, strategyPolicy}
}

// backoffs holds the parameters of the burst strategies, in ticks, and the
// rebound policy with the duration of one tick.
type backoffs struct {
	Constant   float64       // CB waits this long (5)
	UniformMax float64       // URB waits U(0, UniformMax) (5)
	ExpCap     float64       // EB waits min(2^attempts, ExpCap), REB U(0, that) (30)
	Policy     policy.Policy // the policy strategy's
	Tick       time.Duration // what one tick is to the policy (1s)
}

// defaultBackoffs returns the text's parameters with p and one second per
// tick.
func defaultBackoffs(p policy.Policy) backoffs {
	return backoffs{Constant: 5, UniformMax: 5, ExpCap: 30, Policy: p, Tick: time.Second}
}

// Strategy returns the named strategy (see burstStrategyNames).
//
// EB's delay is min(2^attempts, ExpCap). The text writes max(2^attempts,
// 30), but as a floor that would make EB wait at least 30 ticks every time,
// which contradicts its results (EB's latencies are among the best, with a
// 75th percentile better than REB's); 30 is read as a cap, as in every
// other exponential backoff.
func (b backoffs) Strategy(name string) (burstStrategy, error) {
	switch name {
	case strategyNB:
		return burstStrategy{Name: strategyNB, Delay: func(failure, *rand.Rand) (float64, float64, bool) { return 0, 0, false }}, nil
	case strategyCB:
		d := b.Constant
		return burstStrategy{Name: strategyCB, Delay: func(failure, *rand.Rand) (float64, float64, bool) { return d, d, false }}, nil
	case strategyURB:
		hi := b.UniformMax
		return burstStrategy{Name: strategyURB, Delay: func(_ failure, r *rand.Rand) (float64, float64, bool) {
			d := r.Float64() * hi
			return d, d, false
		}}, nil
	case strategyEB:
		limit := b.ExpCap
		return burstStrategy{Name: strategyEB, Delay: func(f failure, _ *rand.Rand) (float64, float64, bool) {
			d := math.Min(math.Exp2(float64(f.Attempts)), limit)
			return d, d, false
		}}, nil
	case strategyREB:
		limit := b.ExpCap
		return burstStrategy{Name: strategyREB, Delay: func(f failure, r *rand.Rand) (float64, float64, bool) {
			d := r.Float64() * math.Min(math.Exp2(float64(f.Attempts)), limit)
			return d, d, false
		}}, nil
	case strategyPolicy:
		if b.Tick <= 0 {
			return burstStrategy{}, fmt.Errorf("strategy %s: tick %s: want a duration above 0", strategyPolicy, b.Tick)
		}
		return policyBackoff(b.Policy, b.Tick), nil
	}
	return burstStrategy{}, fmt.Errorf("unknown strategy %q: want one of %s", name, strings.Join(burstStrategyNames(), ", "))
}

// epoch is the simulated time 0 given to policy.Decide, which only looks
// at differences between times.
func epoch() time.Time { return time.Unix(0, 0).UTC() }

// policyBackoff turns a rebound policy into a burst strategy, one tick
// being tick: each failure asks p.Decide, with the retries so far, the
// client's first request as the task start and its last delay, for a delay
// (as rebound would queue it) that becomes ticks; the delay as drawn is
// what the next failure carries, as rebound's header does. A park decision
// means the client gives up.
//
// With a retry rate budget (p.RetryRate copies a second of simulated time,
// a tick lasting tick), the retries of all clients share it, as the
// retries of all the messages of one application queue do: a copy whose
// second is full waits for one with room. Each strategy PolicyBackoff
// returns keeps its own calendar: use it for one run.
func policyBackoff(p policy.Policy, tick time.Duration) burstStrategy {
	perTick := float64(tick)
	b := newBudget(p)
	return burstStrategy{Name: strategyPolicy, RetryRate: p.RetryRate, Delay: func(f failure, r *rand.Rand) (float64, float64, bool) {
		s := policy.State{
			Retries:   f.Attempts - 1,
			StartedAt: epoch(),
			LastDelay: time.Duration(math.Round(f.LastDelay * perTick)),
		}
		now := epoch().Add(time.Duration(f.Elapsed) * tick)
		d := p.Decide(s, now, r)
		if !d.Retry {
			return 0, 0, true
		}
		d.Delay, _ = b.reserve(s, now, d.Delay)
		return float64(d.Delay) / perTick, float64(d.Drawn) / perTick, false
	}}
}

// burstTick is the service's view of one tick.
type burstTick struct {
	Queued   int // requests the service holds (outstanding) once this tick's arrivals are in
	Received int // requests that arrived this tick
	Rejected int // of which rejected because the service was full
	First    int // of which first requests of their client
}

// clientOutcome is one client's view of the run.
type clientOutcome struct {
	Latency  int  // ticks from its first request to success; -1 if it never succeeded
	Requests int  // requests it sent
	GaveUp   bool // its strategy gave up (policy parked)
}

// burstSummary is one strategy's result: the row of the table and the
// element of the JSON results. Latency percentiles are nearest-rank over
// every client, a client never answered ranking last: a percentile that
// falls on such a client is null (the table shows "-"), never the
// percentile of the lucky ones alone. Aftershocks is the aftershock index
// (see Aftershocks).
type burstSummary struct {
	Strategy    string  `json:"strategy"`
	Clients     int     `json:"clients"`
	Completed   int     `json:"completed"`
	GaveUp      int     `json:"gave_up"`
	Requests    int     `json:"requests"`
	Rejected    int     `json:"rejected"`
	LatencyP50  *int    `json:"latency_p50"`
	LatencyP75  *int    `json:"latency_p75"`
	LatencyP90  *int    `json:"latency_p90"`
	LatencyP99  *int    `json:"latency_p99"`
	LatencyMax  *int    `json:"latency_max"`
	Aftershocks float64 `json:"aftershocks"`
	// RetryRate is the strategy's retry rate budget, copies a second of
	// simulated time (the policy's REBOUND_RETRY_RATE; 0: none).
	RetryRate float64 `json:"retry_rate"`
}

// burstResult is one run: the summary, the service's view tick by tick and
// every client's outcome, sorted by latency (clients never answered last,
// by requests sent).
type burstResult struct {
	Summary burstSummary
	Ticks   []burstTick
	Clients []clientOutcome
}

// held is a request the service holds: whose, how much work is left, and
// whether it ends in a rejection.
type held struct {
	client int32
	work   int32
	reject bool
}

// playBurst runs the experiment for one strategy. Runs with the same
// configuration share their first-request times, so strategies are
// compared on the same clients.
func playBurst(c burstConfig, s burstStrategy) (burstResult, error) {
	if err := c.validate(); err != nil {
		return burstResult{}, fmt.Errorf("burst: %w", err)
	}
	if s.Delay == nil {
		return burstResult{}, fmt.Errorf("burst: strategy %q has no Delay", s.Name)
	}
	arrivals := rand.New(rand.NewPCG(c.Seed, 1))
	service := rand.New(rand.NewPCG(c.Seed, 2))
	backoff := rand.New(rand.NewPCG(c.Seed, 3))

	first := make([]int, c.Clients)
	attempts := make([]int, c.Clients)
	last := make([]float64, c.Clients)
	latency := make([]int, c.Clients)
	gaveUp := make([]bool, c.Clients)
	due := make([][]int32, c.Ticks) // clients sending at each tick
	spike := int(math.Round(c.Spike * float64(c.Clients)))
	for i := range first {
		if i >= spike {
			first[i] = arrivals.IntN(c.SendTicks)
		}
		latency[i] = -1
		due[first[i]] = append(due[first[i]], int32(i))
	}

	res := burstResult{Ticks: make([]burstTick, c.Ticks)}
	sum := &res.Summary
	sum.Strategy, sum.Clients, sum.RetryRate = s.Name, c.Clients, s.RetryRate
	var queue []held
	processing := 0
	for t := 0; t < c.Ticks; t++ {
		tick := &res.Ticks[t]
		now := due[t]
		due[t] = nil
		service.Shuffle(len(now), func(i, j int) { now[i], now[j] = now[j], now[i] })
		for _, cl := range now {
			attempts[cl]++
			tick.Received++
			if attempts[cl] == 1 {
				tick.First++
			}
			if processing < c.Capacity {
				processing++
				queue = append(queue, held{client: cl, work: int32(c.ServiceTicks)})
			} else {
				tick.Rejected++
				queue = append(queue, held{client: cl, work: int32(c.RejectTicks), reject: true})
			}
		}
		tick.Queued = len(queue)

		// Work: everything progresses, or a random Overwhelmed of it.
		n := len(queue)
		if n > c.Overwhelmed {
			for i := range c.Overwhelmed {
				j := i + service.IntN(n-i)
				queue[i], queue[j] = queue[j], queue[i]
				queue[i].work--
			}
		} else {
			for i := range queue {
				queue[i].work--
			}
		}

		// Responses go out at the end of the tick.
		kept := queue[:0]
		for _, h := range queue {
			if h.work > 0 {
				kept = append(kept, h)
				continue
			}
			cl := h.client
			if !h.reject {
				processing--
				latency[cl] = t + 1 - first[cl]
				continue
			}
			d, chosen, stop := s.Delay(failure{Attempts: attempts[cl], Elapsed: t + 1 - first[cl], LastDelay: last[cl]}, backoff)
			if stop {
				gaveUp[cl] = true
				continue
			}
			last[cl] = chosen
			// d >= 0 for every strategy; NaN or a delay past the run
			// means the client never sends again within it.
			if !(d >= 0) || d >= float64(c.Ticks) {
				continue
			}
			if next := t + 1 + int(math.Round(d)); next < c.Ticks {
				due[next] = append(due[next], cl)
			}
		}
		queue = kept
	}

	res.Clients = make([]clientOutcome, c.Clients)
	var done []int
	for i := range res.Clients {
		res.Clients[i] = clientOutcome{Latency: latency[i], Requests: attempts[i], GaveUp: gaveUp[i]}
		sum.Requests += attempts[i]
		if latency[i] >= 0 {
			done = append(done, latency[i])
		}
		if gaveUp[i] {
			sum.GaveUp++
		}
	}
	for _, tk := range res.Ticks {
		sum.Rejected += tk.Rejected
	}
	sum.Completed = len(done)
	slices.Sort(done)
	sum.LatencyP50 = ptr(censoredPercentile(done, c.Clients, 0.50))
	sum.LatencyP75 = ptr(censoredPercentile(done, c.Clients, 0.75))
	sum.LatencyP90 = ptr(censoredPercentile(done, c.Clients, 0.90))
	sum.LatencyP99 = ptr(censoredPercentile(done, c.Clients, 0.99))
	sum.LatencyMax = ptr(censoredPercentile(done, c.Clients, 1))
	sum.Aftershocks = aftershocks(res.Ticks, c.ShockWindow, c.SendTicks)
	slices.SortStableFunc(res.Clients, func(a, b clientOutcome) int {
		switch {
		case a.Latency < 0 && b.Latency < 0:
			return a.Requests - b.Requests
		case a.Latency < 0:
			return 1
		case b.Latency < 0:
			return -1
		}
		return a.Latency - b.Latency
	})
	return res, nil
}

// aftershocks measures how much retries come in waves ("aftershocks", as
// exponential backoff without jitter shows them after a spike): the index
// of dispersion of the retries received per tick around their centred
// moving average over window ticks, over the ticks [window, until) where
// the average fits in the series. Retries that arrive independently (a
// Poisson stream, whatever its trend) give about 1; retries synchronised
// into waves with a period near window give several times that; a
// metronome (every client on the same constant delay) gives about 0. It is
// 0 when no retry arrives in that span.
func aftershocks(ticks []burstTick, window, until int) float64 {
	if window < 1 {
		return 0
	}
	retries := func(i int) float64 { return float64(ticks[i].Received - ticks[i].First) }
	half := window / 2
	// Tick i is compared with the average of [i-half, i-half+window).
	from, to := window, min(until, len(ticks)-window+half+1)
	var dev, mean float64
	for i := from; i < to; i++ {
		var sum float64
		for j := i - half; j < i-half+window; j++ {
			sum += retries(j)
		}
		avg := sum / float64(window)
		d := retries(i) - avg
		dev += d * d
		mean += avg
	}
	if mean == 0 {
		return 0
	}
	return dev / mean
}
