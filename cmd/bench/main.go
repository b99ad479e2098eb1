// Command bench measures rebound on the brokers of the test matrix
// (internal/brokertest: RabbitMQ 4.3 and 3.10) and writes BENCHMARKS.md.
//
// It runs rebound in this process (consumer.New, configured from REBOUND_*
// variables exactly as `rebound run` is), so that its CPU can be profiled
// with runtime/pprof and measured with getrusage. On each broker in turn,
// throughput runs alternate rebound, a bare amqp091-go relay (the floor any
// amqp091-go client can reach), a RabbitMQ dynamic Shovel, the same Shovel
// moving rebound's copies into a queue like its delay queue, and a naive
// one-confirm-at-a-time consumer, each at its defaults, each moving N
// persistent 512-byte messages from one queue to another on the same
// broker, with the broker and this process pinned to a core each, and
// unpinned. What matters is the ratio within one invocation, since the
// machine is shared. Then: one profiled rebound run and one probed run per
// contender, which show where the CPU goes in rebound and in the broker;
// rebound with one delay queue against 300 bound and copies spread as the
// default policy spreads them at REBOUND_DELAY_DIGITS 2 and 1; the levers
// on the broker's work per copy (relay variants, prefetch); 1, 2, 4 …
// replicas on one inbox; how close delayed retries come back to their
// delay under load; a storm of rejections with and without a retry rate
// cap; rebound's binary, with the manifests' GOMEMLIMIT, moving 8 MiB
// messages (its peak RSS against the manifests' limit); rebound's memory
// under a backlog; and, once, the Go micro-benchmarks of the hot path.
//
// Every queue and exchange it declares has a unique "bench.<random>." prefix
// and is deleted after its run; pinned cores are given back after each run.
// A run that does not deliver all N messages makes bench exit with status 1.
//
//	go run ./cmd/bench -n 20000 -runs 5
//	go run ./cmd/bench -brokers 4.3 -modes pinned -throughput=false -spread 0 -replicas= -delays= -storm 0 -large 0 -micro=false -out=  # levers only
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/topology"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
		os.Exit(1)
	}
}

