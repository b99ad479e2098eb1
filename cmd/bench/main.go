// Command bench measures rebound on the brokers of the test matrix
// (internal/brokertest: RabbitMQ 4.3 and 3.10), prints plain tables and
// writes them to docs/BENCHMARKS.md. On each broker in turn: throughput of
// rebound, the bare amqp091-go relay and a RabbitMQ Shovel, pinned and
// unpinned, with the CPU each spends per message in this process and in
// the broker; the delay spread (copies in one delay queue, or spread over
// many as the default policy spreads them); and delay accuracy under load.
// rebound runs in this process (consumer.New from config.Load, as `rebound
// run` builds it), so that getrusage measures its CPU. The machine is
// shared, so every table gives each contender's rate over its baseline's
// in the same round. What e2e asserts (storms under a rate cap, large
// messages, replicas) is measured there, not here.
//
// Everything bench declares lives in a virtual host of its own, deleted at
// the end; pinned cores are given back after each run. A run that does not
// deliver all N messages makes bench exit with status 1.
//
//	go run ./cmd/bench                # what make bench runs
//	go run ./cmd/bench -n 2000 -runs 1 -spread 30 -delays 1s -delay-msgs 40 -bg-rate 200  # a short run
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
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
	out        string
	throughput bool
	spread     int   // delay queues bound in the spread runs; 0 to skip the spread runs
	digits     []int // REBOUND_DELAY_DIGITS of the default policy's spreads
	delays     []time.Duration
	delayMsgs  int
	bgRate     int
}

// fullRun is what make bench runs: the defaults.
const fullRun = "go run ./cmd/bench"

// short reports whether o measures less than a full run, for the report's
// header to say so.
func (o options) short() bool { return o.n < 20000 || o.runs < 5 }

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	brokers := fs.String("brokers", "4.3,3.10", "brokers of the test matrix to measure, in order, comma separated (internal/brokertest: 3.10 on 5672, 4.3 on 5674); each is measured whole before the next")
	modes := fs.String("modes", "pinned,unpinned", "how the broker and this process share the cores in the throughput runs, comma separated: pinned (the broker on CPU 0, this process on CPU 1), unpinned")
	fs.IntVar(&o.n, "n", 20000, "messages per throughput and spread run")
	fs.IntVar(&o.runs, "runs", 5, "rounds of throughput and spread runs: each contender runs once per round")
	fs.StringVar(&o.out, "out", "docs/BENCHMARKS.md", "report to write; empty for none")
	fs.BoolVar(&o.throughput, "throughput", true, "run the throughput comparison")
	fs.IntVar(&o.spread, "spread", 300, fmt.Sprintf("delay queues bound in the spread runs' routing run (at most %d); 0 to skip the spread runs", maxSpread))
	digits := fs.String("digits", "2,1", "REBOUND_DELAY_DIGITS at which the spread runs spread copies as the default policy does, comma separated (1 to 3); empty for none")
	delays := fs.String("delays", "1s,10s,60s", "delays whose accuracy to measure, comma separated; empty to skip")
	fs.IntVar(&o.delayMsgs, "delay-msgs", 200, "messages rejected once per measured delay")
	fs.IntVar(&o.bgRate, "bg-rate", 1000, "background load, messages per second through rebound, while delays are measured")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.n <= 0 || o.runs <= 0 || o.delayMsgs <= 0 || o.bgRate < 0 || o.spread < 0 || o.spread > maxSpread {
		return o, fmt.Errorf("-n, -runs and -delay-msgs must be positive, -bg-rate not negative, -spread from 0 to %d", maxSpread)
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
	for _, s := range listItems(*modes) {
		m := mode(s)
		if (m != pinnedM && m != unpinned) || slices.Contains(o.modes, m) {
			return o, fmt.Errorf("-modes: %q is not pinned or unpinned, or appears twice", s)
		}
		o.modes = append(o.modes, m)
	}
	if len(o.modes) == 0 {
		return o, fmt.Errorf("-modes: name at least one mode")
	}
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

// firstMode is the mode of the spread runs: pinned
// when pinned runs are on, since there the broker's core and the
// client's are apart.
func (o options) firstMode() mode {
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
	if err := traceSink(); err != nil {
		return err
	}
	unlock, err := lockBench()
	if err != nil {
		return err
	}
	defer unlock()
	rep := &report{started: time.Now(), args: args, opts: o, machine: describeMachine(ctx)}
	fmt.Fprint(stdout, rep.machine.String())
	for _, name := range o.brokers {
		res, err := measureBroker(ctx, brokertest.Brokers()[name], o, stdout)
		if res != nil {
			rep.brokers = append(rep.brokers, res)
		}
		if err != nil {
			return fmt.Errorf("RabbitMQ %s: %w", name, err)
		}
	}
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(rep.markdown()), 0o644); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
		fmt.Fprintf(stdout, "\nwrote %s\n", o.out)
	}
	return nil
}

