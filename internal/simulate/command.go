package simulate

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/policy"
)

// This file is "rebound simulate burst" and "outage" but for the command
// line's plumbing (help, usage errors, --format, --policy), which package
// cli keeps for every command: the flags of each model, the strategies it
// plays and the table, JSON or SVG it prints.

const burstUsage = `usage: rebound simulate burst [flags]

Reproduces the discrete-time experiment of "Exploring backoff". Clients
each need one request answered. 20 % of them send their first request at
tick 0 (the spike), the others at a uniformly random tick of the first
1000; the run lasts 3000 ticks, so retries have 2000 more to drain.

The service processes 5 requests at once, each needing 5 ticks of work.
A request arriving while 5 are processed is rejected, but the rejection
itself takes 1 tick of work before the client hears it. Outstanding
requests are all those the service holds and owes a response, successes
and rejections alike; with more than 25 outstanding it is overwhelmed,
and each tick only 25 of them, drawn at random (each equally likely),
make progress: a flood of doomed retries starves the requests it could
answer. A client told of a failure at the end of tick t sends again at
tick t+1+delay, the delay drawn by its strategy and rounded to a tick.

Strategies (--strategies, comma-separated):
  NB      no backoff: retry at once (the next tick)
  CB      constant backoff: --constant ticks (5)
  URB     uniformly random backoff: U(0, --uniform-max) ticks (5)
  EB      exponential backoff: min(2^attempts, --exp-cap) ticks, attempts
          counting the requests sent, so 2, 4, 8, 16, then 30. The text
          writes max(2^attempts, 30); read as a floor, EB would never wait
          less than 30 ticks, contradicting the text's own results, so 30
          is taken as a cap.
  REB     random exponential backoff: U(0, EB's delay) ticks
  policy  the configured REBOUND_* policy (the default one, or the one
          --policy names), one tick being --tick (1s): each
          failure asks policy.Decide (retries so far, first request as the
          task start, last delay); a park decision means the client gives
          up (column "gave up")

Columns (table) and fields (json results):
  completed (completed)  clients answered within the run
  gave up (gave_up)      clients whose policy parked them
  requests, rejected     requests sent by all clients, and rejected
  p50 .. max             latency in ticks from a client's first request to
                         its answer (latency_p50, _p75, _p90, _p99, _max),
                         over every client: a percentile that falls on a
                         client never answered is "-" (json: null)
  aftershocks            how much retries come in waves: the index of
                         dispersion of retries per tick around their
                         --shock-window moving average over the first
                         --send-ticks ticks; about 1 for independent
                         retries, several for waves, about 0 for a
                         metronome (everyone on the same delay)

--format json prints {"model", "seed", "results": [...]} with one object
per strategy, field "strategy" one of NB, CB, URB, EB, REB, policy.
--svg FILE draws, per strategy, the service per tick (held, received,
rejected, first requests) and every client's latency and requests.`

