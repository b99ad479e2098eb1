package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rebound-mq/rebound/config"
)

// Readings bench writes from the numbers of the run: the targets, with
// what bounds those not met, and per suite what limited throughput. Every
// number they cite comes from the same invocation.

// The targets.
const (
	spreadTarget = 0.9 // throughput with copies over many delay queues ÷ throughput with one
	shovelTarget = 1.0 // rebound ÷ the Shovel, each at its defaults, pinned
	cpuTarget    = 1.1 // rebound's client CPU per message ÷ the bare relay's, pinned
)

// busyBroker is how much CPU the broker may use for others before a run
// before the reading says its CPU per message is not the contenders' alone.
const busyBroker = 0.1

// saturated is the share of a core above which a process counts as
// having used all of it.
const saturated = 0.9

// verdict is one target on one broker.
type verdict struct {
	Target   string
	Broker   string // the version
	Runs     string // which runs: "pinned", "unpinned"
	Measured string // "" when not measured
	Met      bool
	Bound    string // when not met: what bounds it, with numbers
}

// spreadRoles returns a spread suite's contenders by role: one delay
// queue, delay queues bound (nil when not run), and the policy's spreads.
func spreadRoles(s *suite) (one contender, bound *contender, spreads []contender) {
	for i, c := range s.Contenders {
		switch {
		case i == 0:
			one = c
		case c.Spread != nil:
			spreads = append(spreads, c)
		case c.Bound > 0:
			bound = &s.Contenders[i]
		}
	}
	return one, bound, spreads
}

// spreadTargetName is the target of a spread run.
func spreadTargetName(c contender) string {
	return fmt.Sprintf("copies spread as the default policy spreads them at REBOUND_DELAY_DIGITS=%d (%d delay queues) ≥ %.1f× into one",
		c.Spread.Digits, len(c.Spread.Queues), spreadTarget)
}

// targets returns every target's verdict on every broker measured.
func targets(brs []*brokerResult) []verdict {
	var vs []verdict
	for _, br := range brs {
		for _, s := range br.Spread {
			one, bound, spreads := spreadRoles(s)
			if bound != nil {
				r := s.ratio(bound.Name, one.Name)
				v := verdict{Target: fmt.Sprintf("throughput with %d delay queues bound ≥ %.1f× with one", bound.Bound, spreadTarget),
					Broker: br.Version, Runs: string(s.Mode), Measured: fmt.Sprintf("%.2f", r), Met: r >= spreadTarget}
				if !v.Met {
					v.Bound = routingBound(s, one, *bound)
				}
				vs = append(vs, v)
			}
			for _, c := range spreads {
				r := s.ratio(c.Name, one.Name)
				v := verdict{Target: spreadTargetName(c), Broker: br.Version, Runs: string(s.Mode), Measured: fmt.Sprintf("%.2f", r),
					Met: r >= spreadTarget}
				if !v.Met {
					v.Bound = spreadBound(s, one, c, spreads)
				}
				vs = append(vs, v)
			}
		}
	}
	for _, br := range brs {
		v := verdict{Target: fmt.Sprintf("rebound ≥ %.1f× the Shovel, each at its defaults", shovelTarget), Broker: br.Version, Runs: string(pinnedM)}
		if s := br.suite("throughput", pinnedM); s != nil && s.has(shovelC.Name) {
			ratio := s.ratio(reboundC.Name, shovelC.Name)
			v.Measured = fmt.Sprintf("%.2f (%.0f and %.0f msg/s)", ratio, s.rate(reboundC.Name), s.rate(shovelC.Name))
			v.Met = ratio >= shovelTarget
			if !v.Met {
				v.Bound = shovelBound(s, br.Levers)
			}
		}
		vs = append(vs, v)
	}
	for _, br := range brs {
		v := verdict{Target: fmt.Sprintf("rebound's CPU per message ≤ %.1f× the bare relay's", cpuTarget), Broker: br.Version, Runs: string(pinnedM)}
		if s := br.suite("throughput", pinnedM); s != nil && s.has(reboundC.Name) && s.has(relayC.Name) {
			reb, rel := s.clientPerMsg(reboundC.Name), s.clientPerMsg(relayC.Name)
			ratio := float64(reb) / float64(max(rel, 1))
			v.Measured = fmt.Sprintf("%.2f (%s and %s µs)", ratio, us(reb), us(rel))
			v.Met = ratio <= cpuTarget
			if !v.Met {
				v.Bound = cpuBound(s, br)
			}
		}
		vs = append(vs, v)
	}
	for _, br := range brs {
		vs = append(vs, largeVerdicts(br)...)
	}
	for _, br := range brs {
		if v, ok := stormVerdict(br); ok {
			vs = append(vs, v)
		}
	}
	return vs
}

