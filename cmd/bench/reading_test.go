package main

import (
	"strings"
	"testing"
	"time"
)

// runSpec describes a contender's runs for mkSuite: its rate in each round,
// and its process and broker CPU per message.
type runSpec struct {
	rates           []float64
	selfUs, brokUs  float64
	othersPerSecond float64 // cores used by other processes
}

// mkSuite builds a suite of 20 000-message runs from runs.
func mkSuite(name string, m mode, cs []contender, runs map[string]runSpec) *suite {
	s := &suite{Name: name, Mode: m, Contenders: cs}
	for _, c := range cs {
		r := runs[c.Name]
		for round, rate := range r.rates {
			const n = 20000
			elapsed := time.Duration(float64(n) / rate * float64(time.Second))
			self := time.Duration(r.selfUs * n * float64(time.Microsecond))
			broker := time.Duration(r.brokUs * n * float64(time.Microsecond))
			others := time.Duration(r.othersPerSecond * float64(elapsed))
			t := trial{Contender: c.Name, Mode: m, Round: round, N: n, Elapsed: elapsed,
				CPU: cpu{self: self, broker: broker, machine: self + broker + others}}
			t.CPU.threads[schedulerThreads] = broker
			s.Trials = append(s.Trials, t)
		}
	}
	return s
}

func pinnedThroughput(rebound, relay, shovel float64, rebBroker, relBroker, shBroker, rebSelf float64) *suite {
	return mkSuite("throughput", pinnedM, []contender{reboundC, relayC, shovelC, sameC}, map[string]runSpec{
		reboundC.Name: {rates: []float64{rebound, rebound * 1.02}, selfUs: rebSelf, brokUs: rebBroker},
		relayC.Name:   {rates: []float64{relay, relay * 1.02}, selfUs: 30, brokUs: relBroker},
		shovelC.Name:  {rates: []float64{shovel, shovel * 1.02}, selfUs: 0.5, brokUs: shBroker},
		sameC.Name:    {rates: []float64{shovel * 0.9, shovel * 0.9}, selfUs: 0.5, brokUs: shBroker * 1.1},
	})
}

// spreadSuite is a spread suite with one delay queue, 300 bound, and the
// default policy's spreads at two and one digits, with the rates and
// broker CPU per copy given for each.
func spreadSuite(t *testing.T, m mode, one, bound, two, oneDigit float64, brokerOne, brokerTwo, brokerOneDigit float64) *suite {
	t.Helper()
	cs, err := spreadContenders(300, 2000, []int{2, 1})
	if err != nil {
		t.Fatal(err)
	}
	return mkSuite("spread", m, cs, map[string]runSpec{
		cs[0].Name: {rates: []float64{one, one}, selfUs: 35, brokUs: brokerOne},
		cs[1].Name: {rates: []float64{bound, bound}, selfUs: 35, brokUs: brokerOne},
		cs[2].Name: {rates: []float64{two, two}, selfUs: 36, brokUs: brokerTwo},
		cs[3].Name: {rates: []float64{oneDigit, oneDigit}, selfUs: 36, brokUs: brokerOneDigit},
	})
}

func find(vs []verdict, target, runs string) (verdict, bool) {
	for _, v := range vs {
		if strings.HasPrefix(v.Target, target) && v.Runs == runs {
			return v, true
		}
	}
	return verdict{}, false
}