const outageUsage = `usage: rebound simulate outage [flags]

Plays the configured REBOUND_* policy against a consumer whose dependency
stops and comes back, and compares it with the retries of "Exponential
Backoff or how not to crash a server".

The consumer: messages arrive as a Poisson process (--rate per second);
the consumer handles up to --concurrency at once, in queue order, calling
the dependency once per message. Set --concurrency to your consumers'
prefetch × replicas; the default, 2000, is above the roughly 950 calls
the dependency answers within the timeout, as the text's 1000 clients
were. Below that, no policy can push the dependency over. A call answered within --timeout
succeeds; one that is not is given up at --timeout: the message is
rejected, rebound's policy.Decide chooses its delay (rounded as rebound
queues it; each distinct delay is one delay queue) or parks it, and it
re-enters the queue when its delay ends (a delay of 0 goes straight back).

The dependency, as the text's server: a call is answered once it has run
for --min-latency while it holds up to --limit calls, and for
min-latency × factor^((calls − limit)/k) past that (--factor and --k,
1.05 and 15 by default, from the text's code), recomputed as the count
changes. A call its caller gave up on keeps running and counting: past
about 950 calls (with the defaults) every call times out, is retried and
adds to the count, and the dependency never comes back. At --at it stops for --outage (SIGSTOP in the
text): calls made then fail at --timeout, not at once, as the text's
client saw; they never reach it. It then resumes.

Strategies (--strategies, comma-separated, plus each --compare):
  policy     the configured policy (the default one, or the one --policy
             names)
  fixed      retry after --interval (100ms, the text's), no jitter, with the
             configured policy's budget (max retries, duration, deadline)
  immediate  retry at once, with the configured policy's budget
  --compare 'ASSIGNMENTS'  another policy: REBOUND_* assignments laid over
             the environment, e.g. --compare 'REBOUND_BACKOFF=constant
             REBOUND_MIN_DELAY=5s'; prefix a name and a colon to name it
             ('slow: REBOUND_MIN_DELAY=5s'); with --policy, the compared
             configuration's policy of that name, if it has one.
             Repeatable.

Recovered: every second from some point to --horizon is healthy, for at
least --sustain: the dependency ran, a call made then would have been
answered within --timeout, and the application queue was empty at least
once that second (the consumer kept up); and nothing waits in the delay
queues at --horizon (a run whose retries have yet to come back has not
recovered, whatever its last seconds). "recovery" is that point, in
seconds after the dependency resumed.

The policy's retry rate budget (REBOUND_RETRY_RATE) caps the policy and
each --compare; fixed and immediate stand for a consumer without rebound's
policy and run uncapped, unless --cap-all. A --compare that sets a
variable rebound does not read is refused.

Columns (table) and fields (json results):
  recovered, recovery (recovered, recovery_s: null when not recovered)
  peak rps (peak_dependency_rps)  most calls reaching the dependency in a second
  peak calls (peak_concurrency)   most calls it held, abandoned ones included
  peak delayed (peak_delayed)     most messages waiting in delay queues
  queues (delay_queues)           distinct delays used: delay queues to size
  parked (parked: {reason: count})
  attempts (attempts_p50, attempts_p99)  calls per message by the horizon
  latency (latency_p50_s, latency_p90_s, latency_p99_s)  arrival to delivery,
        over every message: "-" (null) when the percentile falls on one
        never delivered (parked or pending)
  delivered, pending (also messages in json)  pending: not delivered nor
        parked by the horizon
  backlog (backlog)                waiting in delay queues at the horizon

--format json prints {"model", "seed", "parameters", "results": [...]};
parameters holds every flag's value, given or default. --svg FILE draws,
per strategy, the dependency's load, its latency and the backlog in the
delay queues and the application queue over time.`

// Command is one "rebound simulate" subcommand once its flags are set on a
// flag set (New). The caller owns the command line: it parses the flags
// (help, usage errors), chooses the policy to play and hands it to Plan,
// then calls Run. Errors from Plan are the command line's, but for a
// --compare's configuration error, which wraps config's.
type Command struct {
	// Usage is the command's help, printed above its flags.
	Usage string
	fs    *flag.FlagSet
	check func() error
	plan  func(named *policy.Named, environ []string) error
	run   func(ctx context.Context, format, svg string, stdout io.Writer) error
}

// New sets the flags of "rebound simulate MODEL" on fs, model being burst
// or outage.
func New(model string, fs *flag.FlagSet) (*Command, error) {
	switch model {
	case "burst":
		return burstCommand(fs), nil
	case "outage":
		return outageCommand(fs), nil
	}
	return nil, fmt.Errorf("no simulate model %q: burst or outage", model)
}

// Plan checks the flags' values once they are parsed, then chooses the
// strategies to play, named the configured policy; the environment is what
// a --compare lays its assignments over.
func (c *Command) Plan(named *policy.Named, environ []string) error {
	if err := c.check(); err != nil {
		return err
	}
	return c.plan(named, environ)
}

// Run plays every strategy Plan chose and prints the summaries to stdout
// as a table or JSON (format), and the plot to the file svg unless it is
// "".
func (c *Command) Run(ctx context.Context, format, svg string, stdout io.Writer) error {
	return c.run(ctx, format, svg, stdout)
}

