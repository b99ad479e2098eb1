package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/rebound-mq/rebound/internal/topology"
)

// Replica scaling: k rebound sidecars compete for one inbox, each built
// as startRebound builds one (consumer.New, its own consume and publish
// connections), so the broker sees k independent clients. They run in
// this process, like the throughput runs, so that one getrusage covers
// them all and the run with one replica is the throughput runs' rebound.

// replicaTrial is one timed run of k replicas on one inbox.
type replicaTrial struct {
	Replicas int
	Round    int // 0-based
	N        int
	Elapsed  time.Duration // first replica consuming to n messages in the delay queue
	Finished time.Time     // when the delay queue held n
	AllIn    time.Duration // first replica consuming to all k consuming
	MovedIn  int           // messages in the delay queue when all k were consuming
	CPU      cpu           // over Elapsed
	Leftover int           // messages still in the inbox after the replicas stopped
	Extra    int           // copies beyond n in the delay queue (duplicates)
	Attempts int           // 1 unless an earlier attempt failed without losing messages
}

func (t replicaTrial) rate() float64 { return float64(t.N) / t.Elapsed.Seconds() }

// rateAllIn is the rate from the moment all k replicas were consuming, 0
// when they were all in only after the last message was moved.
func (t replicaTrial) rateAllIn() float64 {
	if t.MovedIn >= t.N || t.Elapsed <= t.AllIn {
		return 0
	}
	return float64(t.N-t.MovedIn) / (t.Elapsed - t.AllIn).Seconds()
}

// cores is CPU time per wall-clock second over the run.
func (t replicaTrial) cores(d time.Duration) float64 { return d.Seconds() / t.Elapsed.Seconds() }

// replicaScaling is the outcome of all replica runs.
type replicaScaling struct {
	Counts []int // replica counts, ascending; the first is the base of the ratios
	Trials []replicaTrial
	Probe  *queueProbe // an extra run with the largest count, the broker's queue processes sampled
}

// runReplicas runs every replica count once per round, opts.runs rounds,
// ascending in rounds 1, 3, … and descending in rounds 2, 4, …, so that a
// load that drifts over the invocation does not favour one count.
func runReplicas(ctx context.Context, b *broker, o options, stdout io.Writer) (*replicaScaling, error) {
	res := &replicaScaling{Counts: o.replicas}
	for round := range o.runs {
		order := slices.Clone(o.replicas)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, k := range order {
			t, err := runReplicaTrialRetrying(ctx, b, k, round, o.n, stdout)
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(stdout, "round %d replicas=%-2d n=%-6d %6.2fs %8.0f msg/s  all in after %4dms (%5.0f msg/s from then)  cores: process %.2f broker %.2f machine %.2f\n",
				round+1, k, t.N, t.Elapsed.Seconds(), t.rate(), t.AllIn.Milliseconds(), t.rateAllIn(),
				t.cores(t.CPU.self), t.cores(t.CPU.broker), t.cores(t.CPU.machine))
			res.Trials = append(res.Trials, t)
		}
	}
	var err error
	res.Probe, err = runProbe(ctx, b, o.replicas[len(o.replicas)-1], o.n, stdout)
	if err != nil {
		return nil, err
	}
	return res, nil
}

// runReplicaTrialRetrying runs a trial again (twice at most) when it failed
// for a reason other than lost messages, as runTrialRetrying does: other
// tests on this machine restart the shared broker.
func runReplicaTrialRetrying(ctx context.Context, b *broker, k, round, n int, stdout io.Writer) (replicaTrial, error) {
	for attempt := 1; ; attempt++ {
		prefix := fmt.Sprintf("%sreplicas%d.%d.%d.", b.prefix, k, round+1, attempt) // as in runTrialRetrying
		t, err := runReplicaTrial(ctx, b, prefix, k, round, n, b.nodePID(ctx), nil)
		t.Attempts = attempt
		if err == nil || errors.Is(err, errLost) || attempt == 3 || ctx.Err() != nil {
			return t, err
		}
		fmt.Fprintf(stdout, "%d-replica run failed, not by losing messages (%v); running it again once the broker answers, in 5s at least\n", k, err)
		if err := b.pauseBeforeRetry(ctx); err != nil {
			return t, err
		}
		if err := b.sweep(ctx, prefix); err != nil {
			fmt.Fprintf(stdout, "could not delete what the failed run left behind (%s*): %v\n", prefix, err)
		}
	}
}