func TestTargets(t *testing.T) {
	const (
		shovel = "rebound ≥ 1.0× the Shovel, each at its defaults"
		cpuT   = "rebound's CPU per message ≤ 1.1× the bare relay's"
		bound  = "throughput with 300 delay queues bound ≥ 0.9× with one"
		two    = "copies spread as the default policy spreads them at REBOUND_DELAY_DIGITS=2"
		one    = "copies spread as the default policy spreads them at REBOUND_DELAY_DIGITS=1"
	)
	for _, tc := range []struct {
		name     string
		br       *brokerResult
		target   string
		runs     string
		met      bool
		measured string   // the start of Measured
		none     bool     // not measured
		bound    []string // in Bound when not met
		never    []string // not in Bound
	}{{
		name: "shovel target missed, broker saturated, relay bound",
		br: &brokerResult{Name: "4.3", Version: "4.3.6",
			Throughput: []*suite{pinnedThroughput(15000, 17000, 28000, 64, 58, 35, 40)}},
		target: shovel, runs: "pinned", met: false, measured: "0.54 (15150 and 28280 msg/s)",
		bound: []string{"used 0.97 of it", "64.0 µs per copy for rebound, 58.0 µs for the relay and 35.0 µs for the Shovel",
			"reached 0.61× the Shovel", "rebound reached 0.88 of the relay's rate", "6.0 µs more broker CPU per copy"},
	}, {
		name: "shovel target missed, rebound as cheap for the broker as the relay",
		br: &brokerResult{Name: "4.3", Version: "4.3.6",
			Throughput: []*suite{pinnedThroughput(15000, 17000, 28000, 58, 58, 35, 40)}},
		target: shovel, runs: "pinned", met: false, measured: "0.54",
		bound: []string{"rebound reached 0.88 of the relay's rate, for no more broker CPU per copy than the relay."},
		never: []string{"0.0 µs more"},
	}, {
		name: "shovel target met on 3.10 too",
		br: &brokerResult{Name: "3.10", Version: "3.10.8",
			Throughput: []*suite{pinnedThroughput(15000, 17000, 12000, 64, 58, 80, 40)}},
		target: shovel, runs: "pinned", met: true, measured: "1.25",
	}, {
		name: "shovel target on a broker that was not pinned",
		br: &brokerResult{Name: "4.3", Version: "4.3.6", Throughput: []*suite{
			mkSuite("throughput", unpinned, []contender{reboundC, shovelC}, map[string]runSpec{
				reboundC.Name: {rates: []float64{1000}, selfUs: 10, brokUs: 50}, shovelC.Name: {rates: []float64{1000}, brokUs: 50}})}},
		target: shovel, runs: "pinned", met: false, none: true,
	}, {
		name: "cpu target missed",
		br: &brokerResult{Name: "4.3", Version: "4.3.6",
			Throughput: []*suite{pinnedThroughput(15000, 17000, 28000, 64, 58, 35, 40)}},
		target: cpuT, runs: "pinned", met: false, measured: "1.34 (39.1 and 29.2 µs)",
		bound: []string{"costs 29.2 µs per message", "rebound costs 9.9 µs more (+34 %)"},
	}, {
		name: "cpu target met within the margin",
		br: &brokerResult{Name: "3.10", Version: "3.10.8",
			Throughput: []*suite{pinnedThroughput(15000, 17000, 28000, 64, 58, 35, 32)}},
		target: cpuT, runs: "pinned", met: true, measured: "1.06",
	}, {
		name: "cpu target without pinned runs",
		br: &brokerResult{Name: "3.10", Version: "3.10.8", Throughput: []*suite{
			mkSuite("throughput", unpinned, []contender{reboundC, relayC}, map[string]runSpec{
				reboundC.Name: {rates: []float64{1000}, selfUs: 10, brokUs: 50}, relayC.Name: {rates: []float64{1000}, selfUs: 10, brokUs: 50}})}},
		target: cpuT, runs: "pinned", met: false, none: true,
	}, {
		name:   "spread met at both digits",
		br:     &brokerResult{Name: "3.10", Version: "3.10.8", Spread: []*suite{spreadSuite(t, pinnedM, 10000, 9900, 9500, 9700, 60, 62, 61)}},
		target: two, runs: "pinned", met: true, measured: "0.95",
	}, {
		name:   "routing met",
		br:     &brokerResult{Name: "3.10", Version: "3.10.8", Spread: []*suite{spreadSuite(t, pinnedM, 10000, 9900, 7000, 8000, 60, 90, 80)}},
		target: bound, runs: "pinned", met: true, measured: "0.99",
	}, {
		name:   "two digits missed",
		br:     &brokerResult{Name: "3.10", Version: "3.10.8", Spread: []*suite{spreadSuite(t, pinnedM, 10000, 9900, 7000, 8000, 60, 90, 80)}},
		target: two, runs: "pinned", met: false, measured: "0.70",
		bound: []string{"60.0 µs of CPU with one delay queue and 90.0 µs with the copies over the", "at 2 digit(s) (+50 %)",
			"Its dirty I/O threads", "the broker's work per queue"},
		never: []string{"At 2 digit(s) the policy uses"},
	}, {
		name:   "one digit missed, cheaper than two",
		br:     &brokerResult{Name: "3.10", Version: "3.10.8", Spread: []*suite{spreadSuite(t, pinnedM, 10000, 9900, 7000, 8000, 60, 90, 80)}},
		target: one, runs: "pinned", met: false, measured: "0.80",
		bound: []string{"80.0 µs with the copies over the", "At 1 digit(s) the policy uses", "spent 80.0 µs per copy, not 90.0",
			"ran at 0.80× one queue, not 0.70×", "fewer queues take less"},
	}, {
		name:   "one digit missed, no cheaper than two",
		br:     &brokerResult{Name: "3.10", Version: "3.10.8", Spread: []*suite{spreadSuite(t, pinnedM, 10000, 9900, 7000, 7000, 60, 90, 90)}},
		target: one, runs: "pinned", met: false,
		bound: []string{"yet the broker spent no less per copy"},
	}, {
		name:   "routing alone missing the target misses it",
		br:     &brokerResult{Name: "3.10", Version: "3.10.8", Spread: []*suite{spreadSuite(t, unpinned, 10000, 3000, 9500, 9500, 60, 62, 62)}},
		target: bound, runs: "unpinned", met: false, measured: "0.30",
		bound: []string{"the broker did no more per copy, so the rate lost there is not routing work"},
		never: []string{"dirty I/O"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			v, ok := find(targets([]*brokerResult{tc.br}), tc.target, tc.runs)
			if !ok {
				t.Fatalf("no verdict for %q, %s", tc.target, tc.runs)
			}
			t.Logf("%+v", v)
			if v.Met != tc.met {
				t.Errorf("met = %v, want %v", v.Met, tc.met)
			}
			if !strings.HasPrefix(v.Measured, tc.measured) || tc.none != (v.Measured == "") {
				t.Errorf("measured %q, want it to start with %q (not measured: %v)", v.Measured, tc.measured, tc.none)
			}
			if v.Met && v.Bound != "" {
				t.Errorf("a met target has a bound: %s", v.Bound)
			}
			if !v.Met && v.Measured != "" && v.Bound == "" {
				t.Error("a missed target says nothing of what bounds it")
			}
			for _, want := range tc.bound {
				if !strings.Contains(v.Bound, want) {
					t.Errorf("bound lacks %q:\n%s", want, v.Bound)
				}
			}
			for _, never := range tc.never {
				if strings.Contains(v.Bound, never) {
					t.Errorf("bound has %q:\n%s", never, v.Bound)
				}
			}
		})
	}
}