// options are the command-line flags.
type options struct {
	brokers    []string // names in brokertest's matrix
	modes      []mode
	n          int
	runs       int
	leverRuns  int
	naiveN     int
	out        string
	profile    string
	delays     []time.Duration
	delayMsgs  int
	bgRate     int
	micro      bool
	throughput bool
	spread     int   // delay queues bound in the spread runs; 0 to skip the spread runs
	digits     []int // REBOUND_DELAY_DIGITS of the default policy's spreads
	levers     bool  // run the lever runs
	replicas   []int // replica counts, ascending
	backlog    int
	large      int // 8 MiB messages of each large-message run; 0 to skip them
	storm      int // messages of the storms; 0 to skip them
	stormRate  int // REBOUND_RETRY_RATE of the capped storm
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	brokers := fs.String("brokers", "4.3,3.10", "brokers of the test matrix to measure, in order, comma separated (internal/brokertest: 3.10 on 5672, 4.3 on 5674); each is measured whole before the next")
	modes := fs.String("modes", "pinned,unpinned", "how the broker and this process share the cores, comma separated: pinned (the broker on CPU 0, this process on CPU 1), unpinned")
	fs.IntVar(&o.n, "n", 20000, "messages per throughput run")
	fs.IntVar(&o.naiveN, "naive-n", 0, "messages per naive run; 0 means n/4 (the naive consumer is slow, its rate does not depend on n)")
	fs.IntVar(&o.runs, "runs", 5, "rounds of throughput, spread and replica runs: each contender runs once per round")
	fs.IntVar(&o.leverRuns, "lever-runs", 3, "rounds of lever runs")
	fs.StringVar(&o.out, "out", "docs/BENCHMARKS.md", "report to write; empty for none")
	fs.StringVar(&o.profile, "cpuprofile", os.TempDir()+"/rebound-bench", "prefix of the CPU profiles of rebound's profiled runs (one per broker: <prefix>-<broker>.pprof)")
	fs.IntVar(&o.spread, "spread", 300, fmt.Sprintf("delay queues bound in the spread runs' routing run (at most %d); 0 to skip the spread runs", maxSpread))
	digits := fs.String("digits", "2,1", "REBOUND_DELAY_DIGITS at which the spread runs spread copies as the default policy does, comma separated (1 to 3); empty for none")
	fs.BoolVar(&o.levers, "levers", true, "run the lever runs (relay variants and rebound's prefetch)")
	replicas := fs.String("replicas", "1,2,4", "replica counts to compare, comma separated: each runs that many rebound sidecars on one inbox (-n messages, -runs rounds); empty to skip")
	delays := fs.String("delays", "1s,10s,60s", "delays whose accuracy to measure, comma separated; empty to skip")
	fs.IntVar(&o.delayMsgs, "delay-msgs", 200, "messages rejected once per measured delay")
	fs.IntVar(&o.bgRate, "bg-rate", 1000, "background load, messages per second through rebound, while delays are measured")
	fs.BoolVar(&o.micro, "micro", true, "run the Go micro-benchmarks of ./policy and ./headers")
	fs.BoolVar(&o.throughput, "throughput", true, "run the throughput comparison")
	fs.IntVar(&o.backlog, "backlog", 0, "measure rebound's RSS while it drains an inbox backlog of this many messages; 0 to skip (make bench uses 500000)")
	fs.IntVar(&o.large, "large", 200, "8 MiB messages of the large-message runs (rebound's binary with the manifests' GOMEMLIMIT): that many alone, half as many one in 20 among messages of 1 KiB, a quarter as many after 5000 of 1 KiB; 0 to skip them")
	fs.IntVar(&o.storm, "storm", 2000, "messages rejected at once in each storm (without a retry rate cap, then with -storm-rate); 0 to skip them")
	fs.IntVar(&o.stormRate, "storm-rate", 100, "REBOUND_RETRY_RATE of the capped storm, copies per second")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.n <= 0 || o.runs <= 0 || o.leverRuns <= 0 || o.delayMsgs <= 0 || o.bgRate < 0 || o.spread < 0 || o.spread > maxSpread {
		return o, fmt.Errorf("-n, -runs, -lever-runs and -delay-msgs must be positive, -bg-rate not negative, -spread from 0 to %d", maxSpread)
	}
	if o.large < 0 || o.storm < 0 || o.stormRate <= 0 {
		return o, fmt.Errorf("-large and -storm must not be negative, -storm-rate must be positive")
	}
	if o.naiveN <= 0 {
		o.naiveN = max(o.n/4, 1)
	}
	matrix := brokertest.Brokers()
	for _, s := range listItems(*brokers) {
		if matrix[s] == nil || slices.Contains(o.brokers, s) {
			return o, fmt.Errorf("-brokers: %q is not a broker of the matrix (3.10, 4.3), or appears twice", s)
		}
		o.brokers = append(o.brokers, s)
	}
	if len(o.brokers) == 0 {
		return o, fmt.Errorf("-brokers: name at least one broker")
	}
	for _, s := range strings.Split(*modes, ",") {
		m := mode(strings.TrimSpace(s))
		if m == "" {
			continue
		}
		if (m != pinnedM && m != unpinned) || slices.Contains(o.modes, m) {
			return o, fmt.Errorf("-modes: %q is not pinned or unpinned, or appears twice", s)
		}
		o.modes = append(o.modes, m)
	}
	if len(o.modes) == 0 {
		return o, fmt.Errorf("-modes: name at least one mode")
	}
	for _, s := range listItems(*replicas) {
		k, err := strconv.Atoi(s)
		if err != nil || k <= 0 {
			return o, fmt.Errorf("-replicas: %q is not a positive count", s)
		}
		if slices.Contains(o.replicas, k) {
			return o, fmt.Errorf("-replicas: %d appears twice", k)
		}
		o.replicas = append(o.replicas, k)
	}
	slices.Sort(o.replicas)
	for _, s := range listItems(*digits) {
		d, err := strconv.Atoi(s)
		if err != nil || d < 1 || d > 3 || slices.Contains(o.digits, d) {
			return o, fmt.Errorf("-digits: %q is not 1, 2 or 3, or appears twice", s)
		}
		o.digits = append(o.digits, d)
	}
	for _, s := range listItems(*delays) {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return o, fmt.Errorf("-delays: %q is not a positive Go duration", s)
		}
		o.delays = append(o.delays, d)
	}
	return o, nil
}

