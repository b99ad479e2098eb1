// Command bench measures rebound against the local RabbitMQ and writes
// BENCHMARKS.md.
//
// It runs rebound in this process (consumer.New, configured from REBOUND_*
// variables exactly as `rebound run` is), so that its CPU can be profiled
// with runtime/pprof and measured with getrusage. Throughput runs alternate
// rebound, a RabbitMQ dynamic Shovel, the same Shovel moving rebound's
// copies into a queue like its delay queue (so that the broker's work per
// message is rebound's), and a naive one-confirm-at-a-time consumer, each
// moving N persistent 512-byte messages from one queue to another on the
// same broker; what matters is the ratio within one invocation, since the
// machine is shared. Extra runs sample the broker's queue processes to show
// what limits them. Replica runs then move the same
// messages with 1, 2, 4, … rebound sidecars on one inbox, to show where
// adding replicas stops paying, and one extra run samples the broker's
// queue processes to show why. Then it measures how close delayed retries
// come back to their intended delay under a background load, and runs the
// Go micro-benchmarks of the hot path.
//
// Every queue and exchange it declares has a unique "bench.<random>." prefix
// and is deleted after its run. A run that does not deliver all N messages
// makes bench exit with status 1.
//
//	go run ./bench -n 20000 -runs 5
//	go run ./bench -throughput=false -micro=false -delays= -out= -replicas 1,2,4  # replica runs only
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
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
	url        string
	n          int
	runs       int
	naiveN     int
	out        string
	profile    string
	delays     []time.Duration
	delayMsgs  int
	bgRate     int
	micro      bool
	throughput bool
	replicas   []int // replica counts, ascending
	backlog    int
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.url, "url", "amqp://guest:guest@127.0.0.1:5672/", "broker URL (the shovel is created on this broker with rabbitmqctl)")
	fs.IntVar(&o.n, "n", 20000, "messages per throughput run (rebound and the shovels)")
	fs.IntVar(&o.naiveN, "naive-n", 0, "messages per naive run; 0 means n/4 (the naive consumer is slow, its rate does not depend on n)")
	fs.IntVar(&o.runs, "runs", 5, "rounds of throughput and replica runs: each contender and each replica count runs once per round")
	fs.StringVar(&o.out, "out", "BENCHMARKS.md", "report to write; empty for none")
	fs.StringVar(&o.profile, "cpuprofile", os.TempDir()+"/rebound-bench.pprof", "where to write the CPU profile of rebound's profiled run")
	replicas := fs.String("replicas", "1,2,4", "replica counts to compare, comma separated: each runs that many rebound sidecars on one inbox (-n messages, -runs rounds); empty to skip")
	delays := fs.String("delays", "1s,10s,60s", "delays whose accuracy to measure, comma separated; empty to skip")
	fs.IntVar(&o.delayMsgs, "delay-msgs", 200, "messages rejected once per measured delay")
	fs.IntVar(&o.bgRate, "bg-rate", 1000, "background load, messages per second through rebound, while delays are measured")
	fs.BoolVar(&o.micro, "micro", true, "run the Go micro-benchmarks of ./policy and ./headers")
	fs.BoolVar(&o.throughput, "throughput", true, "run the throughput comparison")
	fs.IntVar(&o.backlog, "backlog", 0, "measure rebound's RSS while it drains an inbox backlog of this many messages; 0 to skip (make bench uses 1000000)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.n <= 0 || o.runs <= 0 || o.delayMsgs <= 0 || o.bgRate < 0 {
		return o, fmt.Errorf("-n, -runs and -delay-msgs must be positive, -bg-rate not negative")
	}
	if o.naiveN <= 0 {
		o.naiveN = max(o.n/4, 1)
	}
	for _, s := range strings.Split(*replicas, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
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
	for _, s := range strings.Split(*delays, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return o, fmt.Errorf("-delays: %q is not a positive Go duration", s)
		}
		o.delays = append(o.delays, d)
	}
	return o, nil
}

// run is the whole program: measure, print, write the report.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	b, err := newBroker(o.url)
	if err != nil {
		return err
	}
	defer b.close()

	rep := &report{started: time.Now(), args: args, opts: o}
	if rep.machine, err = describeMachine(ctx, b); err != nil {
		return err
	}
	fmt.Fprint(stdout, rep.machine.String())

	if o.throughput {
		if err := ensureShovel(ctx, stdout); err != nil {
			return err
		}
		if rep.throughput, err = runThroughput(ctx, b, o, stdout); err != nil {
			return err
		}
		fmt.Fprint(stdout, rep.throughput.String())
	}
	if len(o.replicas) > 0 {
		if rep.replicas, err = runReplicas(ctx, b, o, stdout); err != nil {
			return err
		}
		fmt.Fprint(stdout, rep.replicas.String())
	}
	for _, d := range o.delays {
		for _, lazy := range []bool{false, true} {
			res, err := measureDelay(ctx, b, d, lazy, o, stdout)
			for attempt := 2; err != nil && !errors.Is(err, errLost) && attempt <= 3 && ctx.Err() == nil; attempt++ {
				// As for throughput runs: the shared broker may have been restarted.
				fmt.Fprintf(stdout, "delay %s (%s delay queue) failed, not by losing messages (%v); measuring again once the broker answers, in 5s at least\n",
					d, res.mode(), err)
				if err = b.pauseBeforeRetry(ctx); err != nil {
					break
				}
				res, err = measureDelay(ctx, b, d, lazy, o, stdout)
			}
			if err != nil {
				return err
			}
			rep.delays = append(rep.delays, res)
		}
	}
	if len(rep.delays) > 0 {
		fmt.Fprint(stdout, delayTable(rep.delays))
	}
	if o.backlog > 0 {
		if rep.backlog, err = measureBacklog(ctx, b, o.backlog, stdout); err != nil {
			return err
		}
	}
	if o.micro {
		fmt.Fprintln(stdout, "\n# go test -run '^$' -bench . -benchmem ./policy/ ./headers/")
		if rep.micro, err = microBenchmarks(ctx); err != nil {
			return err
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
