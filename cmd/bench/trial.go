package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/rebound-mq/rebound/internal/topology"
)

// mode is how the broker and this process share the machine's cores.
type mode string

const (
	unpinned mode = "unpinned" // both anywhere, as the OS schedules them
	pinnedM  mode = "pinned"   // the broker on brokerCore, this process on clientCore (pin.go)
)

// timing is how a run is timed.
type timing int

const (
	// atDestination times from the contender's first consumer on the
	// source to N messages in the destination, polled every 10 ms with a
	// passive queue.declare.
	atDestination timing = iota
	// afterWarmUp times rebound from its warmUp-th confirmed copy to its
	// N-th, read from its metrics every 5 ms, so that what a fresh
	// sidecar does once (declaring each delay queue on first use) stays
	// out of the rate; the destination is counted after the run.
	afterWarmUp
)

// trial is one timed run of one contender.
type trial struct {
	Contender string
	Mode      mode
	Round     int // 0-based
	N         int // messages moved in the timed window
	Elapsed   time.Duration
	CPU       cpu    // over Elapsed
	Leftover  int    // messages still in the source after the contender stopped
	Extra     int    // copies beyond the total in the destination (duplicates)
	Attempts  int    // 1 unless an earlier attempt failed without losing messages
	Unpinned  string // when a pinned run could not be pinned: why
	// Background is the broker's CPU, in cores, over the quarter second
	// before the contender started: other people's work on the shared
	// broker, which the broker's CPU during the run includes too.
	Background float64
}

func (t trial) rate() float64 { return float64(t.N) / t.Elapsed.Seconds() }

// perMsg is CPU time per message moved.
func (t trial) perMsg(d time.Duration) time.Duration { return d / time.Duration(max(t.N, 1)) }

// suite is a set of contenders run in alternation on one broker, in one
// mode: each round runs every contender once, in order in rounds 1, 3, …
// and in reverse order in rounds 2, 4, …, so that a load that drifts over
// the invocation favours none of them.
type suite struct {
	Name       string
	Mode       mode
	Timing     timing
	Contenders []contender
	Trials     []trial
}

// runSuite runs s.Contenders opts.runs times.
func runSuite(ctx context.Context, b *broker, s *suite, o options, stdout io.Writer) error {
	fmt.Fprintf(stdout, "\n# RabbitMQ %s, %s, %s\n", b.version(), s.Name, s.Mode)
	for round := range o.runs {
		order := slices.Clone(s.Contenders)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, c := range order {
			var t trial
			attempts, err := retrying(ctx, b, stdout, c.Name+" run", func(attempt int) (err error) {
				// Each attempt has names of its own: a failed one may leave
				// its queues, full, when the broker goes away.
				prefix := fmt.Sprintf("%s%s.%s.%s.%d.%d.", b.prefix, safeName(s.Name), safeName(c.Name), s.Mode, round+1, attempt)
				t, err = runTrial(ctx, b, c, s.Mode, s.Timing, prefix, round, o.n)
				return err
			})
			if err != nil {
				return err
			}
			t.Attempts = attempts
			fmt.Fprintf(stdout, "round %d %-44s n=%-6d %6.2fs %8.0f msg/s  process %5.1f µs/msg  broker %5.1f µs/msg %s\n",
				round+1, c.Name, t.N, t.Elapsed.Seconds(), t.rate(), micros(t.perMsg(t.CPU.self)), micros(t.perMsg(t.CPU.broker)), t.Unpinned)
			s.Trials = append(s.Trials, t)
		}
	}
	return nil
}

// retrying runs f, and runs it again (three attempts in all) when it
// failed for a reason other than lost messages, once the broker answers:
// on this shared machine other tests stop and restart the broker. It
// returns the attempts made. What a failed attempt could not delete goes
// with bench's virtual host at the end.
func retrying(ctx context.Context, b *broker, stdout io.Writer, what string, f func(attempt int) error) (int, error) {
	for attempt := 1; ; attempt++ {
		err := f(attempt)
		if err == nil || errors.Is(err, errLost) || attempt == 3 || ctx.Err() != nil {
			return attempt, err
		}
		fmt.Fprintf(stdout, "%s failed, not by losing messages (%v); trying again once the broker answers, in 5s at least\n", what, err)
		if err := b.pauseBeforeRetry(ctx); err != nil {
			return attempt, err
		}
	}
}

// safeName makes a contender's name fit in a queue name.
func safeName(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, name)
}

// setup is a contender ready to start on a filled source.
type setup struct {
	src   string
	dests []string // counted together
	warm  int      // copies an afterWarmUp run lets pass before its clock starts
	start func(context.Context) (stop func() error, confirmed func() int, err error)
}