// listItems splits a comma-separated flag value into its items, trimmed,
// leaving out empty ones.
func listItems(s string) []string {
	var items []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

// profiledMode is the mode of the profiled and probed runs: pinned when
// pinned runs are on, since there the broker's core and the client's are
// apart.
func (o options) profiledMode() mode {
	if slices.Contains(o.modes, pinnedM) {
		return pinnedM
	}
	return o.modes[0]
}

// run is the whole program: measure, print, write the report.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	unlock, err := lockBench()
	if err != nil {
		return err
	}
	defer unlock()
	rep := &report{started: time.Now(), args: args, opts: o, machine: describeMachine(ctx)}
	fmt.Fprint(stdout, rep.machine.String())
	var bin string
	if o.large > 0 {
		var remove func()
		if bin, remove, err = buildRebound(ctx); err != nil {
			return fmt.Errorf("build rebound for the large-message runs: %w", err)
		}
		defer remove()
	}
	for _, name := range o.brokers {
		res, err := measureBroker(ctx, brokertest.Brokers()[name], o, bin, stdout)
		if res != nil {
			rep.brokers = append(rep.brokers, res)
		}
		if err != nil {
			return fmt.Errorf("RabbitMQ %s: %w", name, err)
		}
	}
	if o.micro {
		fmt.Fprintln(stdout, "\n# go test -run '^$' -bench . -benchmem ./policy/ ./headers/")
		rep.micro, err = microBenchmarks(ctx)
		if err != nil {
			// Not worth the broker runs' numbers: the report says so.
			rep.micro += fmt.Sprintf("\n%v\n", err)
		}
		fmt.Fprint(stdout, rep.micro)
	}
	if o.out != "" {
		previous, _ := os.ReadFile(o.out) // absent the first time
		rep.reading = keptReading(string(previous))
		if err := os.WriteFile(o.out, []byte(rep.markdown()), 0o644); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
		fmt.Fprintf(stdout, "\nwrote %s\n", o.out)
	}
	return nil
}