// brokerPerMsg is the broker's CPU per message in c's runs of s.
func brokerPerMsg(s *suite, c string) time.Duration {
	return s.perMsg(c, func(x cpu) time.Duration { return x.broker })
}

// routingBound says what the broker did more per copy with the delay
// queues bound and the copies still into one.
func routingBound(s *suite, one, bound contender) string {
	b1, bb := brokerPerMsg(s, one.Name), brokerPerMsg(s, bound.Name)
	var sb strings.Builder
	fmt.Fprintf(&sb, "Per copy the broker spent %s µs of CPU with one delay queue and %s µs with %d bound (%+.0f %%). ",
		us(b1), us(bb), bound.Bound, pct(bb, b1))
	if pct(bb, b1) < 5 {
		sb.WriteString("With them bound and the copies still into one queue the broker did no more per copy, so the " +
			"rate lost there is not routing work (each delay queue's exchange has one binding): the machine's load, or " +
			"too short a run; measure again.")
	} else {
		sch := func(c string) time.Duration { return threadPerMsg(s, c, schedulerThreads) }
		fmt.Fprintf(&sb, "With them bound and the copies still into one queue the broker did more per copy, %s µs in "+
			"its schedulers against %s with one (%+.0f %%): what differs from one queue is the other "+
			"delay queues and their exchanges.", us(sch(bound.Name)), us(sch(one.Name)), pct(sch(bound.Name), sch(one.Name)))
	}
	return sb.String()
}

// threadPerMsg is the CPU per message of the broker's threads of kind k
// in c's runs of s.
func threadPerMsg(s *suite, c string, k threadKind) time.Duration {
	return s.perMsg(c, func(x cpu) time.Duration { return x.threads[k] })
}

// spreadBound says what the broker did more per copy with the copies
// spread as the default policy spreads them at c's digits, and, when the
// suite has spreads at more digits, what fewer digits saved.
func spreadBound(s *suite, one, c contender, spreads []contender) string {
	b1, bs := brokerPerMsg(s, one.Name), brokerPerMsg(s, c.Name)
	io, sch := func(n string) time.Duration { return threadPerMsg(s, n, dirtyIOThreads) }, func(n string) time.Duration { return threadPerMsg(s, n, schedulerThreads) }
	var sb strings.Builder
	fmt.Fprintf(&sb, "Per copy the broker spent %s µs of CPU with one delay queue and %s µs with the copies over the %d "+
		"delay queues the default policy uses at %d digit(s) (%+.0f %%), the busiest of which took %.0f %% of them. "+
		"Its dirty I/O threads (file writes and syncs) went from %s to %s µs per copy and its schedulers from %s to %s: "+
		"each queue process writes and confirms its own copies, with fewer to batch than one busy queue has. That is "+
		"the broker's work per queue, whoever publishes.", us(b1), us(bs), len(c.Spread.Queues), c.Spread.Digits, pct(bs, b1),
		c.Spread.Busiest*100, us(io(one.Name)), us(io(c.Name)), us(sch(one.Name)), us(sch(c.Name)))
	for _, o := range spreads {
		if o.Spread.Digits <= c.Spread.Digits {
			continue
		}
		bo := brokerPerMsg(s, o.Name)
		fmt.Fprintf(&sb, " At %d digit(s) the policy uses %d delay queues, not %d, and ", c.Spread.Digits, len(c.Spread.Queues), len(o.Spread.Queues))
		if bs < bo {
			fmt.Fprintf(&sb, "the broker spent %s µs per copy, not %s (rebound ran at %.2f× one queue, not %.2f×): fewer queues "+
				"take less, but each still writes and confirms its own copies.", us(bs), us(bo), s.ratio(c.Name, one.Name), s.ratio(o.Name, one.Name))
		} else {
			fmt.Fprintf(&sb, "yet the broker spent no less per copy (%s µs, against %s; rebound ran at %.2f× one queue, "+
				"against %.2f×): past some tens of queues, each with a share of the copies, fewer of them do not make the "+
				"broker's work per copy smaller.", us(bs), us(bo), s.ratio(c.Name, one.Name), s.ratio(o.Name, one.Name))
		}
	}
	return sb.String()
}