// prepare declares the queues of contender c, named with prefix, fills
// the source with n messages and returns what starts the contender. The
// queues and exchanges it declared are deleted by cleanup, also on error.
func prepare(ctx context.Context, b *broker, c contender, prefix string, n int) (s setup, cleanup func(), err error) {
	var queues, exchanges []string
	cleanup = func() {
		b.deleteQueues(queues...)
		b.deleteExchanges(exchanges...)
	}
	app := prefix + "app"
	s.warm = warmUp(n)
	if c.Kind != kindRebound {
		s.src, s.dests = prefix+"src", []string{prefix + "dst"}
		queues = append(queues, s.src, s.dests[0])
		for _, q := range queues {
			if err := b.declare(q, nil); err != nil {
				return s, cleanup, err
			}
		}
		if err := b.fill(ctx, s.src, app, n); err != nil {
			return s, cleanup, err
		}
		s.start = func(ctx context.Context) (func() error, func() int, error) {
			var stop func() error
			var err error
			if c.Kind == kindRelay {
				stop, err = startRelay(ctx, b.url, s.src, s.dests[0], relayPrefetch)
			} else {
				stop, err = b.startShovel(ctx, prefix+"shovel", s.src, s.dests[0])
			}
			return stop, func() int { return -1 }, err
		}
		return s, cleanup, nil
	}

	topo := topology.Topology{
		InboxQueue: prefix + "inbox", DeadLetterExchange: prefix + "dlx", DelayExchange: prefix + "delay",
		DelayQueuePrefix: prefix + "delay.", ParkingQueue: prefix + "parked",
		Quorum: slices.Contains(c.Env, "REBOUND_QUEUE_TYPE=quorum"), Hold: slices.Contains(c.Env, "REBOUND_DELAY_MODE=hold"),
	}
	settings := reboundSettings{Delay: retryDelay, Env: c.Env}
	delays := []time.Duration{retryDelay}
	if c.Spread != nil {
		settings.Spread = c.Spread.Sequence
		delays = c.Spread.delays()
		s.warm = max(warmUp(n), len(delays))
	}
	// Other delay queues, each bound to its exchange, beside those the
	// copies go to.
	bound := slices.Clone(delays)
	for _, d := range spreadDelays(max(c.Bound, len(delays))) {
		if len(bound) >= c.Bound {
			break
		}
		if !slices.Contains(bound, d) {
			bound = append(bound, d)
		}
	}
	queues = append(queues, app, topo.InboxQueue, topo.ParkingQueue)
	exchanges = append(exchanges, topo.DeadLetterExchange)
	for _, d := range bound {
		q, b := topo.DelayQueue(d)
		queues, exchanges = append(queues, q.Name), append(exchanges, b.Exchange)
	}
	// The copies wait in the delay queues of their delays, or in the hold
	// queue, where they are counted.
	for _, d := range delays {
		q, _ := topo.DelayQueue(d)
		s.dests = append(s.dests, q.Name)
	}
	if topo.Hold {
		s.dests, bound = []string{topo.HoldQueue().Name}, nil
		queues, exchanges = append(queues, topo.HoldQueue().Name, topo.HoldCommandsQueue().Name), append(exchanges, topo.HoldExchange().Name)
	}
	if err := b.declare(app, nil); err != nil {
		return s, cleanup, err
	}
	if err := b.declareTopology(topo, bound...); err != nil {
		return s, cleanup, err
	}
	s.src = topo.InboxQueue
	if err := b.fill(ctx, s.src, app, n); err != nil {
		return s, cleanup, err
	}
	s.start = func(ctx context.Context) (func() error, func() int, error) {
		r, err := startRebound(ctx, b.url, topo, settings)
		if err != nil {
			return nil, nil, err
		}
		return r.stop, r.confirmed, nil
	}
	return s, cleanup, nil
}

// warmUp is how many copies an afterWarmUp run lets rebound confirm
// before its clock starts, at least: enough for it to have declared
// every delay queue of a spread (prepare makes sure of it).
func warmUp(n int) int { return n / 5 }

// backgroundWindow is how long the broker's CPU is sampled before a run.
const backgroundWindow = 250 * time.Millisecond

