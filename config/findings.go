package config

import (
	"fmt"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/rebound-mq/rebound/policy"
)

// A Finding is something a configuration allows that is almost surely not
// what its author meant, for `rebound config check`: the sidecar starts
// with it, and the message it affects is parked or decided by another
// policy than the one written for it.
type finding struct {
	Policy string // the policy it concerns; "" for the allowlist
	Text   string
}

func (f finding) String() string {
	if f.Policy == "" {
		return f.Text
	}
	return "policy " + f.Policy + ": " + f.Text
}

// Findings judges the named policies against the allowlist and against
// each other: a policy whose QUEUES matches no queue REBOUND_ORIGIN_QUEUES
// allows decides nothing (every message it would take is parked
// origin-not-allowed), and one whose queues all match an earlier policy's
// never decides (the first that matches does).
//
// Whether two regular expressions share a match is judged on sampled
// names, not proven: names are built from each expression (its literals,
// one or no repetition, a few characters of each class) and from the two
// joined, and a name both match proves they overlap. So "matches no
// allowed queue" can be wrong when the overlap needs a name the samples
// do not build, and "shadowed" is said when every sampled name of the
// later policy matches the earlier one (or their patterns are the same).
func (c Config) Findings() []finding {
	var out []finding
	allow, err := regexp.Compile(c.OriginQueues)
	if c.OriginQueues == "" || err != nil {
		allow = nil
	}
	out = append(out, c.allowlistFindings(allow)...)
	var earlier []namedPolicy
	for _, n := range c.Named {
		q, err := regexp.Compile(n.Queues)
		if err != nil {
			continue // Load reported it
		}
		if allow != nil && !overlap(q, allow) {
			out = append(out, finding{Policy: n.Name, Text: fmt.Sprintf(
				"QUEUES %s matches no queue REBOUND_ORIGIN_QUEUES %s allows (judged on sampled names): a message from its queues is parked origin-not-allowed, never retried",
				n.Queues, c.OriginQueues)})
		}
		for _, e := range earlier {
			eq, err := regexp.Compile(e.Queues)
			if err != nil {
				continue
			}
			if e.Queues == n.Queues || covers(eq, q) {
				out = append(out, finding{Policy: n.Name, Text: fmt.Sprintf(
					"shadowed by %s, listed before it in REBOUND_POLICIES: every queue %s matches, %s matches too (judged on sampled names), so %s never decides",
					e.Name, n.Queues, e.Queues, n.Name)})
				break
			}
		}
		earlier = append(earlier, n)
	}
	return out
}

// allowlistFindings judges REBOUND_ORIGIN_QUEUES itself (allow: nil when
// unset). Unset, every queue of the vhost is a destination: the broker's
// x-death record names the origin, and whoever may publish to the inbox
// can write one. Matching rebound's own queues, it says what its author
// did not mean: the sidecar refuses them anyway (Topology.Owns), so such
// a message is parked unknown-origin, never sent back.
func (c Config) allowlistFindings(allow *regexp.Regexp) []finding {
	if allow == nil {
		if c.OriginQueues != "" {
			return nil // Load reported it
		}
		return []finding{{Text: "REBOUND_ORIGIN_QUEUES is unset: rebound sends a copy back to any queue of the vhost a message's x-death names, " +
			"and whoever may publish to the dead-letter exchange can write that header; set it to a pattern of your application queues (such as ^orders\\.)"}}
	}
	t := c.Topology()
	delay, _ := t.DelayQueue(time.Second)
	var own []string
	for _, q := range []string{t.InboxQueue, t.ParkingQueue, delay.Name, t.HoldQueue().Name, t.HoldCommandsQueue().Name, t.LockQueue(), t.InUseQueue(), t.PlaceQueue(0)} {
		if allow.MatchString(q) && !slices.Contains(own, q) {
			own = append(own, q)
		}
	}
	if len(own) == 0 {
		return nil
	}
	return []finding{{Text: fmt.Sprintf("REBOUND_ORIGIN_QUEUES %s matches rebound's own queues (%s): "+
		"a message naming one as its origin is parked unknown-origin, never sent there, so the pattern allows what it cannot mean; anchor it to your application queues",
		c.OriginQueues, strings.Join(own, ", "))}}
}

// Deciders returns the policies of set that can decide a message whose
// origin queue origins matches (nil: any), in the order they are tried:
// those whose QUEUES can match such a queue, up to the first that takes
// every one of them, after which no policy decides any. It judges as
// Findings does, on sampled names.
func Deciders(set policy.Set, origins *regexp.Regexp) []*policy.Named {
	var out []*policy.Named
	for _, p := range set.All() {
		if origins != nil && p.Queues != nil && !overlap(p.Queues, origins) {
			continue
		}
		out = append(out, p)
		if origins != nil && p.Queues != nil && covers(p.Queues, origins) {
			break
		}
	}
	return out
}

