package cli

// `rebound delayed`: what waits in the delay queues, and moving it. The
// broker work is in package delayed; this file parses flags and prints.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/delayed"
	"github.com/rebound-mq/rebound/internal/holder"
	"github.com/rebound-mq/rebound/policy"
)

// scanFlags are the flags that say which delay queue names to look for.
type scanFlags struct {
	digits  int
	longest time.Duration
}

func addScanFlags(fs *flag.FlagSet) *scanFlags {
	f := &scanFlags{}
	fs.IntVar(&f.digits, "digits", 0, "look for delay queues of this `precision` (1, 2 or 3 significant digits; default REBOUND_DELAY_DIGITS); 3 finds those of 1 and 2 too")
	fs.DurationVar(&f.longest, "max-delay", 0, "look for delay queues up to this `delay` (default: the longest the policies give)")
	return f
}

// delays returns the delays whose queues to look for: the grid of the
// configured (or asked for) precision, up to the longest delay the
// policies give (or the one asked for).
func (f *scanFlags) delays(cfg config.Config) ([]time.Duration, error) {
	digits, longest := cfg.DelayDigits, delayed.Longest(cfg.PolicySet())
	if f.digits != 0 {
		if f.digits < 1 || f.digits > 3 {
			return nil, usageError{fmt.Sprintf("--digits %d: want 1, 2 or 3 significant digits", f.digits)}
		}
		digits = f.digits
	}
	if f.longest != 0 {
		if f.longest < time.Millisecond {
			return nil, usageError{fmt.Sprintf("--max-delay %s: want a delay of 1ms or more", f.longest)}
		}
		longest = f.longest
	}
	return delayed.Delays(digits, longest), nil
}

// openDelayed loads the configuration, checks the scan flags and
// connects: twice when publish is set, to read on one connection and
// publish on the other (see republisher.Mover.PublishThrough). close
// closes the connections.
func openDelayed(ctx context.Context, in invocation, f *scanFlags, role string, publish bool) (dp delayed.Deployment, delays []time.Duration, close func(), err error) {
	cfg, err := loadConfig(in)
	if err != nil {
		return dp, nil, nil, err
	}
	if delays, err = f.delays(cfg); err != nil {
		return dp, nil, nil, err
	}
	d, err := newDialer(cfg, in.environ)
	if err != nil {
		return dp, nil, nil, err
	}
	conn, err := d.Dial(ctx, role)
	if err != nil {
		return dp, nil, nil, err
	}
	router := cfg.Router()
	router.Topology = router.Topology.ForServer(conn.Properties)
	dp = delayed.Deployment{Conn: conn, Router: router, ConfirmTimeout: cfg.ConfirmTimeout}
	if publish {
		if dp.PubConn, err = d.Dial(ctx, role+" publish"); err != nil {
			conn.Close()
			return dp, nil, nil, err
		}
	}
	return dp, delays, func() {
		conn.Close()
		if dp.PubConn != nil {
			dp.PubConn.Close()
		}
	}, nil
}

// findDelayed is openDelayed, and the delay queues found.
func findDelayed(ctx context.Context, in invocation, f *scanFlags, role string, publish bool) (
	dp delayed.Deployment, delays []time.Duration, queues []delayed.Queue, close func(), err error) {
	if dp, delays, close, err = openDelayed(ctx, in, f, role, publish); err != nil {
		return dp, nil, nil, nil, err
	}
	if queues, err = dp.Find(ctx, delays); err != nil {
		close()
		return dp, nil, nil, nil, fmt.Errorf("look for delay queues: %w", err)
	}
	return dp, delays, queues, close, nil
}

// delayedJSON is `rebound delayed --format json`. Its field names are
// public interface.
type delayedJSON struct {
	Queues []delayQueueJSON `json:"queues"`
	Total  int              `json:"total"`  // messages in every queue listed
	Looked int              `json:"looked"` // delay queue names looked for
	Hold   *holdQueueJSON   `json:"hold,omitempty"`
}