// runReplicaTrial fills a fresh inbox with n messages, starts k replicas
// on it at once and times them as runTrial times one: from the first
// consumer on the inbox to n messages in the delay queue. Then it stops
// them, checks that nothing was lost and deletes the queues, all named
// with prefix. allIn, if set, is called once all k are consuming.
func runReplicaTrial(ctx context.Context, b *broker, prefix string, k, round, n, brokerPID int, allIn func()) (replicaTrial, error) {
	t := replicaTrial{Replicas: k, Round: round, N: n}
	topo := topology.Topology{
		InboxQueue: prefix + "inbox", DeadLetterExchange: prefix + "dlx", DelayExchange: prefix + "delay",
		DelayQueuePrefix: prefix + "delay.", ParkingQueue: prefix + "parked",
	}
	delayQueue, _ := topo.DelayQueue(retryDelay)
	app := prefix + "app"
	defer b.deleteQueues(app, topo.InboxQueue, delayQueue.Name, topo.ParkingQueue)
	defer b.deleteExchanges(topo.DeadLetterExchange, topo.DelayExchangeFor(retryDelay).Name)
	if err := b.declare(app, nil); err != nil {
		return t, err
	}
	if err := b.declareTopology(topo, retryDelay); err != nil {
		return t, err
	}
	if err := b.fill(ctx, topo.InboxQueue, n, deadLettered(app)); err != nil {
		return t, err
	}

	debug.FreeOSMemory() // collect the fill's garbage now, not in the timed window
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stops []func() error
	stopAll := func() error {
		var errs []error
		for _, stop := range stops {
			errs = append(errs, stop())
		}
		stops = nil
		return errors.Join(errs...)
	}
	defer func() { _ = stopAll() }()
	// startRebound only starts a goroutine: the k replicas connect at
	// the same time.
	for range k {
		r, err := startRebound(runCtx, b.url, topo, reboundSettings{Delay: retryDelay})
		if err != nil {
			return t, err
		}
		stops = append(stops, r.stop)
	}

	if _, err := b.waitFor(ctx, topo.InboxQueue, time.Millisecond, 30*time.Second, func(_, consumers int) bool { return consumers > 0 }); err != nil {
		return t, fmt.Errorf("%d replicas: none started consuming: %w", k, err)
	}
	t0, cpu0 := time.Now(), sampleCPU(brokerPID)
	if _, err := b.waitFor(ctx, topo.InboxQueue, time.Millisecond, 30*time.Second, func(_, consumers int) bool { return consumers >= k }); err != nil {
		return t, fmt.Errorf("%d replicas: not all started consuming: %w", k, err)
	}
	t.AllIn = time.Since(t0)
	if allIn != nil {
		allIn()
	}
	moved, _, err := b.inspect(delayQueue.Name)
	if err != nil {
		return t, err
	}
	t.MovedIn = moved
	timeout := time.Minute + time.Duration(n)*20*time.Millisecond
	got, err := b.waitFor(ctx, delayQueue.Name, 10*time.Millisecond, timeout, func(messages, _ int) bool { return messages >= n })
	t.Finished = time.Now()
	t.Elapsed, t.CPU = t.Finished.Sub(t0), sampleCPU(brokerPID).sub(cpu0)
	if errors.Is(err, errTimeout) {
		return t, fmt.Errorf("%d replicas run %d: %d of %d messages arrived: %w (%w)", k, round+1, got, n, errLost, err)
	}
	if err != nil {
		return t, fmt.Errorf("%d replicas run %d: watch %s: %w", k, round+1, delayQueue.Name, err)
	}

	// As in runTrial: let the last acks reach the broker first.
	time.Sleep(500 * time.Millisecond)
	if err := stopAll(); err != nil {
		return t, fmt.Errorf("stop %d replicas: %w", k, err)
	}
	left, _, err := b.inspect(topo.InboxQueue)
	if err != nil {
		return t, err
	}
	moved, _, err = b.inspect(delayQueue.Name)
	if err != nil {
		return t, err
	}
	t.Leftover, t.Extra = left, moved-n
	if moved < n {
		return t, fmt.Errorf("%d replicas run %d: delay queue holds %d of %d messages after stopping: %w", k, round+1, moved, n, errLost)
	}
	return t, nil
}