func TestThroughputReading(t *testing.T) {
	for _, tc := range []struct {
		name  string
		s     *suite
		want  []string
		never []string
	}{{
		name: "pinned, broker saturated",
		s:    pinnedThroughput(15000, 17000, 28000, 64, 58, 35, 40),
		want: []string{"rebound moved 15150 msg/s, 0.88× the relay, 0.54× the shovel", "one core was saturated",
			"at most 15625 of rebound's copies per second"},
	}, {
		name:  "pinned, broker idle",
		s:     pinnedThroughput(5000, 5000, 5000, 64, 58, 35, 40),
		want:  []string{"Neither core was saturated", "the round trip between them"},
		never: []string{"was saturated:"},
	}, {
		name: "other load",
		s: mkSuite("throughput", unpinned, []contender{reboundC}, map[string]runSpec{
			reboundC.Name: {rates: []float64{10000}, selfUs: 40, brokUs: 60, othersPerSecond: 0.6}}),
		want:  []string{"other processes 0.60", "compare the ratios only"},
		never: []string{"saturated"},
	}, {
		name: "unpinned, machine busy",
		s: mkSuite("throughput", unpinned, []contender{reboundC}, map[string]runSpec{
			reboundC.Name: {rates: []float64{12000}, selfUs: 40, brokUs: 110}}),
		want: []string{"cores were (nearly) all busy"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := throughputReading(tc.s, 2)
			t.Log(got)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("reading lacks %q", w)
				}
			}
			for _, w := range tc.never {
				if strings.Contains(got, w) {
					t.Errorf("reading has %q", w)
				}
			}
		})
	}
}

func TestKindOfThread(t *testing.T) {
	for comm, want := range map[string]threadKind{
		"1_scheduler": schedulerThreads, "erts_sched_2": schedulerThreads,
		"3_dirty_io_sche": dirtyIOThreads, "10_dirty_io_sch": dirtyIOThreads, "erts_dios_10": dirtyIOThreads,
		"1_dirty_cpu_sch": otherThreads, "erts_dcpus_1": otherThreads, "0_poller": otherThreads, "erts_poll_0": otherThreads,
		"beam.smp": otherThreads, "1_aux": otherThreads,
	} {
		if got := kindOfThread(comm); got != want {
			t.Errorf("%s: %s, want %s", comm, threadKindNames[got], threadKindNames[want])
		}
	}
}

func TestKeptReading(t *testing.T) {
	previous := "# old\n" + readingBegin + "\nThe reading.\n" + readingEnd + "\nmore"
	if got := keptReading(previous); got != "The reading." {
		t.Errorf("kept %q", got)
	}
	if got := keptReading("no markers"); !strings.Contains(got, "No reading written yet") {
		t.Errorf("placeholder %q", got)
	}
	r := &report{reading: "The reading.", opts: options{n: 20000, runs: 5}}
	if got := keptReading(r.markdown()); got != "The reading." {
		t.Errorf("a rewritten report does not keep its reading: %q", got)
	}
}