// burstCommand sets the flags of "rebound simulate burst" on fs.
func burstCommand(fs *flag.FlagSet) *Command {
	// The policy is set by Plan: flags come first, so that -h works
	// whatever the environment holds.
	c, b := defaultBurst(), defaultBackoffs(policy.Policy{})
	fs.IntVar(&c.Ticks, "ticks", c.Ticks, "length of the run, in ticks")
	fs.IntVar(&c.SendTicks, "send-ticks", c.SendTicks, "first requests fall in the first `n` ticks")
	fs.IntVar(&c.Clients, "clients", c.Clients, "clients, one request each to get answered")
	fs.Float64Var(&c.Spike, "spike", c.Spike, "share of clients sending their first request at tick 0")
	fs.IntVar(&c.Capacity, "capacity", c.Capacity, "requests the service processes at once")
	fs.IntVar(&c.ServiceTicks, "service-ticks", c.ServiceTicks, "ticks of work a request needs")
	fs.IntVar(&c.RejectTicks, "reject-ticks", c.RejectTicks, "ticks of work a rejection needs before the client hears it")
	fs.IntVar(&c.Overwhelmed, "overwhelmed", c.Overwhelmed, "outstanding requests past which the service is overwhelmed")
	fs.IntVar(&c.ShockWindow, "shock-window", c.ShockWindow, "ticks of the moving average the aftershock index uses")
	fs.Float64Var(&b.Constant, "constant", b.Constant, "CB's delay, in ticks")
	fs.Float64Var(&b.UniformMax, "uniform-max", b.UniformMax, "URB's largest delay, in ticks")
	fs.Float64Var(&b.ExpCap, "exp-cap", b.ExpCap, "cap on EB's and REB's delay, in ticks")
	fs.DurationVar(&b.Tick, "tick", b.Tick, "what one tick is to the policy strategy")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of every random draw")
	strategies := fs.String("strategies", strings.Join(burstStrategyNames(), ","), "comma-separated strategies to run")
	var runs []burstStrategy
	return &Command{
		Usage: burstUsage,
		fs:    fs,
		check: func() error { return c.validate() },
		plan: func(named *policy.Named, _ []string) error {
			b.Policy = named.Policy
			names, err := splitList(*strategies)
			if err != nil {
				return errors.New("--strategies: " + err.Error())
			}
			for _, name := range names {
				s, err := b.Strategy(name)
				if err != nil {
					return errors.New("--strategies: " + err.Error())
				}
				runs = append(runs, s)
			}
			return nil
		},
		run: func(ctx context.Context, format, svg string, stdout io.Writer) error {
			return playAll(ctx, stdout, playback[burstStrategy, burstResult, burstSummary]{
				model: "burst", seed: c.Seed, format: format, svg: svg, parameters: flagValues(fs),
				play:    func(s burstStrategy) (burstResult, error) { return playBurst(c, s) },
				summary: func(r burstResult) burstSummary { return r.Summary },
				plot:    func(w io.Writer, rs []burstResult) error { return writeBurstSVG(w, c, rs) },
				table:   func(w io.Writer, rows []burstSummary) error { return writeBurstTable(w, c, rows) },
			}, runs)
		},
	}
}

