package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// median returns the median of xs (mean of the middle two), 0 for none.
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

// of returns contender c's counted trials, in round order.
func (s *suite) of(c string) []trial {
	var out []trial
	for _, t := range s.Trials {
		if t.Contender == c && t.Round >= 0 {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b trial) int { return a.Round - b.Round })
	return out
}

// rate is the median of contender c's rates.
func (s *suite) rate(c string) float64 {
	var rates []float64
	for _, t := range s.of(c) {
		rates = append(rates, t.rate())
	}
	return median(rates)
}

// ratio is the median, over rounds, of a's rate divided by b's rate in
// the same round: runs next to each other in time share the machine's
// load, so pairing them cancels most of its drift.
func (s *suite) ratio(a, b string) float64 {
	ra, rb := s.of(a), s.of(b)
	var ratios []float64
	for i := range min(len(ra), len(rb)) {
		ratios = append(ratios, ra[i].rate()/rb[i].rate())
	}
	return median(ratios)
}

// cores returns the broker's and this process's CPU seconds per wall
// second over contender c's counted runs.
func (s *suite) cores(c string) (broker, self float64) {
	var wall float64
	for _, t := range s.of(c) {
		wall += t.Elapsed.Seconds()
		broker += t.CPU.broker.Seconds()
		self += t.CPU.self.Seconds()
	}
	if wall == 0 {
		return 0, 0
	}
	return broker / wall, self / wall
}

// perMsg is the median of f's CPU time per message over c's counted runs.
func (s *suite) perMsg(c string, f func(cpu) time.Duration) time.Duration {
	var xs []float64
	for _, t := range s.of(c) {
		xs = append(xs, float64(t.perMsg(f(t.CPU))))
	}
	return time.Duration(median(xs))
}

// into says where contender c's copies go.
func into(c contender) string {
	switch {
	case c.Kind != kindRebound:
		return "a queue"
	case slices.Contains(c.Env, "REBOUND_DELAY_MODE=hold"):
		return "the hold queue"
	case c.Spread != nil:
		return fmt.Sprintf("%d delay queues, the busiest with %.0f %% of the copies", len(c.Spread.Queues), c.Spread.Busiest*100)
	case c.Bound > 1:
		return fmt.Sprintf("1 delay queue of %d bound", c.Bound)
	}
	return "1 delay queue"
}

// table renders the suite's medians per contender, with each one's rate
// over the baseline's (the first contender's) paired by round.
func (s *suite) table() string {
	var sb strings.Builder
	base := s.Contenders[0].Name
	fmt.Fprintf(&sb, "| contender | copies into | runs | msg/s | ÷ %s | process CPU µs/msg | kernel | broker CPU µs/msg | schedulers / dirty I/O / other | broker cores |\n", base)
	sb.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range s.Contenders {
		process, kernel := s.perMsg(c.Name, func(x cpu) time.Duration { return x.self }), "–"
		if process > 0 {
			kernel = fmt.Sprintf("%.0f %%", float64(s.perMsg(c.Name, func(x cpu) time.Duration { return x.selfSys }))/float64(process)*100)
		}
		var split []string
		for k := range numThreadKinds {
			split = append(split, us(s.perMsg(c.Name, func(x cpu) time.Duration { return x.threads[k] })))
		}
		brokerCores, _ := s.cores(c.Name)
		fmt.Fprintf(&sb, "| %s | %s | %d | %.0f | %.2f | %s | %s | %s | %s | %.2f |\n", c.Name, into(c), len(s.of(c.Name)),
			s.rate(c.Name), s.ratio(c.Name, base), us(process), kernel, us(s.perMsg(c.Name, func(x cpu) time.Duration { return x.broker })),
			strings.Join(split, " / "), brokerCores)
	}
	return sb.String()
}

// runsTable renders every run of the suite, with a note for each run that
// was not pinned as asked, was attempted more than once, or left messages
// behind or duplicated.
func (s *suite) runsTable() string {
	var sb strings.Builder
	sb.WriteString("| round | contender | N | seconds | msg/s | process CPU µs/msg | broker CPU µs/msg | broker before, cores | others, cores |\n")
	sb.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	var notes []string
	for _, t := range s.Trials {
		fmt.Fprintf(&sb, "| %d | %s | %d | %.2f | %.0f | %s | %s | %.2f | %.2f |\n", t.Round+1, t.Contender, t.N, t.Elapsed.Seconds(), t.rate(),
			us(t.perMsg(t.CPU.self)), us(t.perMsg(t.CPU.broker)), t.Background, t.CPU.others().Seconds()/t.Elapsed.Seconds())
		run := fmt.Sprintf("%s, round %d", t.Contender, t.Round+1)
		if t.Unpinned != "" {
			notes = append(notes, fmt.Sprintf("%s ran unpinned: %s.", run, t.Unpinned))
		}
		if t.Attempts > 1 {
			notes = append(notes, fmt.Sprintf("%s is attempt %d: the earlier ones failed without losing messages.", run, t.Attempts))
		}
		if t.Leftover != 0 || t.Extra != 0 {
			notes = append(notes, fmt.Sprintf("%s left %d messages in the source and %d extra copies.", run, t.Leftover, t.Extra))
		}
	}
	for _, n := range notes {
		fmt.Fprintf(&sb, "\n%s\n", n)
	}
	return sb.String()
}