func TestBoundsCiteTheLevers(t *testing.T) {
	cs := []contender{relayC, {Name: leverNoXDeath, Kind: kindRelay}, reboundC, {Name: leverReboundFetch, Kind: kindRebound},
		shovelC, {Name: leverShovelFetch, Kind: kindShovel}}
	levers := mkSuite("levers", pinnedM, cs, map[string]runSpec{
		relayC.Name:       {rates: []float64{10000, 10000}, selfUs: 50, brokUs: 90},
		leverNoXDeath:     {rates: []float64{12000, 12000}, selfUs: 34, brokUs: 80},
		reboundC.Name:     {rates: []float64{9000, 9000}, selfUs: 64, brokUs: 100},
		leverReboundFetch: {rates: []float64{12600, 12600}, selfUs: 55, brokUs: 78},
		shovelC.Name:      {rates: []float64{8000, 8000}, selfUs: 1, brokUs: 120},
		leverShovelFetch:  {rates: []float64{12000, 12000}, selfUs: 1, brokUs: 80},
	})
	br := &brokerResult{Name: "4.3", Version: "4.3.6", Levers: levers,
		Throughput: []*suite{pinnedThroughput(15000, 17000, 28000, 64, 58, 35, 40)}}
	vs := targets([]*brokerResult{br})
	sh, _ := find(vs, "rebound ≥ 1.0× the Shovel", "pinned")
	for _, want := range []string{"prefetch 256 took rebound to 1.40× its rate at its default and the Shovel to 1.50× its own",
		"at 256 both, rebound reached 1.05× the Shovel"} {
		if !strings.Contains(sh.Bound, want) {
			t.Errorf("shovel bound lacks %q:\n%s", want, sh.Bound)
		}
	}
	c, _ := find(vs, "rebound's CPU", "pinned")
	if want := "the relay's process CPU was 50.0 µs per message with it and 34.0 µs without"; !strings.Contains(c.Bound, want) {
		t.Errorf("cpu bound lacks %q:\n%s", want, c.Bound)
	}
	// Levers run in another mode say nothing about these runs.
	levers.Mode = unpinned
	vs = targets([]*brokerResult{br})
	if sh, _ := find(vs, "rebound ≥ 1.0× the Shovel", "pinned"); strings.Contains(sh.Bound, "prefetch 256") {
		t.Errorf("shovel bound cites levers of another mode:\n%s", sh.Bound)
	}
}

func TestBrokerReading(t *testing.T) {
	probe := func(c string, rate float64, groups ...groupLoad) *trialProbe {
		p := &trialProbe{Contender: c, Trial: trial{N: int(rate * 2), Elapsed: 2 * time.Second}}
		p.Window, p.Groups = time.Second, groups
		for _, g := range groups {
			p.NodeReductions += g.Reductions
		}
		p.Queues = []queueLoad{{Queue: "delay.600000", Busy: 0.9, Mailbox: 30}}
		p.Sched = map[string]time.Duration{"emulator": 600 * time.Millisecond, "port": 100 * time.Millisecond, "sleep": time.Second}
		return p
	}
	br := &brokerResult{Probes: []*trialProbe{
		probe(reboundC.Name, 10000, groupLoad{"rabbit_amqqueue_process", 8e6}, groupLoad{"rabbit_channel", 6e6}, groupLoad{"rabbit_writer", 4e6}),
		probe(relayC.Name, 20000, groupLoad{"rabbit_amqqueue_process", 8e6}),
	}}
	got := brokerReading(br)
	t.Log(got)
	for _, want := range []string{"per message moved: rebound 1800, relay 400",
		"rabbit_amqqueue_process (queue processes) 44 %", "rabbit_channel (channels: routing, confirms, acks) 33 %",
		"delay.600000's, was busy 90 %", "close to its limit", "86 % of their busy time running Erlang code and 14 % in port I/O"} {
		if !strings.Contains(got, want) {
			t.Errorf("reading lacks %q", want)
		}
	}
	if strings.Contains(got, "other people's work") {
		t.Error("a probe that was the node's whole work is read as shared")
	}
	br.Probes[0].NodeReductions *= 4
	if got := brokerReading(br); !strings.Contains(got, "Only 25 % of the node's reductions") {
		t.Errorf("a shared node is not said to be shared:\n%s", got)
	}
}