// outageCommand sets the flags of "rebound simulate outage" on fs.
func outageCommand(fs *flag.FlagSet) *Command {
	c := defaultOutage()
	fs.Float64Var(&c.Rate, "rate", c.Rate, "messages per second (Poisson)")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "messages the consumer handles at once (prefetch × replicas)")
	fs.DurationVar(&c.MinLatency, "min-latency", c.MinLatency, "the dependency's latency up to --limit calls")
	fs.IntVar(&c.Limit, "limit", c.Limit, "calls the dependency holds at --min-latency")
	fs.Float64Var(&c.Factor, "factor", c.Factor, "latency grows by this factor every --k calls past --limit")
	fs.Float64Var(&c.K, "k", c.K, "calls past --limit per --factor of latency")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "the consumer gives a call up after this")
	fs.DurationVar(&c.At, "at", c.At, "the dependency stops at this time")
	fs.DurationVar(&c.Outage, "outage", c.Outage, "how long the dependency stays stopped")
	fs.DurationVar(&c.Horizon, "horizon", c.Horizon, "length of the run")
	fs.DurationVar(&c.Sustain, "sustain", c.Sustain, "a recovery must hold at least this long, up to --horizon")
	fs.DurationVar(&c.Step, "step", c.Step, "time resolution (divides a second)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of every random draw")
	interval := fs.Duration("interval", 100*time.Millisecond, "the fixed strategy's retry interval")
	strategies := fs.String("strategies", "policy,fixed,immediate", "comma-separated built-in strategies to run: policy, fixed, immediate")
	capAll := fs.Bool("cap-all", false, "apply the policy's retry rate budget to fixed and immediate too (default: only the policy under test, and each --compare, is capped)")
	var compares []string
	fs.Func("compare", "another policy as REBOUND_* `assignments` over the environment, optionally 'name: ...' (repeatable)", func(s string) error {
		compares = append(compares, s)
		return nil
	})
	var runs []outageStrategy
	return &Command{
		Usage: outageUsage,
		fs:    fs,
		check: func() error {
			if err := c.validate(); err != nil {
				return err
			}
			if *interval < time.Millisecond {
				return fmt.Errorf("--interval %s: want at least 1ms (delay queues count milliseconds)", *interval)
			}
			return nil
		},
		plan: func(named *policy.Named, environ []string) error {
			p := named.Policy
			var names []string
			if strings.TrimSpace(*strategies) != "" || len(compares) == 0 {
				var err error
				if names, err = splitList(*strategies); err != nil {
					return errors.New("--strategies: " + err.Error())
				}
			}
			for _, name := range names {
				switch name {
				case "policy":
					runs = append(runs, outageStrategy{Name: name, Policy: p})
				case "fixed":
					runs = append(runs, outageStrategy{Name: name, Policy: uncapped(fixedInterval(p, *interval), *capAll)})
				case "immediate":
					runs = append(runs, outageStrategy{Name: name, Policy: uncapped(immediate(p), *capAll)})
				default:
					return fmt.Errorf("--strategies: unknown strategy %q: want policy, fixed or immediate", name)
				}
			}
			for _, raw := range compares {
				name, assignments, err := parseCompare(raw)
				if err != nil {
					return fmt.Errorf("--compare %q: %v", raw, err)
				}
				if slices.ContainsFunc(runs, func(s outageStrategy) bool { return s.Name == name }) {
					return fmt.Errorf("--compare %q: the name %q is taken; prefix another ('name: ...')", raw, name)
				}
				cmp, err := config.Load(overlay(environ, assignments))
				if err != nil {
					return fmt.Errorf("--compare %q: %w", raw, err)
				}
				if unread := unreadAssignments(assignments, cmp.Warnings); len(unread) > 0 {
					// A misspelt variable would compare the policy with itself.
					return fmt.Errorf("--compare %q: %s", raw, strings.Join(unread, "; "))
				}
				// The policy of the same name, when the comparison has one.
				cmpPolicy, ok := cmp.PolicySet().Lookup(named.Name)
				if !ok {
					cmpPolicy = cmp.PolicySet().Default()
				}
				runs = append(runs, outageStrategy{Name: name, Policy: cmpPolicy.Policy})
			}
			return nil
		},
		run: func(ctx context.Context, format, svg string, stdout io.Writer) error {
			return playAll(ctx, stdout, playback[outageStrategy, outageResult, outageSummary]{
				model: "outage", seed: c.Seed, format: format, svg: svg, parameters: flagValues(fs),
				play:    func(s outageStrategy) (outageResult, error) { return playOutage(c, s) },
				summary: func(r outageResult) outageSummary { return r.Summary },
				plot:    func(w io.Writer, rs []outageResult) error { return writeOutageSVG(w, c, rs) },
				table:   func(w io.Writer, rows []outageSummary) error { return writeOutageTable(w, c, rows) },
			}, runs)
		},
	}
}

// simulateOutput holds what every simulate subcommand prints with
// --format json. Its shape is public interface.
type simulateOutput[T any] struct {
	Model string `json:"model"`
	Seed  uint64 `json:"seed"`
	// Parameters is the scenario: every flag of the command with the
	// value it had (given or default), so that a result can be played
	// again and read without its command line.
	Parameters map[string]string `json:"parameters"`
	Results    []T               `json:"results"`
}

