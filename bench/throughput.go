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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/consumer"
	"github.com/rebound-mq/rebound/republisher"
)

// The contenders. Each moves n messages, already waiting in a source queue,
// into a destination queue on the same broker, acking each source delivery
// only once its copy is confirmed.
const (
	rebound    = "rebound"     // in-process sidecar: inbox -> delay exchange -> delay queue (10 min TTL)
	shovel     = "shovel"      // dynamic shovel, ack-mode on-confirm, prefetch 256, queue to queue
	shovelSame = "shovel-same" // the same shovel, moving rebound's copies into a queue like rebound's delay queue
	naive      = "naive"       // one consumer: publish a copy, wait for its confirm, ack, next
)

var contenders = []string{rebound, shovel, shovelSame, naive}

// retryDelay is long enough that copies sit in the delay queue for the
// whole run, where they are counted.
const retryDelay = 10 * time.Minute

// trial is one timed run of one contender.
type trial struct {
	Contender string
	Round     int // 0-based; -1 for the profiled run, which is not in the ratios
	N         int
	Elapsed   time.Duration // first consumer on the source to n messages in the destination
	CPU       cpu           // over Elapsed
	RSSBefore int64         // this process's RSS after a GC, before the contender starts
	RSSPeak   int64         // peak RSS during the run
	RSSEnd    int64         // RSS when the last message arrived
	Finished  time.Time     // when the last message arrived
	Leftover  int           // messages still in the source after the contender stopped
	Extra     int           // copies beyond n in the destination (duplicates)
	Attempts  int           // 1 unless an earlier attempt failed without losing messages
}

func (t trial) rate() float64 { return float64(t.N) / t.Elapsed.Seconds() }

// throughput is the outcome of all throughput runs.
type throughput struct {
	Trials   []trial
	Profiled *trial
	Profile  string // go tool pprof -top of the profiled run
	// Probes are extra runs of the contenders that move messages at the
	// broker's pace, with their queue processes sampled.
	Probes []*trialProbe
}

// probedContenders are those whose queues are sampled in probe runs: the
// naive consumer waits on every confirm and shows nothing about the broker.
var probedContenders = []string{rebound, shovel, shovelSame}

// runThroughput alternates the contenders opts.runs times, then profiles
// one more rebound run.
func runThroughput(ctx context.Context, b *broker, o options, stdout io.Writer) (*throughput, error) {
	res := &throughput{}
	for round := range o.runs {
		for _, c := range contenders {
			n := o.n
			if c == naive {
				n = o.naiveN
			}
			t, err := runTrialRetrying(ctx, b, c, round, n, "", stdout)
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(stdout, "round %d %-12s n=%-6d %6.2fs %8.0f msg/s  process CPU %6.2fs  broker CPU %6.2fs\n",
				round+1, c, n, t.Elapsed.Seconds(), t.rate(), t.CPU.self.Seconds(), t.CPU.broker.Seconds())
			res.Trials = append(res.Trials, t)
		}
	}
	t, err := runTrialRetrying(ctx, b, rebound, -1, o.n, o.profile, stdout)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "profiled rebound n=%d %6.2fs %8.0f msg/s (profile in %s)\n", t.N, t.Elapsed.Seconds(), t.rate(), o.profile)
	res.Profiled = &t
	res.Profile, err = pprofTop(ctx, o.profile)
	if err != nil {
		return nil, err
	}
	for _, c := range probedContenders {
		p, err := runTrialProbe(ctx, b, c, o.n, stdout)
		if err != nil {
			return nil, err
		}
		res.Probes = append(res.Probes, p)
	}
	return res, nil
}

