package policy

import (
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
)

// DefaultName is the name of the policy that decides for every origin
// queue no named policy selects.
const DefaultName = "default"

// Named is a policy with its name and the origin queues it serves.
type Named struct {
	Name string
	// Queues selects the origin queues the policy serves (unanchored, as
	// RabbitMQ's policy patterns); nil for the default policy, which
	// serves every origin no other policy selects.
	Queues *regexp.Regexp
	Policy
	// Labels are the policy's routing labels (team, owner, ...), for
	// rebound_policy_info; they say who owns it, not how it retries, so
	// the fingerprint leaves them out.
	Labels map[string]string
	// Fingerprint is Policy.fingerprint, computed once by NewSet.
	Fingerprint string
}

// Label is what a message carries of the policy that decided it, in its
// policy header: "<name>:<fingerprint>".
func (n *Named) Label() string { return n.Name + ":" + n.Fingerprint }

// Set is one deployment's policies: the named ones in order of
// precedence, then the default. A Set is immutable and safe for
// concurrent use.
type Set struct {
	named []*Named // precedence order, the default last
}

// NewSet returns the set of named policies, in order of precedence, and
// the default policy. The names must be distinct and none the default's;
// each must select queues (package config checks all this).
func NewSet(def Policy, named ...Named) Set {
	s := Set{named: make([]*Named, 0, len(named)+1)}
	for _, n := range named {
		n.Fingerprint = n.Policy.fingerprint()
		s.named = append(s.named, &n)
	}
	s.named = append(s.named, &Named{Name: DefaultName, Policy: def, Fingerprint: def.fingerprint()})
	return s
}

// For returns the policy that decides for a message from origin: the
// first named policy whose Queues matches it, else the default. An
// unknown origin ("") gets the default.
func (s Set) For(origin string) *Named {
	if origin != "" {
		for _, n := range s.named[:len(s.named)-1] {
			if n.Queues.MatchString(origin) {
				return n
			}
		}
	}
	return s.Default()
}

// Default returns the default policy.
func (s Set) Default() *Named { return s.named[len(s.named)-1] }

// Lookup returns the policy named name.
func (s Set) Lookup(name string) (*Named, bool) {
	for _, n := range s.named {
		if n.Name == name {
			return n, true
		}
	}
	return nil, false
}

// All returns every policy in order of precedence, the default last.
func (s Set) All() []*Named { return s.named }

// Conflict says how a message's policy header, label, disagrees with the
// policy chosen for it, or "" when it agrees (or is empty: a message from
// an earlier rebound, or a first failure). It disagrees when it names
// that policy with another fingerprint (the replica that wrote it has other
// parameters for it), a policy s does not have, or another policy of s
// (the replica that wrote it chooses policies by other queues, or has no
// named policies; or, rarely, the message moved to another queue). That
// is how two replicas configured differently find each other.
func (s Set) Conflict(label string, chosen *Named) string {
	if label == "" || label == chosen.Label() {
		return ""
	}
	name, _, _ := strings.Cut(label, ":")
	switch other, ok := s.Lookup(name); {
	case !ok:
		return "names a policy this replica does not have"
	case other != chosen:
		return "names policy " + name + ", where this replica chooses " + chosen.Name + " for the message's origin queue"
	}
	return "names the chosen policy with another fingerprint than this replica's (" + chosen.Fingerprint + ")"
}

// fingerprint returns 8 hex digits of a hash of p's parameters: equal for
// equal parameters on every replica, in every run and every version of
// rebound that has these parameters. A parameter added later is left out
// of the hash while it has its zero value, so that adding one does not
// change the fingerprints of policies that do not use it.
func (p Policy) fingerprint() string {
	var b strings.Builder
	field := func(name, value string) {
		b.WriteString(name)
		b.WriteByte('=')
		b.WriteString(value)
		b.WriteByte(';')
	}
	number := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
	field("backoff", string(p.Backoff))
	field("min", strconv.FormatInt(int64(p.MinDelay), 10))
	field("max", strconv.FormatInt(int64(p.MaxDelay), 10))
	field("multiplier", number(p.Multiplier))
	field("jitter", string(p.Jitter))
	field("jitter-factor", number(p.JitterFactor))
	field("jitter-max", strconv.FormatInt(int64(p.JitterMax), 10))
	field("immediate", strconv.Itoa(p.ImmediateRetries))
	field("max-retries", strconv.Itoa(p.MaxRetries))
	field("max-duration", strconv.FormatInt(int64(p.MaxDuration), 10))
	field("deadline", string(p.Deadline))
	if p.RetryRate != 0 {
		field("retry-rate", number(p.RetryRate))
	}
	if p.digits() != defaultDelayDigits {
		field("delay-digits", strconv.Itoa(p.digits()))
	}
	h := fnv.New32a()
	h.Write([]byte(b.String()))
	return fmt.Sprintf("%08x", h.Sum32())
}