// overlap reports whether some name matches both a and b, judged on
// names sampled from each (see Findings): true is proven by a name, false
// means none of the samples matched both.
func overlap(a, b *regexp.Regexp) bool {
	for _, s := range candidates(a, b) {
		if a.MatchString(s) && b.MatchString(s) {
			return true
		}
	}
	return false
}

// covers reports whether every sampled name later matches also matches
// earlier, the samples including later's names joined with earlier's.
func covers(earlier, later *regexp.Regexp) bool {
	n := 0
	for _, s := range candidates(later, earlier) {
		if later.MatchString(s) {
			n++
			if !earlier.MatchString(s) {
				return false
			}
		}
	}
	return n > 0
}

// candidates are names to try: samples of a and of b (with each one's
// literal prefix), and each of a's joined with each of b's in both
// orders, end to end (an unanchored expression matches inside a longer
// name) and run together where one's end is the other's start
// ("orders." and ".dead" make "orders.dead").
func candidates(a, b *regexp.Regexp) []string {
	as, bs := withPrefix(a, samples(a)), withPrefix(b, samples(b))
	out := slices.Concat(as, bs)
	for _, x := range as {
		for _, y := range bs {
			out = append(out, x+y, y+x)
			out = append(out, runTogether(x, y)...)
			out = append(out, runTogether(y, x)...)
		}
	}
	return out
}

func withPrefix(re *regexp.Regexp, samples []string) []string {
	if p, _ := re.LiteralPrefix(); p != "" {
		return append(samples, p)
	}
	return samples
}

// runTogether joins x and y wherever an end of x is a start of y.
func runTogether(x, y string) []string {
	var out []string
	for k := 1; k <= min(len(x), len(y)); k++ {
		if x[len(x)-k:] == y[:k] {
			out = append(out, x+y[k:])
		}
	}
	return out
}

// sampleLimit bounds the names built from one expression.
const sampleLimit = 48

// samples returns names the expression matches, built from its syntax:
// every branch of an alternation, a repetition zero times and once (its
// least count and one more when it has one), a few characters of each
// class. Not every name it builds need match (a \b or an anchor in the
// middle can refuse it); the callers test each.
func samples(re *regexp.Regexp) []string {
	tree, err := syntax.Parse(re.String(), syntax.Perl)
	if err != nil {
		return nil
	}
	return sample(tree.Simplify())
}

func sample(re *syntax.Regexp) []string {
	switch re.Op {
	case syntax.OpLiteral:
		return []string{string(re.Rune)}
	case syntax.OpCharClass:
		return classSamples(re.Rune)
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return []string{"a", "."}
	case syntax.OpCapture:
		return sample(re.Sub[0])
	case syntax.OpStar, syntax.OpQuest:
		return append([]string{""}, sample(re.Sub[0])...)
	case syntax.OpPlus:
		return sample(re.Sub[0])
	case syntax.OpRepeat:
		one := sample(re.Sub[0])
		var out []string
		for _, n := range []int{re.Min, re.Min + 1} {
			if re.Max != -1 && n > re.Max {
				continue
			}
			out = append(out, repeat(one, n)...)
		}
		return limit(out)
	case syntax.OpAlternate:
		var out []string
		for _, s := range re.Sub {
			out = append(out, sample(s)...)
		}
		return limit(out)
	case syntax.OpConcat:
		out := []string{""}
		for _, s := range re.Sub {
			out = product(out, sample(s))
		}
		return out
	}
	// Anchors, boundaries, empty matches: they add no character.
	return []string{""}
}

func repeat(one []string, n int) []string {
	out := []string{""}
	for range n {
		out = product(out, one)
	}
	return out
}

func product(a, b []string) []string {
	var out []string
	for _, x := range a {
		for _, y := range b {
			out = append(out, x+y)
		}
	}
	return limit(out)
}

func limit(s []string) []string {
	slices.Sort(s)
	s = slices.Compact(s)
	if len(s) > sampleLimit {
		// Keep the spread: every k-th name, not the first few.
		kept := make([]string, 0, sampleLimit)
		for i := 0; i < len(s); i += len(s)/sampleLimit + 1 {
			kept = append(kept, s[i])
		}
		s = kept
	}
	return s
}

// classSamples picks characters of a class given as rune ranges: each
// range's first, and a lower-case letter and a digit when the class has
// them (queue names are mostly those).
func classSamples(ranges []rune) []string {
	var out []string
	has := func(r rune) bool {
		for i := 0; i+1 < len(ranges); i += 2 {
			if ranges[i] <= r && r <= ranges[i+1] {
				return true
			}
		}
		return false
	}
	for i := 0; i+1 < len(ranges) && len(out) < 4; i += 2 {
		if unicode.IsPrint(ranges[i]) {
			out = append(out, string(ranges[i]))
		}
	}
	for _, r := range []rune{'x', '7', '.', '-'} {
		if has(r) {
			out = append(out, string(r))
		}
	}
	return limit(out)
}
