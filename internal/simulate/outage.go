package simulate

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/rebound-mq/rebound/internal/calendar"
	"github.com/rebound-mq/rebound/policy"
)

// This file is the outage model: a RabbitMQ consumer, rebound behind it,
// and a dependency that stops for a while. The dependency is the server of
// "Exponential Backoff or how not to crash a server" (and of the code the
// text links, github.com/smira/exponential-backoff, whose defaults the
// text does not print: factor 1.05, K 15, a 2 s client timeout and a
// 100 ms fixed retry interval).
//
// The reading of the text this model commits to:
//
//   - Messages arrive as a Poisson process of Rate per second into the
//     application queue, outage or not: unlike the text's clients, which
//     each wait on their own request, a queue keeps receiving new work.
//   - The consumer takes messages in queue order, at most Concurrency at
//     once, and calls the dependency once per message. A call that
//     answers within Timeout succeeds: the message is acked (delivered). A
//     call that does not is given up by the consumer at Timeout: it rejects
//     the message, rebound's policy.Decide picks a delay or parks it, and
//     a delayed message re-enters the queue when its delay ends (a delay of
//     0 goes straight back). Delays are Decide's, rounded as rebound queues
//     them; each distinct delay is one delay queue on the broker.
//   - The dependency answers a call once the call has been running for
//     latency(n), n being the calls it holds now: MinLatency up to Limit
//     calls, MinLatency·Factor^((n−Limit)/K) past it. As in the text's
//     server, the latency is re-evaluated as n changes, so new calls slow
//     down the ones already running, and the oldest call is always the
//     next to finish.
//   - A call the consumer gave up on is not cancelled at the dependency:
//     it keeps running and counts in n until answered (the text's server
//     keeps counting a request whose client timed out). This is what can
//     make a dependency fall and never rise: past latency(n) = Timeout
//     every call times out, is retried, and adds to n.
//   - From At, for Outage, the dependency is stopped (the text's SIGSTOP):
//     it answers nothing, so calls fail at Timeout, not at once (the
//     text's client saw time-outs and no errors). The calls it held when it
//     stopped stay held; calls made while it is stopped never reach it
//     (the text's server found some queued in its accept queue when
//     resumed; a queue consumer's load does not depend on them, and
//     leaving them out keeps the difference between strategies to what
//     their retries do). When it resumes, the calls it held have run long
//     enough and are answered at once.
//   - Time advances in Steps (10 ms): within a step, calls finish, callers
//     time out, delays end, messages arrive, and the consumer takes what
//     it can.
//
// Recovery: a second of simulated time is healthy when the dependency ran
// throughout, latency(n) stayed under Timeout (a call made then would be
// answered in time) and the application queue was empty at least once (the
// consumer kept up; a backlog waiting for the consumer is not drained).
// The dependency recovered when the seconds from some point to the horizon
// are all healthy and last at least Sustain; RecoveryS is that point, in
// seconds after the dependency resumed, to the second. A single unhealthy
// second later (an aftershock) moves it past that second, so a recovery
// is never reported that did not hold until the horizon. Nor one whose
// backlog has not drained: retries still waiting in the delay queues at
// the horizon (Backlog) are failures the dependency has yet to see again,
// so a run with any is not recovered, however healthy its last seconds.

// outageConfig is the scenario. defaultOutage returns the text's.
type outageConfig struct {
	Rate        float64       // messages per second, Poisson
	Concurrency int           // messages the consumer handles at once
	MinLatency  time.Duration // the dependency's latency up to Limit calls
	Limit       int           // calls the dependency holds at MinLatency
	Factor      float64       // latency grows by Factor every K calls past Limit
	K           float64
	Timeout     time.Duration // the consumer gives a call up after this
	At          time.Duration // the dependency stops at this time
	Outage      time.Duration // for this long
	Horizon     time.Duration // the run ends here
	Sustain     time.Duration // a recovery must hold this long, to the horizon
	Step        time.Duration // time resolution; divides a second
	Seed        uint64        // seeds every random draw of the run
}

// defaultOutage returns the scenario of the 003 text and its code: 100
// messages a second, latency 100 ms up to 30 concurrent calls then ×1.05
// every 15 more, a 2 s timeout; the dependency stops 30 s in for 60 s; ten
// minutes in all. The consumer handles up to 2000 messages at once: more
// than the dependency can hold within the timeout (about 950 calls), as
// the text's 1000 clients were, but with room for the backlog a queue
// builds during the outage (see docs/simulate.md's concurrency table; set it to
// your consumers' prefetch times their replicas).
func defaultOutage() outageConfig {
	return outageConfig{
		Rate: 100, Concurrency: 2000,
		MinLatency: 100 * time.Millisecond, Limit: 30, Factor: 1.05, K: 15,
		Timeout: 2 * time.Second,
		At:      30 * time.Second, Outage: 60 * time.Second, Horizon: 10 * time.Minute,
		Sustain: 30 * time.Second, Step: 10 * time.Millisecond, Seed: 1,
	}
}