// pct is how much larger a is than b, in percent.
func pct(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return (float64(a)/float64(b) - 1) * 100
}

// shovelBound says what bounds rebound against the Shovel, pinned, with
// what the levers (if they ran in the same mode) add.
func shovelBound(s *suite, levers *suite) string {
	brokerCores, _ := s.cores(reboundC.Name)
	reb, rel, sh := brokerPerMsg(s, reboundC.Name), brokerPerMsg(s, relayC.Name), brokerPerMsg(s, shovelC.Name)
	var sb strings.Builder
	if brokerCores >= saturated {
		fmt.Fprintf(&sb, "The broker has one core in these runs and used %.2f of it while rebound ran: its CPU per copy "+
			"sets the rate. It spent %s µs per copy for rebound, %s µs for the relay and %s µs for the Shovel, "+
			"whose own client work runs inside it. ", brokerCores, us(reb), us(rel), us(sh))
	} else {
		fmt.Fprintf(&sb, "The broker used %.2f of its one core while rebound ran, so the broker's CPU was not the "+
			"only limit: rebound's window of unconfirmed copies (its prefetch) and the round trips between the two "+
			"cores bound it too. Per copy the broker spent %s µs for rebound, %s µs for the relay and %s µs for the "+
			"Shovel. ", brokerCores, us(reb), us(rel), us(sh))
	}
	if s.has(relayC.Name) {
		relayShovel, rebRelay := s.ratio(relayC.Name, shovelC.Name), s.ratio(reboundC.Name, relayC.Name)
		fmt.Fprintf(&sb, "The bare relay, which decodes nothing and decides nothing, reached %.2f× the Shovel: that is "+
			"the bound for any amqp091-go client moving these messages on this broker, and rebound reached %.2f of "+
			"the relay's rate", relayShovel, rebRelay)
		if reb > rel {
			fmt.Fprintf(&sb, " (%s µs more broker CPU per copy than the relay: its copies carry the retry headers "+
				"and go through an exchange into a queue with a TTL).", us(reb-rel))
		} else {
			sb.WriteString(", for no more broker CPU per copy than the relay.")
		}
	}
	if levers != nil && levers.Mode == s.Mode && levers.has(leverReboundFetch) && levers.has(leverShovelFetch) {
		fmt.Fprintf(&sb, " In the lever runs, prefetch %[1]d took rebound to %.2[2]f× its rate at its default and the Shovel to %.2[3]f× "+
			"its own: at %[1]d both, rebound reached %.2[4]f× the Shovel.", leverPrefetch, levers.ratio(leverReboundFetch, reboundC.Name),
			levers.ratio(leverShovelFetch, shovelC.Name), levers.ratio(leverReboundFetch, leverShovelFetch))
	}
	return sb.String()
}

// cpuBound says what bounds rebound's CPU per message.
func cpuBound(s *suite, br *brokerResult) string {
	reb := s.clientPerMsg(reboundC.Name)
	var sb strings.Builder
	if s.has(relayC.Name) {
		rel := s.clientPerMsg(relayC.Name)
		fmt.Fprintf(&sb, "The relay, which only moves frames through amqp091-go, costs %s µs per message: no amqp091-go "+
			"client can move these messages for less on this machine. rebound costs %s µs more (%+.0f %%), what it does "+
			"that the relay does not: decode the headers, decide, write the copy's headers, publish mandatory and watch "+
			"for returns. ", us(rel), us(reb-rel), pct(reb, rel))
	}
	if l := br.Levers; l != nil && l.Mode == s.Mode && l.has(leverNoXDeath) && l.has(relayC.Name) {
		self := func(c string) time.Duration { return l.perMsg(c, func(x cpu) time.Duration { return x.self }) }
		fmt.Fprintf(&sb, "Part of it is the messages' x-death entry, a nested table amqp091-go decodes on every delivery "+
			"(and the relay encodes again): in the lever runs the relay's process CPU was %s µs per message with it and "+
			"%s µs without; rebound gets x-death from the broker on every message it consumes. ", us(self(relayC.Name)), us(self(leverNoXDeath)))
	}
	if p := br.Profile; p != nil && len(p.Buckets) > 0 && br.Profiled != nil && br.Profiled.Mode == s.Mode {
		process := s.perMsg(reboundC.Name, func(x cpu) time.Duration { return x.self })
		var parts []string
		for i, b := range p.Buckets {
			if i > 3 {
				break
			}
			name, _, _ := strings.Cut(b.Name, ":")
			parts = append(parts, fmt.Sprintf("%s %.1f µs", name, b.Share*micros(process)))
		}
		fmt.Fprintf(&sb, "Per message, from the profile: %s.", strings.Join(parts, ", "))
	}
	return strings.TrimSpace(sb.String())
}