// flagValues returns every flag of fs with its value, for the JSON's
// parameters.
func flagValues(fs *flag.FlagSet) map[string]string {
	out := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "format" && f.Name != "svg" {
			out[f.Name] = f.Value.String()
		}
	})
	return out
}

// playback is what a simulate subcommand plays and how it reports: one
// result per strategy, summarized in a table or JSON, and plotted.
type playback[S, R, Sum any] struct {
	model, format, svg string
	seed               uint64
	parameters         map[string]string
	play               func(S) (R, error)
	summary            func(R) Sum
	plot               func(io.Writer, []R) error
	table              func(io.Writer, []Sum) error
}

// playAll plays every strategy, writes the plot if one was asked for, and
// prints the summaries as the table or JSON.
func playAll[S, R, Sum any](ctx context.Context, stdout io.Writer, p playback[S, R, Sum], strategies []S) error {
	var results []R
	out := simulateOutput[Sum]{Model: p.model, Seed: p.seed, Parameters: p.parameters}
	for _, s := range strategies {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := p.play(s)
		if err != nil {
			return err
		}
		results = append(results, r)
		out.Results = append(out.Results, p.summary(r))
	}
	if p.svg != "" {
		if err := writeFile(p.svg, func(w io.Writer) error { return p.plot(w, results) }); err != nil {
			return err
		}
	}
	if p.format == "json" {
		return writeSimulateJSON(stdout, out)
	}
	return p.table(stdout, out.Results)
}

func writeBurstTable(w io.Writer, c burstConfig, rows []burstSummary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "strategy\tcap\tclients\tcompleted\tgave up\trequests\trejected\tp50\tp75\tp90\tp99\tmax\taftershocks")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.1f\n", r.Strategy, rateText(r.RetryRate), r.Clients, r.Completed, r.GaveUp,
			r.Requests, r.Rejected, optInt(r.LatencyP50), optInt(r.LatencyP75), optInt(r.LatencyP90), optInt(r.LatencyP99), optInt(r.LatencyMax), r.Aftershocks)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	_, err := fmt.Fprintf(w, "latency in ticks from a client's first request to its answer; -: the percentile falls on clients not answered within %d ticks (seed %d)\n",
		c.Ticks, c.Seed)
	if err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