// validate reports every field outside its range, naming the field.
func (c outageConfig) validate() error {
	var errs []error
	check := func(ok bool, field string, value any, allowed string) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s %v: %s", field, value, allowed))
		}
	}
	check(c.Rate > 0 && c.Rate <= 1e6, "rate", c.Rate, "want above 0 and at most 1000000 messages per second")
	check(c.Concurrency >= 1 && c.Concurrency <= 10_000_000, "concurrency", c.Concurrency, "want 1 to 10000000")
	check(c.MinLatency > 0, "min-latency", c.MinLatency, "want above 0")
	check(c.Limit >= 0, "limit", c.Limit, "want 0 or more")
	check(c.Factor >= 1 && !math.IsInf(c.Factor, 1), "factor", c.Factor, "want a finite number of at least 1")
	check(c.K > 0 && !math.IsInf(c.K, 1), "k", c.K, "want a finite number above 0")
	check(c.Timeout > 0, "timeout", c.Timeout, "want above 0")
	check(c.Step >= time.Millisecond && c.Step <= time.Second && time.Second%c.Step == 0, "step", c.Step, "want 1ms to 1s, dividing a second")
	check(c.At >= 0, "at", c.At, "want 0 or more")
	check(c.Outage >= 0, "outage", c.Outage, "want 0 or more")
	check(c.Sustain >= time.Second, "sustain", c.Sustain, "want at least 1s")
	check(c.Horizon <= 24*time.Hour, "horizon", c.Horizon, "want at most 24h")
	if c.Step > 0 {
		check(c.Horizon/c.Step <= 10_000_000, "horizon", c.Horizon, fmt.Sprintf("want at most 10000000 steps of %s", c.Step))
	}
	check(c.Rate*c.Horizon.Seconds() <= 50_000_000, "rate", c.Rate, "want at most 50000000 messages over the horizon")
	check(c.Horizon >= c.At+c.Outage+c.Sustain, "horizon", c.Horizon, "want at least at + outage + sustain, or no recovery can be seen")
	return errors.Join(errs...)
}

// latencyDuration returns the dependency's latency while it holds n calls.
func (c outageConfig) latencyDuration(n int) time.Duration {
	return toDuration(c.latency(n))
}

// latency is Latency in float64 nanoseconds, +Inf past what a float holds.
func (c outageConfig) latency(n int) float64 {
	if n <= c.Limit {
		return float64(c.MinLatency)
	}
	return float64(c.MinLatency) * math.Pow(c.Factor, float64(n-c.Limit)/c.K)
}

