package main

import (
	"fmt"
	"strings"
	"time"
)

// report is everything the report file is written from.
type report struct {
	started time.Time
	args    []string
	opts    options
	machine machine
	brokers []*brokerResult
}

// brokerResult is everything measured on one broker.
type brokerResult struct {
	Name, Version string
	Suites        []*suite // throughput per mode, then the delay spread
	Delays        []delayResult
}

// writer is a strings.Builder with Printf.
type writer struct{ strings.Builder }

func (w *writer) p(format string, a ...any) { fmt.Fprintf(&w.Builder, format, a...) }

func us(d time.Duration) string { return fmt.Sprintf("%.1f", micros(d)) } // in µs, one decimal

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// markdown renders the report: how it was made, how the runs work, then
// each broker's tables.
func (r *report) markdown() string {
	w := &writer{}
	cmd := strings.Join(append([]string{fullRun}, r.args...), " ")
	w.p("# rebound benchmarks\n\n")
	w.p("Written by `%s` on %s (it took %s); do not edit by hand: run the command again.\n\n",
		cmd, r.started.UTC().Format("2006-01-02 15:04 MST"), time.Since(r.started).Round(time.Second))
	if r.opts.short() {
		w.p("**A short run** (`-n %d`, `-runs %d`): it shows that the command works and what the tables hold; its "+
			"messages and rounds are too few for its numbers to be quoted. The full run is `make bench` (`%s`).\n\n",
			r.opts.n, r.opts.runs, fullRun)
	}
	var brokers []string
	for _, br := range r.brokers {
		brokers = append(brokers, fmt.Sprintf("RabbitMQ %s (`brokertest` %s)", br.Version, br.Name))
	}
	w.p("Machine: %s CPUs, %s, %s RAM, Linux %s; %s. Brokers: %s, single nodes on the same machine, measured "+
		"one after the other.\n\n", r.machine.CPUs, r.machine.CPUModel, r.machine.Memory, r.machine.Kernel, r.machine.Go,
		strings.Join(brokers, " and "))
	w.p("The machine is shared: other processes may use its cores while a run goes on (the *broker before* and " +
		"*others* columns say how much), so absolute rates move from one invocation to the next. Compare contenders " +
		"within one table, by its ratio column: each run's rate over the rate of the table's first contender in the " +
		"same round, the median over rounds.\n\n")
	writeMethod(w, r.opts)
	for _, br := range r.brokers {
		w.p("## RabbitMQ %s\n\n", br.Version)
		for _, s := range br.Suites {
			w.p("### %s, %s\n\n%s\n", title(s.Name), s.Mode, s.table())
			w.p("<details><summary>every run</summary>\n\n%s\n</details>\n\n", s.runsTable())
		}
		if len(br.Delays) > 0 {
			w.p("### Delay accuracy, unpinned\n%s\n", delayTable(br.Delays))
		}
	}
	return w.String()
}

func title(s string) string { return strings.ToUpper(s[:1]) + s[1:] }

// writeMethod says once how every kind of run works.
func writeMethod(w *writer, o options) {
	w.p("## How the runs work\n\n")
	w.p("A **throughput run** fills a fresh queue with N persistent messages (512-byte body, four application " +
		"headers, and the x-death entry RabbitMQ adds when it dead-letters a rejected message), starts one " +
		"contender and times it from its consumer's appearing on that queue until the destination holds all N. " +
		"Every contender acks a message only once the broker confirmed its copy; bench checks that none is " +
		"missing. Each round runs every contender once, in reverse order every other round.\n\n")
	w.p("- **rebound**: the sidecar in this process (`consumer.New` from `config.Load`, as `rebound run` builds " +
		"it), at its defaults but a constant 10-minute delay without jitter: it decides, publishes each copy " +
		"(mandatory, confirmed) to its delay queue's exchange, and acks; the copies are counted in the delay queue.\n")
	w.p("- **relay**: the bare relay, the floor any amqp091-go client can reach: one consume and one publish "+
		"connection, prefetch %d (rebound's ceiling); it publishes each delivery unchanged to a plain queue and "+
		"acks once confirmed, deciding nothing.\n", relayPrefetch)
	w.p("- **shovel**: a RabbitMQ dynamic shovel between two classic queues, `ack-mode: on-confirm`, its default " +
		"prefetch, connected inside the node: its client work is the broker's CPU.\n\n")
	w.p("**Modes.** *Pinned*: during each run every thread of the broker's node is on CPU %d and every thread of "+
		"this process on CPU %d (sched_setaffinity, as `taskset -a -p`), GOMAXPROCS 1, as for a sidecar on "+
		"another machine than the broker. *Unpinned*: as the OS schedules them.\n\n", brokerCore, clientCore)
	w.p("**CPU per message.** *Process*: this process's CPU over the timed window (getrusage): the contender's " +
		"client and bench's own polling, which is all the shovel rows show (the shovel's client runs in the " +
		"broker); *kernel* is the share of it in the kernel. *Broker*: the node's CPU (/proc/<pid>/task/*/stat), " +
		"split into schedulers (Erlang code: queues, channels, connections), dirty I/O threads (message store and " +
		"queue index writes) and the rest. *Broker before*: the node's cores busy in the quarter second before the " +
		"run (other people's work); *others*: the machine's busy cores used by neither.\n\n")
	if o.spread > 0 {
		w.p("**Delay spread** (%[1]s): rebound with its copies into one delay queue; with %[2]d delay queues "+
			"bound, each to its own exchange, the copies still into one (the cost of routing); and with its copies "+
			"spread as the default policy (exponential from 1 s to 1 h, full jitter, 10 retries) spreads them at "+
			"each `REBOUND_DELAY_DIGITS` measured (a seeded draw: copy i is retry i mod 10). Each delay is stood for "+
			"by a long one, from 10 minutes up, so that copies stay where they are counted. These runs are timed from "+
			"rebound's N/5-th confirmed copy (later if a delay queue has none yet) to its N-th, so that declaring "+
			"each queue on first use stays out of the rate.\n\n", o.firstMode(), o.spread)
	}
	if len(o.delays) > 0 {
		w.p("**Delay accuracy** (unpinned): rebound with `REBOUND_MIN_DELAY` set to the delay, no jitter; %d "+
			"messages published at 50 a second to an application queue that dead-letters to it, each rejected once "+
			"by a consumer that times its return: the error is (returned − rejected) − delay, every hop and the "+
			"rounding to a delay queue included, while %d msg/s of background load go through the same rebound "+
			"and delay queue. Before RabbitMQ 3.12 each delay is measured twice: as rebound declares the delay "+
			"queue, and lazy (the policy `deploy/rabbitmq/setup.sh` sets).\n\n", o.delayMsgs, o.bgRate)
	}
}