func writeOutageTable(w io.Writer, c outageConfig, rows []outageSummary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "strategy\tcap\tdeferred\trecovered\trecovery\tpeak rps\tpeak calls\tpeak delayed\tqueues\tparked\tattempts p50/p99\tlatency p50\tp90\tp99\tdelivered\tpending\tbacklog")
	for _, r := range rows {
		recovered, after := "no", "-"
		if r.Recovered {
			recovered, after = "yes", optSeconds(r.RecoveryS)
		}
		deferred := "-"
		if r.RetryRate > 0 {
			deferred = fmt.Sprintf("%d", r.Deferred+r.Overflow)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d/%d\t%s\t%s\t%s\t%d\t%d\t%d\n", r.Strategy, rateText(r.RetryRate), deferred, recovered, after,
			r.PeakDependencyRPS, r.PeakConcurrency, r.PeakDelayed, r.DelayQueues, parkedText(r.Parked),
			r.AttemptsP50, r.AttemptsP99, optSeconds(r.LatencyP50S), optSeconds(r.LatencyP90S), optSeconds(r.LatencyP99S), r.Delivered, r.Pending, r.Backlog)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	_, err := fmt.Fprintf(w, "dependency stopped from %s for %s; recovery counted from when it resumed, holding to the %s horizon for at least %s; latency from arrival to delivery, -: the percentile falls on messages never delivered (seed %d)\n",
		policy.FormatDuration(c.At), policy.FormatDuration(c.Outage), policy.FormatDuration(c.Horizon), policy.FormatDuration(c.Sustain), c.Seed)
	if err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// uncapped returns p without its retry rate budget unless capAll: the
// built-in strategies stand for what a consumer does without rebound's
// policy, which its cap is part of.
func uncapped(p policy.Policy, capAll bool) policy.Policy {
	if !capAll {
		p.RetryRate = 0
	}
	return p
}

// unreadAssignments returns the warnings (config.Config.Warnings) about
// variables that assignments set: variables rebound does not read.
func unreadAssignments(assignments, warnings []string) []string {
	var out []string
	for _, a := range assignments {
		variable, _, _ := strings.Cut(a, "=")
		for _, w := range warnings {
			if strings.HasPrefix(w, variable+" ") {
				out = append(out, w)
			}
		}
	}
	return out
}

// parseCompare reads a --compare value: an optional "name:" and then
// whitespace-separated NAME=VALUE assignments of REBOUND_* variables, each
// variable at most once. Without a name, the assignments without the
// REBOUND_ prefix name it. Values cannot hold whitespace (no policy
// variable needs it).
func parseCompare(s string) (name string, assignments []string, err error) {
	rest := strings.TrimSpace(s)
	if i := strings.IndexByte(rest, ':'); i >= 0 && !strings.ContainsAny(rest[:i], "= \t\n") {
		name, rest = rest[:i], rest[i+1:]
		if !isCompareName(name) {
			return "", nil, fmt.Errorf("name %q: want 1 to 40 letters, digits, '.', '_' or '-'", name)
		}
	}
	seen := map[string]bool{}
	var short []string
	for _, a := range strings.Fields(rest) {
		variable, _, ok := strings.Cut(a, "=")
		if !ok || !isVariable(variable) {
			return "", nil, fmt.Errorf("%q: want REBOUND_NAME=value", a)
		}
		if seen[variable] {
			return "", nil, fmt.Errorf("%s is set twice", variable)
		}
		seen[variable] = true
		assignments = append(assignments, a)
		short = append(short, strings.TrimPrefix(a, config.Prefix))
	}
	if len(assignments) == 0 {
		return "", nil, errors.New("no assignment: want REBOUND_NAME=value, space-separated")
	}
	if name == "" {
		name = strings.Join(short, " ")
	}
	return name, assignments, nil
}

// isCompareName reports whether a --compare may be named s: 1 to 40
// letters, digits, '.', '_' or '-', starting with a letter or digit.
func isCompareName(s string) bool {
	if len(s) == 0 || len(s) > 40 || strings.ContainsRune("._-", rune(s[0])) {
		return false
	}
	for _, r := range s {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("._-", r)) {
			return false
		}
	}
	return true
}

// isVariable reports whether s names a variable a --compare may set:
// REBOUND_ then upper-case letters, digits and underscores.
func isVariable(s string) bool {
	rest, ok := strings.CutPrefix(s, config.Prefix)
	if !ok || rest == "" {
		return false
	}
	for _, r := range rest {
		if !('A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// overlay returns environ with the assignments replacing any variable of
// the same name.
func overlay(environ, assignments []string) []string {
	set := map[string]bool{}
	for _, a := range assignments {
		v, _, _ := strings.Cut(a, "=")
		set[v] = true
	}
	out := make([]string, 0, len(environ)+len(assignments))
	for _, e := range environ {
		if v, _, _ := strings.Cut(e, "="); !set[v] {
			out = append(out, e)
		}
	}
	return append(out, assignments...)
}

// splitList splits a comma-separated list, refusing empty and repeated
// entries.
func splitList(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if slices.Contains(out, f) {
			return nil, fmt.Errorf("%q is listed twice", f)
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

func writeSimulateJSON[T any](w io.Writer, out simulateOutput[T]) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// writeFile writes a file through write, reporting the first error of
// either.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write plot %s: %w", path, err)
	}
	return nil
}

// rateText shows a retry rate budget: "40/s", or "-" for none.
func rateText(rate float64) string {
	if rate <= 0 {
		return "-"
	}
	return strconv.FormatFloat(rate, 'g', -1, 64) + "/s"
}

func optInt(p *int) string {
	if p == nil {
		return "-"
	}
	return strconv.Itoa(*p)
}

func optSeconds(p *float64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatFloat(*p, 'g', 3, 64) + "s"
}

// parkedText lists parked counts by reason, "0" for none.
func parkedText(parked map[string]int) string {
	if len(parked) == 0 {
		return "0"
	}
	reasons := slices.Sorted(maps.Keys(parked))
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		parts[i] = fmt.Sprintf("%s %d", r, parked[r])
	}
	return strings.Join(parts, ", ")
}