// replicaSummary is the medians over rounds for one replica count.
type replicaSummary struct {
	Replicas int
	Runs     int
	Rate     float64 // msg/s
	Ratio    float64 // to the base count, paired by round
	Self     float64 // cores used by this process: the replicas and the poller
	Broker   float64 // cores used by the RabbitMQ node
	Machine  float64 // cores busy on the whole machine
	Other    float64 // Machine minus Self and Broker: neither bench nor the broker
	// BrokerPer100k is the broker's CPU seconds per 100 000 messages.
	BrokerPer100k float64
}

// summaries returns one summary per replica count, ascending.
func (r *replicaScaling) summaries() []replicaSummary {
	out := make([]replicaSummary, 0, len(r.Counts))
	base := r.of(r.Counts[0])
	for _, k := range r.Counts {
		ts := r.of(k)
		s := replicaSummary{Replicas: k, Runs: len(ts)}
		var rates, ratios, self, broker, machine, other, per100k []float64
		for i, t := range ts {
			rates = append(rates, t.rate())
			if i < len(base) {
				ratios = append(ratios, t.rate()/base[i].rate())
			}
			self = append(self, t.cores(t.CPU.self))
			broker = append(broker, t.cores(t.CPU.broker))
			machine = append(machine, t.cores(t.CPU.machine))
			other = append(other, t.cores(t.CPU.machine-t.CPU.self-t.CPU.broker))
			per100k = append(per100k, t.CPU.broker.Seconds()/float64(t.N)*1e5)
		}
		s.Rate, s.Ratio = median(rates), median(ratios)
		s.Self, s.Broker, s.Machine, s.Other = median(self), median(broker), median(machine), median(other)
		s.BrokerPer100k = median(per100k)
		out = append(out, s)
	}
	return out
}

// of returns the trials with k replicas in round order: every round runs
// each count once, so index i of two counts' trials is the same round.
func (r *replicaScaling) of(k int) []replicaTrial {
	var out []replicaTrial
	for _, t := range r.Trials {
		if t.Replicas == k {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b replicaTrial) int { return a.Round - b.Round })
	return out
}

// scalingStep is the least gain, from one replica count to the next, that
// the reading calls scaling: below it, run-to-run noise on a shared
// machine could account for the difference.
const scalingStep = 1.10

// busyOther is how many cores other processes may use before the reading
// says the numbers reflect the machine's load rather than rebound.
const busyOther = 0.25

// saturatedQueue is how often a queue's process must be busy for the
// reading to name that queue as the limit.
const saturatedQueue = 0.75