// delayQueueJSON is one delay queue in delayedJSON.
type delayQueueJSON struct {
	Queue     string `json:"queue"`
	DelayMs   int64  `json:"delay_ms"`
	Messages  int    `json:"messages"`
	Consumers int    `json:"consumers"`
}

const delayedUsage = `usage: rebound delayed [flags]
       rebound delayed flush|cancel --origin REGEXP [flags]

Lists the delay queues, each with its delay and the copies waiting in it
(ready: a copy a reader holds is not counted), and the total. AMQP cannot
list queues, so rebound looks for every name a delay queue of this
configuration can have (REBOUND_DELAY_QUEUE_PREFIX + milliseconds of
REBOUND_DELAY_DIGITS significant digits, up to the longest delay the
policies give: under 500 names up to an hour), each name that does not
exist costing the broker a line in its log; --digits and --max-delay widen
the search to an earlier configuration's queues.

  rebound delayed flush   sends the copies of matching origin queues back now
  rebound delayed cancel  parks them, reason cancelled`

func runDelayed(ctx context.Context, args []string, in invocation) error {
	fs := flag.NewFlagSet("delayed", flag.ContinueOnError)
	scan := addScanFlags(fs)
	format := addFormatFlag(fs)
	if done, err := parseFlags(fs, args, delayedUsage, 0, in); done || err != nil {
		return err
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	dp, delays, queues, closeConns, err := findDelayed(ctx, in, scan, "delayed", false)
	if err != nil {
		return err
	}
	defer closeConns()
	doc := delayedJSON{Queues: []delayQueueJSON{}, Looked: len(delays)}
	if doc.Hold, err = holdQueue(dp); err != nil {
		return err
	}
	for _, q := range queues {
		doc.Queues = append(doc.Queues, delayQueueJSON{Queue: q.Name, DelayMs: q.Delay.Milliseconds(), Messages: q.Messages, Consumers: q.Consumers})
		doc.Total += q.Messages
	}
	if *format == "json" {
		enc := json.NewEncoder(in.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}
	tw := tabwriter.NewWriter(in.stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "QUEUE\tDELAY\tMESSAGES\tCONSUMERS\t")
	for _, q := range queues {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t\n", q.Name, policy.FormatDuration(q.Delay), q.Messages, q.Consumers)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(in.stdout, "%d messages in %d delay queues (%d names looked for, up to %s)\n",
		doc.Total, len(queues), len(delays), policy.FormatDuration(delays[len(delays)-1]))
	if h := doc.Hold; h != nil {
		fmt.Fprintf(in.stdout, "hold queue %s: %d ready, %d holders; held copies are not counted over AMQP: "+
			"`rabbitmqctl list_queues name messages` counts them, rebound_held_messages bounds them\n", h.Queue, h.Ready, h.Holders)
	}
	return nil
}

// holdQueueJSON is the hold queue in delayedJSON: what AMQP reports of it.
// Neither AMQP 0-9-1 nor RabbitMQ's AMQP 1.0 management counts the copies
// it holds (measured on 4.3.6: both say 0).
type holdQueueJSON struct {
	Queue   string `json:"queue"`
	Ready   int    `json:"ready"`
	Holders int    `json:"holders"`
}

// holdQueue reads the hold queue of dp, nil when there is none.
func holdQueue(dp delayed.Deployment) (*holdQueueJSON, error) {
	name := dp.Router.Topology.HoldQueue().Name
	exists, err := declarer.QueueExists(dp.Conn, name)
	if err != nil || !exists {
		return nil, err
	}
	ch, err := dp.Conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("read hold queue %s: %w", name, err)
	}
	return &holdQueueJSON{Queue: name, Ready: q.Messages, Holders: q.Consumers}, nil
}

const delayedFlushUsage = `usage: rebound delayed flush --origin REGEXP --yes [flags]

Sends the copies waiting in the delay queues for the origin queues REGEXP
matches back to them now, as if their delay had ended. A copy goes back
to the queue its routing key names, where the broker would send it; one
whose queue REBOUND_ORIGIN_QUEUES does not allow, or that is one of
rebound's own, stays where it is and is reported (exit status 1).

Every other copy it reads goes back into a delay queue for the time it
still had to wait (x-retry-due-at), rounded up: later, never earlier. A
copy made by a rebound before that header, or already due, is left to
wait in place (requeued, it keeps its place in time).

Each copy is removed only once the broker has confirmed the one that
replaces it; interrupted (Ctrl-C), it loses nothing: at worst a copy is
both sent and still waiting. It holds the lock of the delay queues
meanwhile, which replicas wait for to sweep idle ones.`

const delayedCancelUsage = `usage: rebound delayed cancel --origin REGEXP --yes [flags]

Parks the copies waiting in the delay queues for the origin queues REGEXP
matches, with reason cancelled (see them with rebound parked list
--reason cancelled; replay them later with rebound parked replay). Every
other copy it reads goes back into a delay queue for the time it still
had to wait, as with flush. Each copy is removed only once the broker has
confirmed the one that replaces it; interrupted, it loses nothing.`

func runDelayedFlush(ctx context.Context, args []string, in invocation) error {
	return runDelayedMove(ctx, args, in, delayed.Flush)
}

func runDelayedCancel(ctx context.Context, args []string, in invocation) error {
	return runDelayedMove(ctx, args, in, delayed.Cancel)
}

func runDelayedMove(ctx context.Context, args []string, in invocation, op delayed.Op) error {
	name, usage, verb := "delayed flush", delayedFlushUsage, "sent back to their origin queue"
	if op == delayed.Cancel {
		name, usage, verb = "delayed cancel", delayedCancelUsage, "parked (cancelled)"
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	scan := addScanFlags(fs)
	origin := fs.String("origin", "", "the origin queues whose copies to move: "+originHelp)
	dryRun := fs.Bool("dry-run", false, "report what would be moved, change nothing")
	yes := fs.Bool("yes", false, "really move the copies")
	if done, err := parseFlags(fs, args, usage, 0, in); done || err != nil {
		return err
	}
	if *origin == "" {
		return usageError{"--origin is required: a regexp of the origin queues whose copies to move (. for all)"}
	}
	origins, err := compileOrigin(*origin)
	if err != nil {
		return err
	}
	if !*yes && !*dryRun {
		return usageError{fmt.Sprintf("%s moves waiting copies: add --yes (see what it would do first with --dry-run)", name)}
	}
	dp, _, queues, closeConns, err := findDelayed(ctx, in, scan, name, !*dryRun)
	if err != nil {
		return err
	}
	defer closeConns()
	if !*dryRun {
		var flush func()
		if dp.Tracer, flush, err = commandTracer(ctx, in); err != nil {
			return err
		}
		defer flush()
	}
	if err := commandHolders(ctx, in, dp, op, origins, *dryRun); err != nil {
		return err
	}
	progress := newProgress(in.stderr, name)
	res, err := dp.Move(ctx, queues, delayed.Options{Op: op, Origins: origins, DryRun: *dryRun, Progress: progress.show}, time.Now)
	progress.done()
	moved, would := res.Sent, ""
	if op == delayed.Cancel {
		moved = res.Parked
	}
	if *dryRun {
		moved, would = res.Matched-len(res.Kept), "would be "
	}
	fmt.Fprintf(in.stdout, "%d of %d matching copies %s%s; %d other copies %sput back for the time they still had to wait; %d read in %d delay queues\n",
		moved, res.Matched, would, verb, res.Redelayed, would, res.Read, res.Queues)
	for _, why := range slices.Sorted(maps.Keys(res.Left)) {
		fmt.Fprintf(in.stdout, "  %d left in place: %s\n", res.Left[why], why)
	}
	reportKeptCopies(in.stdout, res.Kept)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted: every copy not yet moved is still waiting: %w", err)
		}
		return err
	}
	if len(res.Kept) > 0 {
		return fmt.Errorf("%d copies that were to move stay where they were", len(res.Kept))
	}
	return nil
}