// runTrialRetrying runs a trial, and runs it again (twice at most) when it
// failed for a reason other than lost messages: on this shared machine
// other tests stop and restart the broker. A retried trial is reported.
func runTrialRetrying(ctx context.Context, b *broker, c string, round, n int, profile string, stdout io.Writer) (trial, error) {
	for attempt := 1; ; attempt++ {
		// Each attempt has names of its own: a failed one may leave its
		// queues, full, when the broker goes away before they are deleted.
		prefix := fmt.Sprintf("%s%s.%d.%d.", b.prefix, c, round+1, attempt)
		t, err := runTrial(ctx, b, c, prefix, round, n, brokerPID(ctx, b.url), profile, nil)
		t.Attempts = attempt
		if err == nil || errors.Is(err, errLost) || attempt == 3 || ctx.Err() != nil {
			return t, err
		}
		fmt.Fprintf(stdout, "%s run failed, not by losing messages (%v); running it again once the broker answers, in 5s at least\n", c, err)
		if err := b.pauseBeforeRetry(ctx); err != nil {
			return t, err
		}
		if err := b.sweep(ctx, prefix); err != nil {
			fmt.Fprintf(stdout, "could not delete what the failed run left behind (%s*): %v\n", prefix, err)
		}
	}
}

// runTrial fills a fresh source queue with n messages, starts contender c,
// times it from its first consumer on the source to n messages in the
// destination, stops it and deletes the queues, all named with prefix.
// started, if set, is called when the clock starts. Losing messages is an
// error wrapping errLost.
func runTrial(ctx context.Context, b *broker, c, prefix string, round, n, brokerPID int, profile string, started func()) (trial, error) {
	t := trial{Contender: c, Round: round, N: n}
	var (
		src, dst string
		start    func(context.Context) (stop func() error, err error)
		queues   []string
		exchs    []string
	)
	switch c {
	case rebound:
		topo := republisher.Topology{
			InboxQueue: prefix + "inbox", DeadLetterExchange: prefix + "dlx", DelayExchange: prefix + "delay",
			DelayQueuePrefix: prefix + "delay.", ParkingQueue: prefix + "parked",
		}
		delayQueue, _ := topo.DelayQueue(retryDelay)
		app := prefix + "app"
		src, dst = topo.InboxQueue, delayQueue.Name
		queues = []string{app, src, dst, topo.ParkingQueue}
		exchs = []string{topo.DeadLetterExchange, topo.DelayExchange}
		defer b.deleteQueues(queues...)
		defer b.deleteExchanges(exchs...)
		if err := b.declare(app, nil); err != nil {
			return t, err
		}
		if err := b.declareTopology(topo, retryDelay); err != nil {
			return t, err
		}
		start = func(ctx context.Context) (func() error, error) { return startRebound(ctx, b.url, topo, retryDelay) }
		if err := b.fill(ctx, src, n, deadLettered(app)); err != nil {
			return t, err
		}
	case shovel, shovelSame, naive:
		src, dst = prefix+"src", prefix+"dst"
		queues = []string{src, dst}
		defer b.deleteQueues(queues...)
		// The messages rebound gets, into plain durable queues (what the
		// shovel declares). For shovel-same, what rebound makes of them:
		// its copies, into a queue declared as its delay queue (message
		// TTL, dead-lettering), so that the broker's work per message is
		// the same as for rebound's copies.
		msg, dstArgs := deadLettered(prefix+"app"), amqp.Table(nil)
		if c == shovelSame {
			topo := republisher.Topology{DelayExchange: prefix + "delay", DelayQueuePrefix: prefix + "delay."}
			delayQueue, _ := topo.DelayQueue(retryDelay)
			msg, dstArgs = retried(topo, prefix+"app"), delayQueue.Args
		}
		if err := b.declare(src, nil); err != nil {
			return t, err
		}
		if err := b.declare(dst, dstArgs); err != nil {
			return t, err
		}
		if err := b.fill(ctx, src, n, msg); err != nil {
			return t, err
		}
		if c != naive {
			start = func(ctx context.Context) (func() error, error) {
				return startShovel(ctx, b.url, prefix+"shovel", src, dst)
			}
		} else {
			start = func(ctx context.Context) (func() error, error) { return startNaive(ctx, b.url, src, dst) }
		}
	}

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
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop, err := start(runCtx)
	if err != nil {
		pprof.StopCPUProfile()
		return t, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()

	// Starting the clock when the contender's consumer appears leaves out
	// connection set-up, which differs between them and is not throughput.
	if _, err := b.waitFor(ctx, src, time.Millisecond, 30*time.Second, func(_, consumers int) bool { return consumers > 0 }); err != nil {
		pprof.StopCPUProfile()
		return t, fmt.Errorf("%s did not start consuming: %w", c, err)
	}
	t0, cpu0 := time.Now(), sampleCPU(brokerPID)
	if started != nil {
		started()
	}
	timeout := time.Minute + time.Duration(n)*20*time.Millisecond
	got, err := b.waitFor(ctx, dst, 10*time.Millisecond, timeout, func(messages, _ int) bool { return messages >= n })
	t.Finished = time.Now()
	t.Elapsed, t.CPU = t.Finished.Sub(t0), sampleCPU(brokerPID).sub(cpu0)
	if profile != "" {
		pprof.StopCPUProfile()
	}
	t.RSSEnd, t.RSSPeak = memory()
	if errors.Is(err, errTimeout) {
		return t, fmt.Errorf("%s run %d: %d of %d messages arrived: %w (%w)", c, round+1, got, n, errLost, err)
	}
	if err != nil {
		return t, fmt.Errorf("%s run %d: watch %s: %w", c, round+1, dst, err)
	}

	// Let the last acks reach the broker before stopping the contender,
	// so that what it leaves behind is loss or duplication, not timing.
	time.Sleep(500 * time.Millisecond)
	stopped = true
	if err := stop(); err != nil {
		return t, fmt.Errorf("stop %s: %w", c, err)
	}
	left, _, err := b.inspect(src)
	if err != nil {
		return t, err
	}
	moved, _, err := b.inspect(dst)
	if err != nil {
		return t, err
	}
	t.Leftover, t.Extra = left, moved-n
	if moved < n {
		return t, fmt.Errorf("%s run %d: destination holds %d of %d messages after stopping: %w", c, round+1, moved, n, errLost)
	}
	return t, nil
}

// declareTopology declares rebound's fixed topology and the one delay
// queue, as rebound itself would on start, so that the inbox can be filled
// and the delay queue watched before it runs.
func (b *broker) declareTopology(topo republisher.Topology, delay time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch, err := b.channel()
	if err != nil {
		return err
	}
	if _, err := topo.ForServer(b.conn.Properties).Declare(b.conn); err != nil {
		return fmt.Errorf("declare rebound topology: %w", err)
	}
	if err := topo.DeclareDelayQueue(ch, delay); err != nil {
		return fmt.Errorf("declare delay queue: %w", err)
	}
	return nil
}

// startRebound runs rebound in this process with a constant delay and no
// jitter, configured through config.Load as `rebound run` is, with a no-op
// logger and a registry of its own. stop cancels it and waits for its
// drain to finish.
func startRebound(ctx context.Context, url string, topo republisher.Topology, delay time.Duration) (stop func() error, err error) {
	cfg, err := config.Load([]string{
		"REBOUND_AMQP_URL=" + url,
		"REBOUND_INBOX_QUEUE=" + topo.InboxQueue,
		"REBOUND_DEAD_LETTER_EXCHANGE=" + topo.DeadLetterExchange,
		"REBOUND_DELAY_EXCHANGE=" + topo.DelayExchange,
		"REBOUND_DELAY_QUEUE_PREFIX=" + topo.DelayQueuePrefix,
		"REBOUND_PARKING_QUEUE=" + topo.ParkingQueue,
		"REBOUND_BACKOFF=constant",
		"REBOUND_MIN_DELAY=" + delay.String(),
		"REBOUND_JITTER=none",
		"REBOUND_SHUTDOWN_GRACE=5s",
	})
	if err != nil {
		return nil, fmt.Errorf("configure rebound: %w", err)
	}
	opt, err := consumer.OptionsFrom(cfg, zap.NewNop(), consumer.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		return nil, fmt.Errorf("configure rebound: %w", err)
	}
	sidecar := consumer.New(opt)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sidecar.Run(runCtx) }()
	return func() error {
		cancel()
		return <-done
	}, nil
}