// runTrial prepares contender c (prepare), starts it, in mode m, and times
// it as tm says; then it stops it, checks that nothing was lost and deletes
// the queues, all named with prefix. Losing messages is an error wrapping
// errLost.
func runTrial(ctx context.Context, b *broker, c contender, m mode, tm timing, prefix string, round, n int) (t trial, err error) {
	t = trial{Contender: c.Name, Mode: m, Round: round, N: n}
	s, cleanup, err := prepare(ctx, b, c, prefix, n)
	defer cleanup()
	if err != nil {
		return t, err
	}
	brokerPID := b.nodePID(ctx)
	if m == pinnedM {
		p, err := pin(brokerPID)
		if err != nil {
			t.Unpinned = err.Error()
		}
		defer func() {
			if uerr := p.unpin(); uerr != nil {
				err = errors.Join(err, fmt.Errorf("unpin: %w", uerr))
			}
		}()
	}

	bg := sampleCPU(brokerPID)
	time.Sleep(backgroundWindow)
	t.Background = sampleCPU(brokerPID).sub(bg).broker.Seconds() / backgroundWindow.Seconds()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The clock of an atDestination run starts when the contender's
	// consumer appears, which leaves out connection set-up (it differs
	// between them and is not throughput). It is watched for from before
	// the start: a shovel consumes before rabbitmqctl, which creates it,
	// has returned.
	consuming := make(chan clock, 1)
	if tm == atDestination {
		go func() {
			_, err := b.waitFor(runCtx, s.src, time.Millisecond, 30*time.Second, func(_, consumers int) bool { return consumers > 0 })
			consuming <- clock{at: time.Now(), cpu: sampleCPU(brokerPID), err: err}
		}()
	}
	stop, confirmed, err := s.start(runCtx)
	if err != nil {
		if tm == atDestination {
			cancel()
			<-consuming
		}
		return t, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()

	timeout := time.Minute + time.Duration(n)*20*time.Millisecond
	var got, early int
	switch tm {
	case atDestination:
		started := <-consuming
		if started.err != nil {
			return t, fmt.Errorf("%s did not start consuming: %w", c.Name, started.err)
		}
		// What it moved before the poll saw its consumer is left out of
		// the rate.
		t0, cpu0 := started.at, started.cpu
		if early, err = b.count(s.dests); err != nil {
			return t, err
		}
		got, err = b.waitForAll(ctx, s.dests, timeout, n)
		t.Elapsed, t.CPU, t.N = time.Since(t0), sampleCPU(brokerPID).sub(cpu0), n-early
	case afterWarmUp:
		var t0 time.Time
		var cpu0 cpu
		var from int
		got, err = waitConfirmed(ctx, confirmed, timeout, n, func(at int) {
			t0, cpu0, from = time.Now(), sampleCPU(brokerPID), at
		}, s.warm)
		t.Elapsed, t.CPU, t.N = time.Since(t0), sampleCPU(brokerPID).sub(cpu0), n-from
	}
	if errors.Is(err, errTimeout) {
		return t, fmt.Errorf("%s run %d: %d of %d messages arrived: %w (%w)", c.Name, round+1, got, n, errLost, err)
	}
	if err != nil {
		return t, fmt.Errorf("%s run %d: %w", c.Name, round+1, err)
	}

	// Let the last acks reach the broker before stopping the contender,
	// so that what it leaves behind is loss or duplication, not timing.
	time.Sleep(500 * time.Millisecond)
	stopped = true
	if err := stop(); err != nil {
		return t, fmt.Errorf("stop %s: %w", c.Name, err)
	}
	left, _, err := b.inspect(s.src)
	if err != nil {
		return t, err
	}
	moved, err := b.count(s.dests)
	if err != nil {
		return t, err
	}
	t.Leftover, t.Extra = left, moved-n
	if moved < n {
		return t, fmt.Errorf("%s run %d: destination holds %d of %d messages after stopping: %w", c.Name, round+1, moved, n, errLost)
	}
	if early > n/2 {
		return t, fmt.Errorf("%s run %d: %d of %d messages moved before the clock started: %w", c.Name, round+1, early, n, errUntimed)
	}
	return t, nil
}

// clock is when a run's clock started, and the CPU spent by then.
type clock struct {
	at  time.Time
	cpu cpu
	err error // the start was not seen
}

// confirmedEvery is how often waitConfirmed reads rebound's metrics: a
// Gather costs this process's core (pinned, rebound's) some tens of µs.
const confirmedEvery = 5 * time.Millisecond

// waitConfirmed polls confirmed every confirmedEvery; it calls warm once
// confirmed reaches from, with the count then, and returns when it reaches
// n, or an error wrapping errTimeout.
func waitConfirmed(ctx context.Context, confirmed func() int, timeout time.Duration, n int, warm func(at int), from int) (int, error) {
	deadline := time.Now().Add(timeout)
	warmed := false
	tick := time.NewTicker(confirmedEvery)
	defer tick.Stop()
	for {
		got := confirmed()
		if !warmed && got >= from {
			warm(got)
			warmed = true
		}
		if got >= n {
			return got, nil
		}
		if time.Now().After(deadline) {
			return got, fmt.Errorf("%w after %s with %d copies confirmed", errTimeout, timeout, got)
		}
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case <-tick.C:
		}
	}
}