// commandHolders records op for the held copies of origins in the hold
// commands stream, when there is one (hold mode, or a hold queue being
// drained): a held copy is out of reach until it comes back to a holder,
// and the holders apply the command then, within a slice.
func commandHolders(ctx context.Context, in invocation, dp delayed.Deployment, op delayed.Op, origins *regexp.Regexp, dryRun bool) error {
	cfg, err := loadConfig(in)
	if err != nil {
		return err
	}
	topo := dp.Router.Topology
	stream := topo.HoldCommandsQueue().Name
	exists, err := declarer.QueueExists(dp.Conn, stream)
	if err != nil || !exists {
		return err
	}
	record, verb := holder.Flush, "sent back to their origin queue"
	if op == delayed.Cancel {
		record, verb = holder.Cancel, "parked (cancelled)"
	}
	if dryRun {
		fmt.Fprintf(in.stdout, "held copies of origins matching %s would be %s by the holders, within a slice (%s)\n", origins, verb, cfg.HoldSlice)
		return nil
	}
	until, err := record(ctx, dp.Conn, topo, origins, time.Now(), cfg.HoldSlice)
	if err != nil {
		return err
	}
	fmt.Fprintf(in.stdout, "recorded in %s: held copies of origins matching %s are %s by the holders as each comes back, every one by %s (two slices of %s while the holders run; rebound_hold_settlements_total shows them)\n",
		stream, origins, verb, until.UTC().Format(time.RFC3339), cfg.HoldSlice)
	return nil
}