// measureBroker runs every measurement on one broker.
func measureBroker(ctx context.Context, bt *brokertest.Broker, o options, stdout io.Writer) (*brokerResult, error) {
	b, err := newBroker(ctx, bt)
	if err != nil {
		return nil, err
	}
	defer b.close()
	res := &brokerResult{Name: bt.Name, Version: b.version()}
	fmt.Fprintf(stdout, "\n# RabbitMQ %s (node %s, pid %d)\n", res.Version, bt.Node, b.nodePID(ctx))
	// took prints how long a part took, for whoever sizes a run.
	since := time.Now()
	took := func(what string) {
		fmt.Fprintf(stdout, "(RabbitMQ %s: %s took %s)\n", res.Version, what, time.Since(since).Round(time.Second))
		since = time.Now()
	}
	if o.throughput {
		if err := b.ensureShovel(ctx, stdout); err != nil {
			return res, err
		}
		for _, m := range o.modes {
			s := &suite{Name: "throughput", Mode: m, Contenders: throughputContenders()}
			if err := runSuite(ctx, b, s, o, stdout); err != nil {
				return res, err
			}
			fmt.Fprint(stdout, s.table())
			res.Suites = append(res.Suites, s)
			took("throughput, " + string(m))
		}
	}
	if o.spread > 0 {
		// One mode: the spread costs the broker, whose core the pinned
		// runs set apart.
		cs, err := spreadContenders(o.spread, o.n, o.digits, topology.VersionAtLeast(res.Version, 4, 3))
		if err != nil {
			return res, err
		}
		s := &suite{Name: "delay spread", Mode: o.firstMode(), Timing: afterWarmUp, Contenders: cs}
		if err := runSuite(ctx, b, s, o, stdout); err != nil {
			return res, err
		}
		fmt.Fprint(stdout, s.table())
		res.Suites = append(res.Suites, s)
		took("delay spread")
	}
	for _, d := range o.delays {
		// RabbitMQ 3.12 and later ignore the lazy mode: one row is enough.
		lazies := []bool{false, true}
		if topology.VersionAtLeast(res.Version, 3, 12) {
			lazies = lazies[:1]
		}
		for _, lazy := range lazies {
			var r delayResult
			_, err := retrying(ctx, b, stdout, fmt.Sprintf("delay %s", d), func(int) (err error) {
				r, err = measureDelay(ctx, b, d, lazy, o, stdout)
				return err
			})
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
	return res, nil
}

// lockPath is the lock one bench holds while it runs: two at once would
// pin the same broker, and the later one would put back the earlier's
// pinning as if it were the broker's own.
func lockPath() string { return filepath.Join(os.TempDir(), "rebound-bench.lock") }

// lockBench takes lockPath, or fails when another bench holds it.
func lockBench() (unlock func(), err error) {
	f, err := os.OpenFile(lockPath(), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", lockPath(), err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another bench is running (it holds %s): %w", lockPath(), err)
	}
	return func() { f.Close() }, nil
}

// traceSink serves OTLP/HTTP on a local port that accepts and discards
// every export, and points the OpenTelemetry SDK at it (the SDK reads
// the process environment), so that the traced contender pays for its
// spans up to the wire.
func traceSink() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() {
		_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
	}()
	return os.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+l.Addr().String())
}