// measureBroker runs every measurement on one broker; bin is rebound's
// binary, for the large-message runs.
func measureBroker(ctx context.Context, bt *brokertest.Broker, o options, bin string, stdout io.Writer) (*brokerResult, error) {
	b, err := newBroker(ctx, bt)
	if err != nil {
		return nil, err
	}
	defer b.close()
	res := &brokerResult{Name: bt.Name, Version: b.version(), PID: b.nodePID(ctx)}
	fmt.Fprintf(stdout, "\n# RabbitMQ %s (node %s, pid %d)\n", res.Version, bt.Node, res.PID)
	// took prints how long a part took, for whoever sizes a run.
	since := time.Now()
	took := func(what string) {
		fmt.Fprintf(stdout, "(RabbitMQ %s: %s took %s)\n", res.Version, what, time.Since(since).Round(time.Second))
		since = time.Now()
	}
	if o.throughput || o.levers {
		if err := b.ensureShovel(ctx, stdout); err != nil {
			return res, err
		}
	}
	if o.throughput {
		for _, m := range o.modes {
			s := &suite{Name: "throughput", Mode: m, Contenders: throughputContenders(m)}
			if err := runSuite(ctx, b, s, o, stdout); err != nil {
				return res, err
			}
			fmt.Fprint(stdout, s)
			res.Throughput = append(res.Throughput, s)
			took("throughput, " + string(m))
		}
		pm := o.profiledMode()
		res.ProfilePath = fmt.Sprintf("%s-%s.pprof", o.profile, bt.Name)
		t, err := runTrialRetrying(ctx, b, reboundC, pm, atDestination, -1, o.n, res.ProfilePath, stdout)
		if err != nil {
			return res, err
		}
		fmt.Fprintf(stdout, "profiled rebound (%s) n=%d %6.2fs %8.0f msg/s (profile in %s)\n", pm, t.N, t.Elapsed.Seconds(), t.rate(), res.ProfilePath)
		res.Profiled = &t
		if res.Profile, err = readProfile(ctx, res.ProfilePath); err != nil {
			return res, err
		}
		for _, c := range []contender{reboundC, relayC, shovelC, sameC} {
			p, err := runTrialProbe(ctx, b, c, pm, o.n, stdout)
			if err != nil {
				return res, err
			}
			res.Probes = append(res.Probes, p)
		}
		took("profiled and probed runs")
	}
	if o.spread > 0 {
		// One mode: the spread costs the broker, whose core the pinned
		// runs set apart (and make bench has no time for both).
		cs, err := spreadContenders(o.spread, o.n, o.digits)
		if err != nil {
			return res, err
		}
		s := &suite{Name: "spread", Mode: o.profiledMode(), Timing: afterWarmUp, Contenders: cs}
		if err := runSuite(ctx, b, s, o, stdout); err != nil {
			return res, err
		}
		fmt.Fprint(stdout, s)
		res.Spread = append(res.Spread, s)
		took("spread")
	}
	if o.levers {
		s := &suite{Name: "levers", Mode: o.profiledMode(), Contenders: leverContenders()}
		lo := o
		lo.runs = o.leverRuns
		if err := runSuite(ctx, b, s, lo, stdout); err != nil {
			return res, err
		}
		fmt.Fprint(stdout, s)
		res.Levers = s
		took("levers")
	}
	if len(o.replicas) > 0 {
		if res.Replicas, err = runReplicas(ctx, b, o, stdout); err != nil {
			return res, err
		}
		fmt.Fprint(stdout, res.Replicas.String())
		took("replicas")
	}
	for _, d := range o.delays {
		// RabbitMQ 3.12 and later ignore the lazy mode: one row is enough.
		lazies := []bool{false, true}
		if topology.VersionAtLeast(res.Version, 3, 12) {
			lazies = lazies[:1]
		}
		for _, lazy := range lazies {
			r, err := measureDelay(ctx, b, d, lazy, o, stdout)
			for attempt := 2; err != nil && !errors.Is(err, errLost) && attempt <= 3 && ctx.Err() == nil; attempt++ {
				// As for throughput runs: the shared broker may have been restarted.
				fmt.Fprintf(stdout, "delay %s (%s delay queue) failed, not by losing messages (%v); measuring again once the broker answers, in 5s at least\n",
					d, r.mode(), err)
				if err = b.pauseBeforeRetry(ctx); err != nil {
					break
				}
				r, err = measureDelay(ctx, b, d, lazy, o, stdout)
			}
			if err != nil {
				return res, err
			}
			res.Delays = append(res.Delays, r)
		}
	}
	if len(res.Delays) > 0 {
		fmt.Fprint(stdout, delayTable(res.Delays))
		took("delays")
	}
	if o.storm > 0 {
		res.Storms, err = measureStorms(ctx, b, o.storm, o.stormRate, stdout)
		if err != nil {
			return res, err
		}
		took("storms")
	}
	if o.large > 0 {
		res.Large, err = measureLarge(ctx, b, bin, o.large, stdout)
		if err != nil {
			return res, err
		}
		took("large messages")
	}
	if o.backlog > 0 {
		if res.Backlog, err = measureBacklog(ctx, b, o.backlog, stdout); err != nil {
			return res, err
		}
		took("backlog")
	}
	return res, nil
}

// throughputContenders are the contenders of the throughput runs in mode
// m: the naive consumer waits on every confirm, so pinning cores tells
// nothing more about it.
func throughputContenders(m mode) []contender {
	cs := []contender{reboundC, relayC, shovelC, sameC}
	if m == unpinned {
		cs = append(cs, naiveC)
	}
	return cs
}

// spreadContenders are rebound with one delay queue, with k bound, and
// with its n copies spread as the default policy spreads them at each of
// digits.
func spreadContenders(k, n int, digits []int) ([]contender, error) {
	cs := []contender{reboundC, {Name: fmt.Sprintf("rebound, %d delay queues bound", k), Kind: kindRebound, Bound: k}}
	for _, d := range digits {
		sp, err := defaultPolicySpread(n, d)
		if err != nil {
			return nil, err
		}
		cs = append(cs, contender{Name: spreadName(d), Kind: kindRebound, Spread: sp})
	}
	return cs, nil
}

// spreadName names the run whose copies are spread as the default policy
// spreads them at digits.
func spreadName(digits int) string {
	return fmt.Sprintf("rebound, default policy's delays, %d digit%s", digits, map[bool]string{true: "s"}[digits > 1])
}

// lockPath is the lock one bench holds while it runs: two at once would
// pin the same broker, and the later one would put back the earlier's
// pinning as if it were the broker's own.
var lockPath = filepath.Join(os.TempDir(), "rebound-bench.lock")

// lockBench takes lockPath, or fails when another bench holds it.
func lockBench() (unlock func(), err error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", lockPath, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another bench is running (it holds %s): %w", lockPath, err)
	}
	return func() { f.Close() }, nil
}