// reportKeptCopies lists the copies a move left where they were, grouped
// by cause.
func reportKeptCopies(w io.Writer, kept []delayed.Kept) {
	reportByWhy(w, kept, "stay where they were", func(k delayed.Kept) (string, string) {
		return k.Why, fmt.Sprintf("id %s origin %s in %s", orDash(k.ID), orDash(k.Origin), k.Queue)
	})
}

// reportByWhy lists what a command left where it was, grouped by cause
// (what says what became of them), the first 20 of each cause one by one:
// describe gives an item's cause and its line.
func reportByWhy[T any](w io.Writer, items []T, what string, describe func(T) (why, line string)) {
	const maxIDs = 20
	byWhy := map[string][]string{}
	for _, item := range items {
		why, line := describe(item)
		byWhy[why] = append(byWhy[why], line)
	}
	for _, why := range slices.Sorted(maps.Keys(byWhy)) {
		lines := byWhy[why]
		fmt.Fprintf(w, "  %d %s: %s\n", len(lines), what, why)
		for i, line := range lines {
			if i == maxIDs {
				fmt.Fprintf(w, "    ... and %d more\n", len(lines)-maxIDs)
				break
			}
			fmt.Fprintf(w, "    %s\n", line)
		}
	}
}

// progress shows a command's progress on one line of stderr, when stderr
// is a terminal, at most ten times a second.
type progress struct {
	w     io.Writer // nil: not a terminal
	name  string
	last  time.Time
	shown bool
}

func newProgress(stderr io.Writer, name string) *progress {
	p := &progress{name: name}
	if f, ok := stderr.(*os.File); ok && isTerminal(f) {
		p.w = f
	}
	return p
}

func (p *progress) show(d delayed.Progress) {
	if p.w == nil || (time.Since(p.last) < 100*time.Millisecond && d.Read < d.Total) {
		return
	}
	p.last, p.shown = time.Now(), true
	fmt.Fprintf(p.w, "\rrebound %s: %d of %d copies read", p.name, d.Read, d.Total)
}

// done ends the progress line.
func (p *progress) done() {
	if p.shown {
		fmt.Fprintln(p.w)
	}
}

// isTerminal reports whether f is a terminal: a character device other
// than the null device.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(st, null)
}