// startShovel creates a dynamic shovel from src to dst with rabbitmqctl;
// stop deletes it.
func startShovel(ctx context.Context, brokerURL, name, src, dst string) (stop func() error, err error) {
	uri, err := shovelURI(brokerURL)
	if err != nil {
		return nil, err
	}
	def, err := json.Marshal(map[string]any{
		"src-protocol": "amqp091", "src-uri": uri, "src-queue": src, "src-prefetch-count": 256,
		"dest-protocol": "amqp091", "dest-uri": uri, "dest-queue": dst,
		"ack-mode": "on-confirm",
	})
	if err != nil {
		return nil, fmt.Errorf("encode shovel definition: %w", err)
	}
	if err := rabbitmqctl(ctx, "set_parameter", "shovel", name, string(def)); err != nil {
		return nil, err
	}
	return func() error {
		// Not ctx: the shovel must go even when bench is interrupted.
		return rabbitmqctl(context.Background(), "clear_parameter", "shovel", name)
	}, nil
}

// startNaive runs what a hand-written retry consumer typically does: for
// each delivery, publish a copy, wait for that one confirm, then ack.
// stop closes its connection; unacked deliveries go back to src.
func startNaive(ctx context.Context, url, src, dst string) (stop func() error, err error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("naive: connect: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("naive: open channel: %w", err)
	}
	if err := ch.Qos(256, 0, false); err != nil {
		conn.Close()
		return nil, fmt.Errorf("naive: set prefetch: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		conn.Close()
		return nil, fmt.Errorf("naive: enable confirms: %w", err)
	}
	deliveries, err := ch.Consume(src, "", false, false, false, false, nil)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("naive: consume %s: %w", src, err)
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

// pprofTop summarises a CPU profile with `go tool pprof`: the functions
// that burn the CPU (flat) and the call paths that lead there (cumulative).
func pprofTop(ctx context.Context, path string) (string, error) {
	flat, err := goCommand(ctx, "tool", "pprof", "-top", "-nodecount=20", path)
	if err != nil {
		return "", fmt.Errorf("go tool pprof: %w", err)
	}
	cum, err := goCommand(ctx, "tool", "pprof", "-top", "-cum", "-nodecount=30", path)
	if err != nil {
		return "", fmt.Errorf("go tool pprof: %w", err)
	}
	// Both start with the same File/Type/Duration preamble; keep one.
	if i := strings.Index(cum, "Showing nodes"); i >= 0 {
		cum = cum[i:]
	}
	return flat + "\n" + cum, nil
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

// cores returns the broker's and this process's CPU seconds per wall
// second over contender c's counted runs.
func (r *throughput) cores(c string) (broker, self float64) {
	var wall float64
	for _, t := range r.Trials {
		if t.Contender == c {
			wall += t.Elapsed.Seconds()
			broker += t.CPU.broker.Seconds()
			self += t.CPU.self.Seconds()
		}
	}
	if wall == 0 {
		return 0, 0
	}
	return broker / wall, self / wall
}

// rates returns the msgs/s of contender c's counted runs.
func (r *throughput) rates(c string) []float64 {
	var out []float64
	for _, t := range r.Trials {
		if t.Contender == c {
			out = append(out, t.rate())
		}
	}
	return out
}

// ratio is the median, over rounds, of rebound's rate divided by c's rate
// in the same round: runs next to each other in time share the machine's
// load, so pairing them cancels most of its drift.
func (r *throughput) ratio(c string) float64 {
	reb, other := r.rates(rebound), r.rates(c)
	ratios := make([]float64, 0, len(reb))
	for i := range min(len(reb), len(other)) {
		ratios = append(ratios, reb[i]/other[i])
	}
	return median(ratios)
}

func (r *throughput) String() string {
	var sb strings.Builder
	sb.WriteString("\nmedian msg/s: ")
	for _, c := range contenders {
		fmt.Fprintf(&sb, "%s %.0f  ", c, median(r.rates(c)))
	}
	fmt.Fprintf(&sb, "\nmedian ratio rebound/shovel %.2f, rebound/shovel-same %.2f, rebound/naive %.2f\n",
		r.ratio(shovel), r.ratio(shovelSame), r.ratio(naive))
	for _, t := range r.Trials {
		if t.Leftover != 0 || t.Extra != 0 {
			fmt.Fprintf(&sb, "note: %s round %d left %d in the source and %d extra copies\n", t.Contender, t.Round+1, t.Leftover, t.Extra)
		}
	}
	return sb.String()
}