func toDuration(ns float64) time.Duration {
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// budget is a policy's retry rate budget (policy.Policy.RetryRate) in a
// run: the calendar of the one application queue, all of rebound's
// replicas together.
type budget struct {
	p   policy.Policy
	cal *calendar.Calendar
}

func newBudget(p policy.Policy) budget {
	return budget{p: p, cal: calendar.New()}
}

// reserve gives a retry decided at now, in state, its delay under the
// budget: the sidecar's own arithmetic (calendar.Retry), for all of
// rebound's replicas as one.
func (b budget) reserve(state policy.State, now time.Time, delay time.Duration) (time.Duration, calendar.Outcome) {
	return b.cal.Retry("origin", now, b.p, state, delay, calendar.Share{Replicas: 1})
}

// outageStrategy is a retry policy under a name.
type outageStrategy struct {
	Name   string
	Policy policy.Policy
}

// fixedInterval returns p retrying after interval every time, without
// jitter: the 003 text's fixed-interval client, with p's budget (retry
// limit, duration budget, deadline) so that only the delays differ.
func fixedInterval(p policy.Policy, interval time.Duration) policy.Policy {
	p.Backoff, p.Jitter = policy.Constant, policy.NoJitter
	p.MinDelay, p.MaxDelay = interval, interval
	p.ImmediateRetries = 0
	return p
}

// immediate returns p retrying at once every time (REBOUND_IMMEDIATE_RETRIES
// covering every retry), with p's budget.
func immediate(p policy.Policy) policy.Policy {
	p.ImmediateRetries = math.MaxInt
	return p
}

// outageSecond is one second of the run, for plots.
type outageSecond struct {
	Calls       int     // calls that reached the dependency (started while it ran)
	Attempts    int     // calls the consumer made, those to the stopped dependency included
	Concurrency int     // most calls the dependency held, abandoned ones included
	Latency     float64 // highest latency(n), in seconds, a call would have been given; may be +Inf
	Delayed     int     // most messages waiting in delay queues
	Queued      int     // most messages waiting in the application queue
	Healthy     bool    // see the recovery rule in the package's outage model
}

// outageSummary is one strategy's result: the row of the table and the
// element of the JSON results. Latency percentiles are end to end (arrival
// to delivery), nearest-rank over every message that arrived, a message
// never delivered (parked, or still pending at the horizon) ranking last:
// a percentile that falls on one is null (the table shows "-"). Attempts
// count calls per message made by the horizon, over every message (for a
// pending one, a lower bound).
type outageSummary struct {
	Strategy          string         `json:"strategy"`
	Recovered         bool           `json:"recovered"`
	RecoveryS         *float64       `json:"recovery_s"` // null when not recovered
	PeakDependencyRPS int            `json:"peak_dependency_rps"`
	PeakConcurrency   int            `json:"peak_concurrency"`
	PeakDelayed       int            `json:"peak_delayed"`
	DelayQueues       int            `json:"delay_queues"`
	Parked            map[string]int `json:"parked"`
	AttemptsP50       int            `json:"attempts_p50"`
	AttemptsP99       int            `json:"attempts_p99"`
	LatencyP50S       *float64       `json:"latency_p50_s"`
	LatencyP90S       *float64       `json:"latency_p90_s"`
	LatencyP99S       *float64       `json:"latency_p99_s"`
	Messages          int            `json:"messages"`
	Delivered         int            `json:"delivered"`
	Pending           int            `json:"pending"`
	// Backlog is the messages waiting in delay queues at the horizon:
	// pending ones that failed and wait for another try.
	Backlog int `json:"backlog"`
	// RetryRate is the policy's retry rate budget (copies a second to the
	// application queue; 0: none), and Deferred and Overflow count the
	// copies it moved later, and those it sent at their deadline over the
	// budget.
	RetryRate float64 `json:"retry_rate"`
	Deferred  int     `json:"deferred"`
	Overflow  int     `json:"overflow"`
}

// outageResult is one run: the summary and the timeline, one element per
// second.
type outageResult struct {
	Summary  outageSummary
	Timeline []outageSecond
}

// message is one message's retry state, as its headers carry it.
type message struct {
	arrival  time.Duration // also the task start given to the policy
	last     time.Duration // last delay chosen
	retries  int32
	attempts int32
	done     bool // delivered or parked
}

// call is a call the dependency holds, or one made while it was stopped.
type call struct {
	msg   int32
	start int32 // step it was made at
}

// playOutage runs the scenario for one strategy. Runs with the same
// configuration share their arrivals, so strategies meet the same
// messages.
func playOutage(c outageConfig, s outageStrategy) (outageResult, error) {
	if err := c.validate(); err != nil {
		return outageResult{}, fmt.Errorf("outage: %w", err)
	}
	arrivals := rand.New(rand.NewPCG(c.Seed, 1))
	jitter := rand.New(rand.NewPCG(c.Seed, 2))

	dt := c.Step
	steps := int(c.Horizon / dt)
	perSecond := int(time.Second / dt)
	timeoutSteps := int32((c.Timeout + dt - 1) / dt)
	stopFrom, stopTo := int((c.At+dt-1)/dt), int((c.At+c.Outage+dt-1)/dt)

	var (
		msgs      []message
		queue     fifo[int32] // the application queue
		held      fifo[call]  // calls the dependency holds, oldest first
		abandoned int         // the oldest calls of held, whose callers gave up
		lost      fifo[call]  // calls made while it was stopped
		busy      int         // messages the consumer is handling
		delayed   int
		due       = make([][]int32, steps+1) // delayed messages by the step they return
		queues    = map[time.Duration]bool{}
		parked    = map[string]int{}
		latencies []float64
		next      = arrivals.ExpFloat64() / c.Rate // seconds
		timeline  = make([]outageSecond, (steps+perSecond-1)/perSecond)
		emptied   bool // the application queue was empty at some step of this second
		budget    = newBudget(s.Policy)
		deferred  = map[calendar.Outcome]int{}
	)
	fail := func(m int32, now int) {
		msg := &msgs[m]
		state := policy.State{
			Retries:   int(msg.retries),
			StartedAt: epoch().Add(msg.arrival),
			LastDelay: msg.last,
		}
		at := epoch().Add(time.Duration(now) * dt)
		d := s.Policy.Decide(state, at, jitter)
		if !d.Retry {
			parked[string(d.Reason)]++
			msg.done = true
			return
		}
		var o calendar.Outcome
		d.Delay, o = budget.reserve(state, at, d.Delay)
		deferred[o]++
		msg.retries++
		msg.last = d.Drawn // what rebound writes in x-retry-last-delay-ms
		if d.Delay <= 0 {
			queue.push(m)
			return
		}
		queues[d.Delay] = true
		delayed++
		// A delay queue returns a message once its TTL has passed: at the
		// first step at or after that time.
		if back := int64(now) + int64((d.Delay+dt-1)/dt); back <= int64(steps) {
			due[back] = append(due[back], m)
		}
	}

	for now := 0; now < steps; now++ {
		sec := &timeline[now/perSecond]
		if now%perSecond == 0 {
			sec.Healthy, emptied = true, false
		}
		running := now < stopFrom || now >= stopTo

		// Calls finish, oldest first, while the oldest has run for the
		// latency the dependency now gives.
		for running && held.len() > 0 && float64(int32(now)-held.at(0).start)*float64(dt) >= c.latency(held.len()) {
			cl := held.pop()
			if abandoned > 0 {
				abandoned--
				continue
			}
			busy--
			msgs[cl.msg].done = true
			latencies = append(latencies, (time.Duration(now)*dt - msgs[cl.msg].arrival).Seconds())
		}
		// Callers give up at the timeout.
		for abandoned < held.len() && int32(now)-held.at(abandoned).start >= timeoutSteps {
			abandoned++
			busy--
			fail(held.at(abandoned-1).msg, now)
		}
		for lost.len() > 0 && int32(now)-lost.at(0).start >= timeoutSteps {
			busy--
			fail(lost.pop().msg, now)
		}
		// Delays end; new messages arrive.
		for _, m := range due[now] {
			queue.push(m)
		}
		delayed -= len(due[now])
		due[now] = nil
		for t := (time.Duration(now) * dt).Seconds(); next <= t; next += arrivals.ExpFloat64() / c.Rate {
			msgs = append(msgs, message{arrival: time.Duration(next * float64(time.Second))})
			queue.push(int32(len(msgs) - 1))
		}
		// The consumer takes what it can.
		for busy < c.Concurrency && queue.len() > 0 {
			m := queue.pop()
			msgs[m].attempts++
			busy++
			sec.Attempts++
			if running {
				held.push(call{msg: m, start: int32(now)})
				sec.Calls++
			} else {
				lost.push(call{msg: m, start: int32(now)})
			}
		}

		lat := c.latency(held.len())
		sec.Concurrency = max(sec.Concurrency, held.len())
		sec.Latency = math.Max(sec.Latency, lat/float64(time.Second))
		sec.Delayed = max(sec.Delayed, delayed)
		sec.Queued = max(sec.Queued, queue.len())
		emptied = emptied || queue.len() == 0
		if !running || !(lat < float64(c.Timeout)) {
			sec.Healthy = false
		}
		if now%perSecond == perSecond-1 || now == steps-1 {
			sec.Healthy = sec.Healthy && emptied
		}
	}

	res := outageResult{Timeline: timeline}
	sum := &res.Summary
	sum.Strategy, sum.Parked, sum.DelayQueues = s.Name, parked, len(queues)
	sum.RetryRate, sum.Deferred, sum.Overflow = s.Policy.RetryRate, deferred[calendar.Deferred], deferred[calendar.Overflow]
	sum.Messages, sum.Delivered = len(msgs), len(latencies)
	attempts := make([]int, len(msgs))
	for i, m := range msgs {
		attempts[i] = int(m.attempts)
		if !m.done {
			sum.Pending++
		}
	}
	slices.Sort(attempts)
	sum.AttemptsP50, sum.AttemptsP99 = percentile(attempts, 0.50), percentile(attempts, 0.99)
	slices.Sort(latencies)
	sum.LatencyP50S = ptr(censoredPercentile(latencies, len(msgs), 0.50))
	sum.LatencyP90S = ptr(censoredPercentile(latencies, len(msgs), 0.90))
	sum.LatencyP99S = ptr(censoredPercentile(latencies, len(msgs), 0.99))
	for _, sec := range timeline {
		sum.PeakDependencyRPS = max(sum.PeakDependencyRPS, sec.Calls)
		sum.PeakConcurrency = max(sum.PeakConcurrency, sec.Concurrency)
		sum.PeakDelayed = max(sum.PeakDelayed, sec.Delayed)
	}
	// The final run of healthy seconds.
	from := len(timeline)
	for from > 0 && timeline[from-1].Healthy {
		from--
	}
	resume := c.At + c.Outage
	healthyFor := c.Horizon - time.Duration(from)*time.Second
	sum.Backlog = delayed
	if from < len(timeline) && healthyFor >= c.Sustain && sum.Backlog == 0 {
		sum.Recovered = true
		sum.RecoveryS = ptr(max(time.Duration(from)*time.Second-resume, 0).Seconds(), true)
	}
	return res, nil
}
