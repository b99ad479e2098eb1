package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/consumer"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/delayqueue"
	"github.com/rebound-mq/rebound/internal/dialer"
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
	Round     int // 0-based; -1 for extra runs (profiled, probed), which are not in the ratios
	N         int // messages moved in the timed window
	Elapsed   time.Duration
	CPU       cpu   // over Elapsed
	RSSBefore int64 // this process's RSS after a GC, before the contender starts
	RSSPeak   int64 // peak RSS during the run
	RSSEnd    int64 // RSS when the last message arrived
	Finished  time.Time
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
			n := o.n
			if c.Kind == kindNaive {
				n = o.naiveN
			}
			t, err := runTrialRetrying(ctx, b, c, s.Mode, s.Timing, round, n, "", stdout)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "round %d %-30s n=%-6d %6.2fs %8.0f msg/s  process %5.1f µs/msg  broker %5.1f µs/msg%s\n",
				round+1, c.Name, t.N, t.Elapsed.Seconds(), t.rate(), micros(t.perMsg(t.CPU.self)), micros(t.perMsg(t.CPU.broker)),
				unpinnedNote(t))
			s.Trials = append(s.Trials, t)
		}
	}
	return nil
}

func unpinnedNote(t trial) string {
	if t.Unpinned != "" {
		return "  (not pinned: " + t.Unpinned + ")"
	}
	return ""
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// runTrialRetrying runs a trial, and runs it again (twice at most) when it
// failed for a reason other than lost messages: on this shared machine
// other tests stop and restart the broker. A retried trial is reported.
func runTrialRetrying(ctx context.Context, b *broker, c contender, m mode, tm timing, round, n int, profile string, stdout io.Writer) (trial, error) {
	for attempt := 1; ; attempt++ {
		// Each attempt has names of its own: a failed one may leave its
		// queues, full, when the broker goes away before they are deleted.
		prefix := fmt.Sprintf("%s%s.%s.%d.%d.", b.prefix, safeName(c.Name), m, round+1, attempt)
		t, err := runTrial(ctx, b, c, m, tm, prefix, round, n, profile, hooks{})
		t.Attempts = attempt
		if err == nil || errors.Is(err, errLost) || attempt == 3 || ctx.Err() != nil {
			return t, err
		}
		fmt.Fprintf(stdout, "%s run failed, not by losing messages (%v); running it again once the broker answers, in 5s at least\n", c.Name, err)
		if err := b.pauseBeforeRetry(ctx); err != nil {
			return t, err
		}
		if err := b.sweep(ctx, prefix); err != nil {
			fmt.Fprintf(stdout, "could not delete what the failed run left behind (%s*): %v\n", prefix, err)
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
	total int      // copies the destinations hold at the end
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
	s.total, s.warm = n, warmUp(n)
	switch c.Kind {
	case kindRebound:
		topo := topology.Topology{
			InboxQueue: prefix + "inbox", DeadLetterExchange: prefix + "dlx", DelayExchange: prefix + "delay",
			DelayQueuePrefix: prefix + "delay.", ParkingQueue: prefix + "parked",
		}
		settings := reboundSettings{Delay: retryDelay, Prefetch: c.Prefetch}
		delays := []time.Duration{retryDelay}
		if c.Spread != nil {
			settings.Spread = c.Spread.Sequence
			delays = c.Spread.delays()
			s.warm = max(warmUp(n), len(delays))
		}
		// Other delay queues, each bound to its exchange, beside those
		// the copies go to.
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
		for _, d := range delays {
			q, _ := topo.DelayQueue(d)
			s.dests = append(s.dests, q.Name)
		}
		if err := b.declare(app, nil); err != nil {
			return s, cleanup, err
		}
		if err := b.declareTopology(topo, bound...); err != nil {
			return s, cleanup, err
		}
		s.src = topo.InboxQueue
		if err := b.fill(ctx, s.src, n, deadLettered(app)); err != nil {
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

	s.src, s.dests = prefix+"src", []string{prefix + "dst"}
	dst := s.dests[0]
	queues = append(queues, s.src, dst)
	var msg func(int) amqp.Publishing
	topo := topology.Topology{DelayExchange: prefix + "delay", DelayQueuePrefix: prefix + "delay."}
	switch c.Source {
	case deadLetteredSource:
		msg = deadLettered(app)
	case plainSource:
		msg = func(i int) amqp.Publishing { return message(i, "") }
	case copySource:
		msg = retried(topo, app)
	}
	if err := b.declare(s.src, nil); err != nil {
		return s, cleanup, err
	}
	relay := c.Relay
	if c.IntoDelayQueue {
		// A queue declared as rebound's delay queue, under the
		// destination's name. The relay publishes to it as rebound does:
		// through the delay queue's fanout exchange, the origin queue as
		// routing key; the shovel, queue to queue.
		delayQueue, _ := topo.DelayQueue(retryDelay)
		if err := b.declare(dst, delayQueue.Args); err != nil {
			return s, cleanup, err
		}
		if c.Kind == kindRelay {
			x := topo.DelayExchangeFor(retryDelay)
			exchanges = append(exchanges, x.Name)
			if err := b.declareExchange(x.Name, x.Kind); err != nil {
				return s, cleanup, err
			}
			relay.Exchange, relay.Key = x.Name, app
			if err := b.bind(dst, "", relay.Exchange); err != nil {
				return s, cleanup, err
			}
		}
	} else if err := b.declare(dst, nil); err != nil {
		return s, cleanup, err
	}
	if err := b.fill(ctx, s.src, n, msg); err != nil {
		return s, cleanup, err
	}
	noCount := func() int { return -1 }
	switch c.Kind {
	case kindRelay:
		s.start = func(ctx context.Context) (func() error, func() int, error) {
			stop, err := startRelay(ctx, b.url, s.src, dst, relay)
			return stop, noCount, err
		}
	case kindShovel, kindShovelSame:
		s.start = func(ctx context.Context) (func() error, func() int, error) {
			stop, err := b.startShovel(ctx, prefix+"shovel", s.src, dst, c.Prefetch, c.Network)
			return stop, noCount, err
		}
	case kindNaive:
		s.start = func(ctx context.Context) (func() error, func() int, error) {
			stop, err := startNaive(ctx, b.url, s.src, dst)
			return stop, noCount, err
		}
	}
	return s, cleanup, nil
}

// warmUp is how many copies an afterWarmUp run lets rebound confirm
// before its clock starts, at least: enough for it to have declared
// every delay queue of a spread (prepare makes sure of it).
func warmUp(n int) int { return n / 5 }

// backgroundWindow is how long the broker's CPU is sampled before a run.
const backgroundWindow = 250 * time.Millisecond

// hooks let a probed run act at two moments of runTrial.
type hooks struct {
	beforeStart func(src string) // the source is filled; the contender not started, nothing pinned yet
	started     func()           // the clock started
}

// runTrial prepares contender c (prepare), starts it, in mode m, and times
// it as tm says; then it stops it, checks that nothing was lost and deletes
// the queues, all named with prefix. Losing messages is an error wrapping
// errLost.
func runTrial(ctx context.Context, b *broker, c contender, m mode, tm timing, prefix string, round, n int, profile string, h hooks) (t trial, err error) {
	t = trial{Contender: c.Name, Mode: m, Round: round, N: n}
	s, cleanup, err := prepare(ctx, b, c, prefix, n)
	defer cleanup()
	if err != nil {
		return t, err
	}
	brokerPID := b.nodePID(ctx)
	if h.beforeStart != nil {
		h.beforeStart(s.src)
	}
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

	resetPeakRSS()
	t.RSSBefore, _ = memory()
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return t, fmt.Errorf("create CPU profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return t, fmt.Errorf("start CPU profile: %w", err)
		}
		defer pprof.StopCPUProfile() // a no-op once stopped below
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop, confirmed, err := s.start(runCtx)
	if err != nil {
		return t, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()

	timeout := time.Minute + time.Duration(n)*20*time.Millisecond
	var got int
	switch tm {
	case atDestination:
		// Starting the clock when the contender's consumer appears leaves
		// out connection set-up, which differs between them and is not
		// throughput.
		if _, err := b.waitFor(ctx, s.src, time.Millisecond, 30*time.Second, func(_, consumers int) bool { return consumers > 0 }); err != nil {
			return t, fmt.Errorf("%s did not start consuming: %w", c.Name, err)
		}
		t0, cpu0 := time.Now(), sampleCPU(brokerPID)
		if h.started != nil {
			h.started()
		}
		got, err = b.waitForAll(ctx, s.dests, timeout, n)
		t.Finished = time.Now()
		t.Elapsed, t.CPU = t.Finished.Sub(t0), sampleCPU(brokerPID).sub(cpu0)
	case afterWarmUp:
		var t0 time.Time
		var cpu0 cpu
		var from int
		got, err = waitConfirmed(ctx, confirmed, timeout, n, func(at int) {
			t0, cpu0, from = time.Now(), sampleCPU(brokerPID), at
			if h.started != nil {
				h.started()
			}
		}, s.warm)
		t.Finished = time.Now()
		t.Elapsed, t.CPU, t.N = t.Finished.Sub(t0), sampleCPU(brokerPID).sub(cpu0), n-from
	}
	if profile != "" {
		pprof.StopCPUProfile()
	}
	t.RSSEnd, t.RSSPeak = memory()
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
	t.Leftover, t.Extra = left, moved-s.total
	if moved < s.total {
		return t, fmt.Errorf("%s run %d: destination holds %d of %d messages after stopping: %w", c.Name, round+1, moved, s.total, errLost)
	}
	return t, nil
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

// declareTopology declares rebound's fixed topology and the delay queues
// for delays, as rebound itself would on start, so that the inbox can be
// filled and the delay queues watched before it runs.
func (b *broker) declareTopology(topo topology.Topology, delays ...time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := declarer.Declare(b.conn, topo.ForServer(b.conn.Properties)); err != nil {
		return fmt.Errorf("declare rebound topology: %w", err)
	}
	set, err := delayqueue.New(b.conn, topo, nil, time.Now)
	if err != nil {
		return err
	}
	defer set.Close()
	for _, d := range delays {
		if _, err := set.Ensure(d); err != nil {
			return fmt.Errorf("declare delay queue: %w", err)
		}
	}
	return nil
}

// reboundSettings are what a run sets of rebound's configuration.
type reboundSettings struct {
	Delay    time.Duration // REBOUND_MIN_DELAY, constant backoff, no jitter
	Prefetch int           // REBOUND_PREFETCH; 0 for the default
	// Spread, if set, replaces Delay: copies go to the delay queues of
	// these delays in turn (spread.go).
	Spread []time.Duration
	// Env is more REBOUND_* settings, after the others (the last of a
	// name wins).
	Env []string
}

// reboundRun is a sidecar running in this process.
type reboundRun struct {
	stop func() error // cancels it and waits for its drain to finish; again, returns what it did
	reg  *prometheus.Registry
}

// confirmed is how many copies the broker has confirmed to rebound so
// far, from its metrics.
func (r *reboundRun) confirmed() int { return int(r.sum("rebound_messages_retried_total")) }

// sum is the counter name's value summed over its labels, 0 when absent.
func (r *reboundRun) sum(name string) float64 {
	families, err := r.reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// startRebound runs rebound in this process with a constant delay and no
// jitter, configured through config.Load as `rebound run` is, with a no-op
// logger and a registry of its own.
func startRebound(ctx context.Context, url string, topo topology.Topology, s reboundSettings) (*reboundRun, error) {
	env := []string{
		"REBOUND_AMQP_URL=" + url,
		"REBOUND_INBOX_QUEUE=" + topo.InboxQueue,
		"REBOUND_DEAD_LETTER_EXCHANGE=" + topo.DeadLetterExchange,
		"REBOUND_DELAY_EXCHANGE=" + topo.DelayExchange,
		"REBOUND_DELAY_QUEUE_PREFIX=" + topo.DelayQueuePrefix,
		"REBOUND_PARKING_QUEUE=" + topo.ParkingQueue,
		"REBOUND_BACKOFF=constant",
		"REBOUND_SHUTDOWN_GRACE=5s",
	}
	if len(s.Spread) > 0 {
		env = append(env, spreadEnv()...)
	} else {
		env = append(env, "REBOUND_MIN_DELAY="+s.Delay.String(), "REBOUND_JITTER=none")
	}
	if s.Prefetch > 0 {
		env = append(env, fmt.Sprintf("REBOUND_PREFETCH=%d", s.Prefetch))
	}
	env = append(env, s.Env...)
	cfg, err := config.Load(env)
	if err != nil {
		return nil, fmt.Errorf("configure rebound: %w", err)
	}
	reg := prometheus.NewRegistry()
	opt := consumer.OptionsFrom(cfg, dialer.New(cfg.BrokerURLs(), nil, dialer.Client{Name: "rebound bench"}), zap.NewNop(), nil)
	opt.Metrics = consumer.NewMetrics(reg, opt.Router)
	if len(s.Spread) > 0 {
		opt.NewRand = spreadRand(s.Spread)
	}
	sc := consumer.New(opt)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sc.Run(runCtx) }()
	var once sync.Once
	var runErr error
	return &reboundRun{reg: reg, stop: func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}}, nil
}

// startConsuming starts rebound as startRebound does and waits until it
// consumes the inbox; on an error, rebound is stopped.
func (b *broker) startConsuming(ctx context.Context, topo topology.Topology, s reboundSettings) (*reboundRun, error) {
	r, err := startRebound(ctx, b.url, topo, s)
	if err != nil {
		return nil, err
	}
	if _, err := b.waitFor(ctx, topo.InboxQueue, 5*time.Millisecond, 30*time.Second, func(_, consumers int) bool { return consumers > 0 }); err != nil {
		_ = r.stop()
		return nil, fmt.Errorf("rebound did not start consuming: %w", err)
	}
	return r, nil
}

// startShovel creates a dynamic shovel from src to dst with rabbitmqctl on
// the broker, in bench's virtual host, connected directly inside the node
// unless network is set (shovelURI), with src-prefetch-count prefetch or,
// when it is 0, none (the Shovel's default, 1000); stop deletes it.
func (b *broker) startShovel(ctx context.Context, name, src, dst string, prefetch int, network bool) (stop func() error, err error) {
	uri, err := shovelURI(b.url, !network)
	if err != nil {
		return nil, err
	}
	params := map[string]any{
		"src-protocol": "amqp091", "src-uri": uri, "src-queue": src,
		"dest-protocol": "amqp091", "dest-uri": uri, "dest-queue": dst,
		"ack-mode": "on-confirm",
	}
	if prefetch > 0 {
		params["src-prefetch-count"] = prefetch
	}
	def, err := json.Marshal(params)
	if err != nil {
		return nil, fmt.Errorf("encode shovel definition: %w", err)
	}
	if _, err := b.ctl(ctx, "set_parameter", "-p", b.vhost(), "shovel", name, string(def)); err != nil {
		return nil, err
	}
	return func() error {
		// Not ctx: the shovel must go even when bench is interrupted.
		_, err := b.ctl(context.Background(), "clear_parameter", "-p", b.vhost(), "shovel", name)
		return err
	}, nil
}

// startNaive runs what a hand-written retry consumer typically does: for
// each delivery, publish a copy, wait for that one confirm, then ack.
// stop closes its connection; unacked deliveries go back to src.
func startNaive(ctx context.Context, url, src, dst string) (stop func() error, err error) {
	conn, ch, deliveries, err := consumeOn(url, src, 256, "naive")
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		conn.Close()
		return nil, fmt.Errorf("naive: enable confirms: %w", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- naiveLoop(runCtx, ch, deliveries, dst) }()
	return func() error {
		cancel()
		err := <-done
		conn.Close()
		return err
	}, nil
}

func naiveLoop(ctx context.Context, ch *amqp.Channel, deliveries <-chan amqp.Delivery, dst string) error {
	for {
		var d amqp.Delivery
		select {
		case <-ctx.Done():
			return nil
		case d = <-deliveries:
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", dst, false, false, amqp.Publishing{
			Headers: d.Headers, ContentType: d.ContentType, DeliveryMode: d.DeliveryMode,
			MessageId: d.MessageId, Timestamp: d.Timestamp, Body: d.Body,
		})
		if err != nil {
			return fmt.Errorf("naive: publish: %w", err)
		}
		ok, err := dc.WaitContext(ctx)
		if errors.Is(err, context.Canceled) {
			return nil // stopped: the delivery stays unacked and is requeued
		}
		if err != nil {
			return fmt.Errorf("naive: wait for confirm: %w", err)
		}
		if !ok {
			err = d.Nack(false, true)
		} else {
			err = d.Ack(false)
		}
		if err != nil {
			return fmt.Errorf("naive: settle delivery: %w", err)
		}
	}
}

// median returns the median of xs (the mean of the middle two for an even
// count), 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// of returns contender c's counted trials, in round order.
func (s *suite) of(c string) []trial {
	var out []trial
	for _, t := range s.Trials {
		if t.Contender == c && t.Round >= 0 {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b trial) int { return a.Round - b.Round })
	return out
}

// has reports whether contender c ran in s.
func (s *suite) has(c string) bool { return len(s.of(c)) > 0 }

// rates returns the msg/s of contender c's counted runs, in round order.
func (s *suite) rates(c string) []float64 {
	var out []float64
	for _, t := range s.of(c) {
		out = append(out, t.rate())
	}
	return out
}

// rate is the median of contender c's rates.
func (s *suite) rate(c string) float64 { return median(s.rates(c)) }

// ratio is the median, over rounds, of a's rate divided by b's rate in
// the same round: runs next to each other in time share the machine's
// load, so pairing them cancels most of its drift.
func (s *suite) ratio(a, b string) float64 {
	ra, rb := s.of(a), s.of(b)
	var ratios []float64
	for i := range min(len(ra), len(rb)) {
		ratios = append(ratios, ra[i].rate()/rb[i].rate())
	}
	return median(ratios)
}

// cores returns the broker's and this process's CPU seconds per wall
// second over contender c's counted runs.
func (s *suite) cores(c string) (broker, self float64) {
	var wall float64
	for _, t := range s.of(c) {
		wall += t.Elapsed.Seconds()
		broker += t.CPU.broker.Seconds()
		self += t.CPU.self.Seconds()
	}
	if wall == 0 {
		return 0, 0
	}
	return broker / wall, self / wall
}

// perMsg is the median over contender c's counted runs of f's CPU time
// per message moved.
func (s *suite) perMsg(c string, f func(cpu) time.Duration) time.Duration {
	var xs []float64
	for _, t := range s.of(c) {
		xs = append(xs, float64(t.perMsg(f(t.CPU))))
	}
	return time.Duration(median(xs))
}

// pollerPerMsg is the CPU bench's poller costs this process per message at
// the rate of contender c: measured in the shovel runs, where this
// process does nothing else, and scaled to c's run time. 0 without shovel
// runs.
func (s *suite) pollerPerMsg(c string) time.Duration {
	var perSecond []float64
	for _, t := range s.of(shovelC.Name) {
		perSecond = append(perSecond, t.CPU.self.Seconds()/t.Elapsed.Seconds())
	}
	if len(perSecond) == 0 || s.rate(c) == 0 {
		return 0
	}
	return time.Duration(median(perSecond) / s.rate(c) * float64(time.Second))
}

// clientPerMsg is contender c's own CPU per message: this process's, less
// the poller's. For the shovels it is 0: their client runs in the broker.
func (s *suite) clientPerMsg(c string) time.Duration {
	if c == shovelC.Name || c == sameC.Name {
		return 0
	}
	return max(s.perMsg(c, func(x cpu) time.Duration { return x.self })-s.pollerPerMsg(c), 0)
}

func (s *suite) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s, %s: median msg/s", s.Name, s.Mode)
	for _, c := range s.Contenders {
		fmt.Fprintf(&sb, "  %s %.0f", c.Name, s.rate(c.Name))
	}
	sb.WriteString("\n")
	for _, t := range s.Trials {
		if t.Leftover != 0 || t.Extra != 0 {
			fmt.Fprintf(&sb, "note: %s round %d left %d in the source and %d extra copies\n", t.Contender, t.Round+1, t.Leftover, t.Extra)
		}
	}
	return sb.String()
}