// reading says, from the numbers, where adding replicas stops paying and
// what the CPU looked like there. cpus is the machine's CPU count.
func (r *replicaScaling) reading(cpus int) string {
	s := r.summaries()
	if len(s) < 2 {
		return fmt.Sprintf("Only %s was measured: there is no scaling to read.", nReplicas(s[0].Replicas))
	}
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	base, top := s[0], s[len(s)-1]
	// stop is the first count that no larger count beats by scalingStep;
	// best is the larger count that came closest.
	stop, best := -1, -1
	for i := 0; i < len(s)-1 && stop < 0; i++ {
		best = i + 1
		for j := i + 2; j < len(s); j++ {
			if s[j].Ratio > s[best].Ratio {
				best = j
			}
		}
		if s[best].Ratio < s[i].Ratio*scalingStep {
			stop = i
		}
	}
	if stop < 0 {
		w("Throughput rose by at least %.0f %% at every step, to %.2f× the rate of %s with %s: "+
			"this invocation did not reach the point where adding replicas stops paying. ",
			(scalingStep-1)*100, top.Ratio, nReplicas(base.Replicas), nReplicas(top.Replicas))
	} else {
		w("Adding replicas stops paying after **%s**: no larger count raised the median rate by %.0f %% or more, "+
			"the least this report counts as scaling (the best, %s, by %+.0f %%; ratios paired by round). ",
			nReplicas(s[stop].Replicas), (scalingStep-1)*100, nReplicas(s[best].Replicas), (s[best].Ratio/s[stop].Ratio-1)*100)
	}
	// The count that did not pay (or the largest) is where the limit shows.
	lim, other := top, top.Other
	cpuOf := func(x replicaSummary) string {
		return fmt.Sprintf("%s the broker used %.2f cores, this process (the replicas and bench's poller) %.2f, "+
			"and the whole machine had %.2f of its %d cores busy (%.0f %%), %.2f of them by processes that are neither",
			nReplicas(x.Replicas), x.Broker, x.Self, x.Machine, cpus, x.Machine/float64(cpus)*100, max(x.Other, 0))
	}
	if stop >= 0 {
		lim, other = s[stop+1], max(s[stop].Other, s[stop+1].Other)
		w("With %s; with %s: %.2f, %.2f and %.2f (%.0f %%; %.2f neither). ", cpuOf(s[stop]), nReplicas(lim.Replicas),
			lim.Broker, lim.Self, lim.Machine, lim.Machine/float64(cpus)*100, max(lim.Other, 0))
	} else {
		w("With %s. ", cpuOf(top))
	}
	w("From %s to %s the broker went from %.2f to %.2f cores and from %.1f to %.1f CPU-seconds per 100 000 "+
		"messages, this process from %.2f to %.2f cores. ", nReplicas(base.Replicas), nReplicas(top.Replicas),
		base.Broker, top.Broker, base.BrokerPer100k, top.BrokerPer100k, base.Self, top.Self)
	busiest, probed := queueLoad{}, false
	if r.Probe != nil {
		busiest, probed = r.Probe.busiest()
	}
	if probed && other <= busyOther {
		w("In the probed run with %s, the busiest queue process, %s's, was busy %.0f %% of the time, with %.1f "+
			"messages waiting in its mailbox on average. ", nReplicas(r.Probe.Replicas), busiest.Queue, busiest.Busy*100, busiest.Mailbox)
	}
	switch {
	case other > busyOther:
		w("Other processes took more than %.2f cores during these runs, so the numbers say more about the "+
			"machine's load than about rebound: measure again on a quiet machine.", busyOther)
	case stop < 0:
		// Still scaling: no limit to name.
	case lim.Machine >= 0.9*float64(cpus):
		w("With %s the machine's cores were (nearly) all busy, almost all of it the broker and the replicas: "+
			"more replicas could only take CPU from the broker that every replica waits on, so on this "+
			"%d-core host the limit is the CPU the broker and rebound share, not the number of replicas.",
			nReplicas(lim.Replicas), cpus)
	case probed && busiest.Busy >= saturatedQueue && !r.Probe.Late:
		w("The machine still had idle CPU with %s, so the limit is not this host's CPU count but that queue: a "+
			"queue is one Erlang process, which runs on one core at a time, and every message goes through it "+
			"whatever the number of replicas.", nReplicas(lim.Replicas))
	default:
		w("The machine still had idle CPU with %s, so the limit is not this host's CPU count; this benchmark "+
			"does not show what it is.", nReplicas(lim.Replicas))
	}
	return strings.TrimSpace(sb.String())
}

// nReplicas is "1 replica", "2 replicas".
func nReplicas(k int) string {
	if k == 1 {
		return "1 replica"
	}
	return fmt.Sprintf("%d replicas", k)
}

func (r *replicaScaling) String() string {
	var sb strings.Builder
	sb.WriteString("\nreplicas  median msg/s  ratio  cores: process broker machine\n")
	for _, s := range r.summaries() {
		fmt.Fprintf(&sb, "%8d  %11.0f  %5.2f  %14.2f %6.2f %7.2f\n", s.Replicas, s.Rate, s.Ratio, s.Self, s.Broker, s.Machine)
	}
	for _, t := range r.Trials {
		if t.Leftover != 0 || t.Extra != 0 {
			fmt.Fprintf(&sb, "note: %d replicas round %d left %d in the inbox and %d extra copies\n", t.Replicas, t.Round+1, t.Leftover, t.Extra)
		}
	}
	return sb.String()
}