// throughputReading says what limited a throughput suite.
func throughputReading(s *suite, cpus int) string {
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	w("**What limits throughput** (written by bench from the numbers above): rebound moved %.0f msg/s", s.rate(reboundC.Name))
	var ratios []string
	for _, c := range s.Contenders {
		if c.Name != reboundC.Name {
			ratios = append(ratios, fmt.Sprintf("%.2f× the %s", s.ratio(reboundC.Name, c.Name), c.Name))
		}
	}
	if len(ratios) > 0 {
		w(", %s", strings.Join(ratios, ", "))
	}
	brokerCores, selfCores := s.cores(reboundC.Name)
	var others []float64
	for _, t := range s.of(reboundC.Name) {
		others = append(others, t.CPU.others().Seconds()/t.Elapsed.Seconds())
	}
	other := median(others)
	var backgrounds []float64
	for _, t := range s.Trials {
		backgrounds = append(backgrounds, t.Background)
	}
	background := median(backgrounds)
	w(". While rebound ran, the broker used %.2f cores, this process %.2f and other processes %.2f. ", brokerCores, selfCores, other)
	reb, rel := brokerPerMsg(s, reboundC.Name), brokerPerMsg(s, relayC.Name)
	switch {
	case other > busyOther:
		w("Other processes took more than %.2f cores, so these rates say as much about the machine's load as "+
			"about the contenders: compare the ratios only.", busyOther)
	case background > busyBroker:
		w("Before the runs the broker was already using %.2f cores (median) for other people's work, which its CPU "+
			"per message includes: compare the ratios only.", background)
	case s.Mode == pinnedM && brokerCores >= saturated:
		w("The broker's one core was saturated: at %s µs of broker CPU per copy, one core moves at most %.0f of "+
			"rebound's copies per second, and %.0f of the relay's (%s µs). The client side had room: rebound's "+
			"core was %.0f %% busy.", us(reb), 1e6/micros(reb), 1e6/max(micros(rel), 1e-9), us(rel), selfCores*100)
	case s.Mode == pinnedM:
		w("Neither core was saturated (the broker %.0f %%, rebound's %.0f %%): the round trip between them, "+
			"with at most the prefetch of copies unconfirmed, bounds the rate.", brokerCores*100, selfCores*100)
	case brokerCores+selfCores+other >= saturated*float64(cpus):
		w("The machine's %d cores were (nearly) all busy: rebound's client CPU comes out of the cores the broker "+
			"needs, as the shovels' does not (theirs is inside the broker's); in production the sidecar runs on "+
			"another machine, which the pinned runs model.", cpus)
	default:
		w("The machine still had idle CPU, so neither process was limited by the cores alone.")
	}
	return sb.String()
}

// moduleGloss says what a broker process module does, for the reading.
var moduleGloss = map[string]string{
	"rabbit_amqqueue_process": "queue processes",
	"rabbit_prequeue":         "queue processes",
	"rabbit_channel":          "channels: routing, confirms, acks",
	"rabbit_writer":           "connection writers: frames out",
	"rabbit_reader":           "connection readers: frames in",
	"rabbit_msg_store":        "the message store",
	"rabbit_shovel_worker":    "the shovel's worker",
	"amqp_channel":            "the shovel's Erlang client",
	"amqp_gen_connection":     "the shovel's Erlang client",
	"amqp_main_reader":        "the shovel's Erlang client",
}

