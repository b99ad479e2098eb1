package main

import (
	"fmt"
	"strings"
	"time"
)

// Readings bench writes from the numbers of the run: the targets of
// issue 13 with what bounds those not met, and per suite what limited
// throughput. Every number they cite comes from the same invocation.

// The targets.
const (
	spreadTarget = 0.9                   // throughput with 300 delay queues ÷ throughput with one
	shovelTarget = 1.0                   // rebound ÷ the Shovel, RabbitMQ 4.3, pinned
	cpuTarget    = 20 * time.Microsecond // rebound's CPU per message
)

// shovelTargetBroker is the broker the Shovel target is set on.
const shovelTargetBroker = "4.3"

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

func spreadNames(s *suite) (one, bound, spread string) {
	return s.Contenders[0].Name, s.Contenders[1].Name, s.Contenders[2].Name
}

// targets returns every target's verdict on every broker measured.
func targets(brs []*brokerResult) []verdict {
	var vs []verdict
	for _, br := range brs {
		for _, s := range br.Spread {
			if len(s.Contenders) < 3 {
				continue
			}
			one, bound, spread := spreadNames(s)
			rb, rs := s.ratio(bound, one), s.ratio(spread, one)
			v := verdict{Target: fmt.Sprintf("throughput with %d delay queues ≥ %.1f× with one", s.Contenders[2].Spread, spreadTarget),
				Broker: br.Version, Runs: string(s.Mode), Measured: fmt.Sprintf("%.2f bound, %.2f spread over them", rb, rs),
				Met: rb >= spreadTarget && rs >= spreadTarget}
			if !v.Met {
				v.Bound = spreadBound(s)
			}
			vs = append(vs, v)
		}
	}
	for _, br := range brs {
		if br.Name != shovelTargetBroker {
			continue
		}
		v := verdict{Target: fmt.Sprintf("rebound ≥ %.1f× the Shovel", shovelTarget), Broker: br.Version, Runs: string(pinnedM)}
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
		for _, s := range br.Throughput {
			if !s.has(reboundC.Name) {
				continue
			}
			client := s.clientPerMsg(reboundC.Name)
			v := verdict{Target: fmt.Sprintf("rebound CPU ≤ %s µs per message", us(cpuTarget)), Broker: br.Version, Runs: string(s.Mode),
				Measured: us(client) + " µs", Met: client <= cpuTarget}
			if !v.Met {
				v.Bound = cpuBound(s, br)
			}
			vs = append(vs, v)
		}
	}
	return vs
}

// brokerPerMsg is the broker's CPU per message in c's runs of s.
func brokerPerMsg(s *suite, c string) time.Duration {
	return s.perMsg(c, func(x cpu) time.Duration { return x.broker })
}

// spreadBound says what the broker did more per copy with the delay
// queues bound, and with the copies spread over them.
func spreadBound(s *suite) string {
	one, bound, spread := spreadNames(s)
	k := s.Contenders[2].Spread
	thread := func(c string, kind threadKind) time.Duration {
		return s.perMsg(c, func(x cpu) time.Duration { return x.threads[kind] })
	}
	b1, bb, bs := brokerPerMsg(s, one), brokerPerMsg(s, bound), brokerPerMsg(s, spread)
	var sb strings.Builder
	fmt.Fprintf(&sb, "Per copy the broker spent %s µs of CPU with one delay queue, %s µs with %d bound (%+.0f %%) and %s µs "+
		"with the copies spread over them (%+.0f %%). ", us(b1), us(bb), k, pct(bb, b1), us(bs), pct(bs, b1))
	if s.ratio(bound, one) < spreadTarget {
		if pct(bb, b1) < 5 {
			fmt.Fprintf(&sb, "With %d bound and the copies still into one queue the broker did no more per copy, so the "+
				"rate lost there is not routing work (each delay queue's exchange has one binding): the machine's load, or "+
				"too short a run; measure again. ", k)
		} else {
			fmt.Fprintf(&sb, "With %d bound and the copies still into one queue the broker did more per copy, %s µs in "+
				"its schedulers against %s with one (%+.0f %%): what differs from one queue is the other "+
				"delay queues and their exchanges. ", k, us(thread(bound, schedulerThreads)), us(thread(one, schedulerThreads)),
				pct(thread(bound, schedulerThreads), thread(one, schedulerThreads)))
		}
	}
	if s.ratio(spread, one) < spreadTarget {
		fmt.Fprintf(&sb, "Spread over %d queues, its dirty I/O threads (file writes and syncs) went from %s to %s µs per "+
			"copy and its schedulers from %s to %s: each queue process writes and confirms its own copies, with "+
			"fewer to batch than one busy queue has. That is the broker's work per queue, whoever publishes; jitter "+
			"spreads copies less evenly than these runs.", k, us(thread(one, dirtyIOThreads)), us(thread(spread, dirtyIOThreads)),
			us(thread(one, schedulerThreads)), us(thread(spread, schedulerThreads)))
	}
	return strings.TrimSpace(sb.String())
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
		fmt.Fprintf(&sb, " In the lever runs, prefetch 1024 took rebound to %.2f× its rate at 256 and the Shovel to %.2f× "+
			"its own: at 1024 both, rebound reached %.2f× the Shovel.", levers.ratio(leverReboundFetch, reboundC.Name),
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
			"client can move these messages for less on this machine, and that is %s the %s µs target. ", us(rel),
			map[bool]string{true: "already above", false: "under"}[rel > cpuTarget], us(cpuTarget))
		if reb > rel {
			fmt.Fprintf(&sb, "rebound costs %s µs more (%+.0f %%). ", us(reb-rel), pct(reb, rel))
		} else {
			fmt.Fprintf(&sb, "rebound cost no more than the relay in these runs (%s µs less): it is at that bound. ", us(rel-reb))
		}
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
	if len(s.Contenders) < 3 {
		return ""
	}
	one, bound, spread := spreadNames(s)
	return fmt.Sprintf("**Reading** (written by bench from the numbers below): with %d delay queues bound rebound ran at %.2f× "+
		"its rate with one, and at %.2f× with its copies spread over them; per copy the broker spent %s, %s and %s µs of "+
		"CPU, and rebound %s, %s and %s µs.", s.Contenders[2].Spread, s.ratio(bound, one), s.ratio(spread, one),
		us(brokerPerMsg(s, one)), us(brokerPerMsg(s, bound)), us(brokerPerMsg(s, spread)),
		us(s.perMsg(one, func(x cpu) time.Duration { return x.self })), us(s.perMsg(bound, func(x cpu) time.Duration { return x.self })),
		us(s.perMsg(spread, func(x cpu) time.Duration { return x.self })))
}