// brokerReading says where the broker's time went in the probed runs.
func brokerReading(br *brokerResult) string {
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	w("**Where the broker's time goes** (written by bench from the probes): ")
	var per []string
	for _, p := range br.Probes {
		if p.Err == "" && p.reductions() > 0 && p.Trial.rate() > 0 {
			per = append(per, fmt.Sprintf("%s %.0f", p.Contender, p.perMessage()))
		}
	}
	if len(per) == 0 {
		return ""
	}
	w("reductions of the run's processes per message moved: %s. ", strings.Join(per, ", "))
	if p := br.probe(reboundC.Name); p != nil && p.Err == "" && p.reductions() > 0 {
		if p.nodeShare() < 0.5 {
			w("(Only %.0f %% of the node's reductions were the rebound run's: other people's work shared the broker.) ", p.nodeShare()*100)
		}
		var parts []string
		for _, g := range p.Groups[:min(4, len(p.Groups))] {
			part := fmt.Sprintf("%s %.0f %%", g.Module, float64(g.Reductions)/float64(p.reductions())*100)
			if gloss, ok := moduleGloss[g.Module]; ok {
				part = fmt.Sprintf("%s (%s) %.0f %%", g.Module, gloss, float64(g.Reductions)/float64(p.reductions())*100)
			}
			parts = append(parts, part)
		}
		w("For rebound, by process: %s. ", strings.Join(parts, ", "))
		if q, ok := p.busiest(); ok && !p.Late {
			w("Its busiest queue process, %s's, was busy %.0f %% of the time with %.1f messages waiting on average", q.Queue, q.Busy*100, q.Mailbox)
			if q.Busy >= saturatedQueue {
				w(": one queue process, which runs on one core at a time, close to its limit.")
			} else {
				w(".")
			}
		}
		if busy := p.schedBusy(); busy > 0 {
			w(" The scheduler threads spent %.0f %% of their busy time running Erlang code and %.0f %% in port I/O (sockets and files).",
				p.Sched["emulator"].Seconds()/busy.Seconds()*100, p.Sched["port"].Seconds()/busy.Seconds()*100)
		}
	}
	return strings.TrimSpace(sb.String())
}

// spreadReading says how the spread changed the rate and the broker's
// work per copy.
func spreadReading(s *suite) string {
	one, bound, spreads := spreadRoles(s)
	self := func(c string) string { return us(s.perMsg(c, func(x cpu) time.Duration { return x.self })) }
	var parts []string
	if bound != nil {
		parts = append(parts, fmt.Sprintf("with %d delay queues bound rebound ran at %.2f× its rate with one (broker %s µs "+
			"per copy, rebound %s)", bound.Bound, s.ratio(bound.Name, one.Name), us(brokerPerMsg(s, bound.Name)), self(bound.Name)))
	}
	for _, c := range spreads {
		parts = append(parts, fmt.Sprintf("with its copies over the %d delay queues the default policy uses at %d digit(s), "+
			"at %.2f× (broker %s µs, rebound %s)", len(c.Spread.Queues), c.Spread.Digits, s.ratio(c.Name, one.Name),
			us(brokerPerMsg(s, c.Name)), self(c.Name)))
	}
	return fmt.Sprintf("**Reading** (written by bench from the numbers below): %s; with one delay queue the broker spent %s "+
		"µs of CPU per copy and rebound %s.", strings.Join(parts, "; "), us(brokerPerMsg(s, one.Name)), self(one.Name))
}

// inflightBudget is REBOUND_INFLIGHT_BYTES at its default, which the
// large-message runs keep.
func inflightBudget() int64 {
	cfg, err := config.Load(nil)
	if err != nil {
		return 0
	}
	return int64(cfg.InflightBytes)
}

// largeVerdicts are the large-message runs against the manifests' memory
// limit.
func largeVerdicts(br *brokerResult) []verdict {
	var vs []verdict
	for _, r := range br.Large {
		v := verdict{Target: fmt.Sprintf("rebound's peak RSS ≤ the manifests' %s (GOMEMLIMIT=%s), %s", mib(memoryLimit), goMemLimit, r.Scenario),
			Broker: br.Version, Runs: string(unpinned), Met: r.under()}
		v.Measured = fmt.Sprintf("%s (%.0f msg/s, %.0f MiB/s)", mib(r.Peak), r.rate(), r.mibPerSecond())
		if r.Stopped {
			v.Measured = fmt.Sprintf("over %s: stopped", mib(stopAbove))
		}
		if !v.Met {
			v.Bound = largeBound(r)
		}
		vs = append(vs, v)
	}
	return vs
}

// largeBound says what took rebound's memory past the limit.
func largeBound(r largeResult) string {
	budget := inflightBudget()
	var sb strings.Builder
	fmt.Fprintf(&sb, "rebound's window reached %d deliveries (the most rebound_prefetch showed, scraped every 100 ms), and it "+
		"held up to %s of message bodies unacked (rebound_inflight_bytes); its RSS was %s once it consumed, before the "+
		"first delivery. ", r.MaxPrefetch, mib(r.MaxInflight), mib(r.Idle))
	if int64(r.MaxPrefetch)*largeSize > budget {
		held := int64(min(r.MaxPrefetch, r.Large)) * largeSize
		fmt.Fprintf(&sb, "A window of %d holds %s of %s messages, past the %s budget: the small messages before them had "+
			"opened it, and the large ones it let the broker send arrived before a smaller window took effect, %d of "+
			"them here (%s). That is the worst case the window does not cover (the window at that moment × the largest "+
			"message).", r.MaxPrefetch, mib(int64(r.MaxPrefetch)*largeSize), mib(largeSize), mib(budget), min(r.MaxPrefetch, r.Large), mib(held))
	} else {
		fmt.Fprintf(&sb, "The window kept the bodies in flight within what %d messages of %s weigh, %s; the rest of the "+
			"RSS is the process beyond the bodies it holds unacked: frames being read and written, and garbage not yet "+
			"collected (GOMEMLIMIT is a soft limit).", r.MaxPrefetch, mib(largeSize), mib(int64(r.MaxPrefetch)*largeSize))
	}
	return sb.String()
}

// stormTarget names the storm's target.
func stormTarget(r stormResult) string {
	return fmt.Sprintf("a storm of %d: retries into the origin ≤ REBOUND_RETRY_RATE=%d a second (due seconds exactly; arrivals "+
		"≤ %.1f× in any second, ≤ %.1f× over any %d)", r.N, r.Rate, stormSecondTolerance, stormWindowTolerance, stormWindow)
}

// stormVerdict is the capped storm's, if one ran.
func stormVerdict(br *brokerResult) (verdict, bool) {
	var capped, free *stormResult
	for i, r := range br.Storms {
		if r.Rate > 0 {
			capped = &br.Storms[i]
		} else {
			free = &br.Storms[i]
		}
	}
	if capped == nil {
		return verdict{}, false
	}
	peak, window, _, _ := stormCounts(capped.Arrived)
	v := verdict{Target: stormTarget(*capped), Broker: br.Version, Runs: string(unpinned), Met: capped.holds(),
		Measured: fmt.Sprintf("due ≤ %d a second; arrived ≤ %d in a second, %.0f a second over %d", slices.Max(capped.Due), peak, window, stormWindow)}
	if free != nil {
		fp, _, _, _ := stormCounts(free.Arrived)
		v.Measured += fmt.Sprintf(" (no cap: %d in a second)", fp)
	}
	if !v.Met {
		v.Bound = stormBound(*capped)
	}
	return v, true
}

// stormBound says where a capped storm passed its cap.
func stormBound(r stormResult) string {
	peak, window, _, _ := stormCounts(r.Arrived)
	var parts []string
	if due := slices.Max(r.Due); due > r.Rate {
		parts = append(parts, fmt.Sprintf("rebound's calendar put %d copies due in one second, over the cap of %d: the "+
			"calendar itself failed, which its tests should have caught", due, r.Rate))
	}
	if float64(peak) > stormSecondTolerance*float64(r.Rate) || window > stormWindowTolerance*float64(r.Rate) {
		parts = append(parts, fmt.Sprintf("the copies came due at most %d a second, yet %d arrived in one second and %.0f a "+
			"second over %d: the broker hands a copy back when its TTL ends at the head of its delay queue, and these "+
			"arrived later than due (median, 99th percentile and most: %s), then together", slices.Max(r.Due), peak, window,
			stormWindow, r.lateness()))
	}
	return strings.Join(parts, "; ") + "."
}
