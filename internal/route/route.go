// Package route holds the rules of where a dead-lettered message goes and
// what its copy carries: whether it may go back to its origin queue, which
// policy decides for it, what that policy decides, and the destination and
// headers of the copy rebound publishes. It is pure: no I/O, no clock, no
// randomness of its own. The one broker fact it needs, whether the origin
// queue exists, its callers ask the broker for between CheckOrigin and
// Decide; the one state, the retry rate budget's calendar, the sidecar
// hands to Budget, between Decide and Plan.
//
// The sidecar, `rebound parked replay` and `rebound delayed` all route
// through it, so that a message gets the same answer whoever handles it.
// A copy waiting in a delay queue goes back to the queue its routing key
// names: that is where the broker sends it when its delay ends.
package route

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/calendar"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
)

// Router applies one deployment's rules. The zero Router is not useful;
// every field is required.
type Router struct {
	Topology topology.Topology // rebound's queues, and the allowlist of origins
	Policies policy.Set        // the policies, chosen by origin queue
	Codec    headers.Codec     // the header names
}

// Route is what was decided for one message.
type Route struct {
	Origin Origin
	// Policy is the policy the origin queue selects (the default one for
	// an unknown origin): the one that decided, and whose label the copy
	// carries.
	Policy   *policy.Named
	Decision policy.Decision
	// Why says, for people, why the message is parked before its policy
	// was asked (its origin refused, or gone); "" otherwise.
	Why string
	// Conflict says how the message's policy header disagrees with Policy
	// (policy.Set.Conflict); "" when it agrees or has none.
	Conflict string
	// Budget is what the retry rate budget did to the copy (Budget, the
	// step); Added the delay it added to the policy's.
	Budget calendar.Outcome
	Added  time.Duration
}

// Decide decides for a message whose state s was decoded from its
// headers, with origin o (CheckOrigin) and exists, the broker's word on
// whether o.Queue exists (not asked, and ignored, when o refuses). A
// message that may not go back is parked for o's reason; one whose
// origin is gone is parked UnknownOrigin (the broker would drop its copy
// when the delay ends); every other message gets its policy's decision,
// as of now, with rng.
func (r Router) Decide(s headers.State, o Origin, exists bool, now time.Time, rng policy.Rand) Route {
	rt := Route{Origin: o, Policy: r.Policies.For(o.Queue)}
	rt.Conflict = r.Policies.Conflict(s.Policy, rt.Policy)
	switch {
	case o.Refused != "":
		rt.Decision, rt.Why = policy.Decision{Reason: o.Refused}, o.Why
	case !exists:
		rt.Decision, rt.Why = policy.Decision{Reason: policy.UnknownOrigin}, "origin queue does not exist"
	default:
		rt.Decision = rt.Policy.Decide(s.State, now, rng)
	}
	return rt
}

// Budget is the step between Decide and Plan when the policy caps its
// retry rate (REBOUND_RETRY_RATE): it books the retry rt, decided as of
// now for a message in state s, in this replica's calendar cal at its
// share sh of the rate (calendar.Retry), and returns rt with the delay
// the budget allows, which Plan then gives the copy: what Plan answers is
// what is published. A park, and a policy without a rate, pass as they
// are.
func (r Router) Budget(rt Route, s headers.State, now time.Time, cal *calendar.Calendar, sh calendar.Share) Route {
	if !rt.Decision.Retry || rt.Policy.RetryRate <= 0 {
		return rt
	}
	wanted := rt.Decision.Delay
	rt.Decision.Delay, rt.Budget = cal.Retry(rt.Origin.Queue, now, rt.Policy.Policy, s.State, wanted, sh)
	rt.Added = rt.Decision.Delay - wanted
	return rt
}

// Plan returns where the copy of d goes and what it carries, given the
// state decoded from its headers and the route decided for it, as of
// now:
//
//   - park (decision.Retry false): to the parking queue, with the reason
//     and the time;
//   - retry at once (delay 0): straight back to the origin queue;
//   - retry after a delay: into that delay's queue, which hands it back to
//     the origin queue when the delay ends; the copy says when that is.
//
// The copy keeps the body, the properties (but expiration and user id)
// and every application header; it carries the retry state rewritten,
// the label of the policy that decided, and none of the broker's headers
// (dead-letter records, CC, BCC).
func (r Router) Plan(d amqp.Delivery, s headers.State, rt Route, now time.Time) (topology.Destination, amqp.Publishing) {
	s.Origin = rt.Origin.Queue
	s.Policy = rt.Policy.Label()
	switch decision := rt.Decision; {
	case !decision.Retry:
		return topology.Direct(r.Topology.ParkingQueue), copyOf(d, r.Codec.Park(d.Headers, s, decision.Reason, now))
	case decision.Delay == 0:
		return topology.Direct(s.Origin), copyOf(d, r.Codec.Retry(d.Headers, s, 0, time.Time{}))
	default:
		return r.Topology.Delayed(decision.Delay, s.Origin), copyOf(d, r.Codec.Retry(d.Headers, s, decision.Drawn, now.Add(decision.Delay)))
	}
}

// Replay returns the copy `rebound parked replay` sends back to origin (a
// queue CheckOrigin allowed, that exists): straight to it, with the retry
// state reset as of now (headers.Codec.Replay).
func (r Router) Replay(d amqp.Delivery, origin string, now time.Time) (topology.Destination, amqp.Publishing) {
	return topology.Direct(origin), copyOf(d, r.Codec.Replay(d.Headers, origin, now))
}

// Flush returns the copy `rebound delayed flush` sends straight back to
// origin (a queue CheckOrigin allowed) from a delay queue, where d waited:
// its headers as they were, but the broker's and the due time.
func (r Router) Flush(d amqp.Delivery, origin string) (topology.Destination, amqp.Publishing) {
	return topology.Direct(origin), copyOf(d, r.Codec.Moved(d.Headers, time.Time{}))
}

// Redelay returns the copy of d, read from a delay queue, that waits
// there again for what it still had to wait, wait, and then goes back to
// origin: through the delay queue of wait rounded up to the origin's
// policy's precision (later, never earlier), with its headers as they
// were but the broker's, its due time among them.
func (r Router) Redelay(d amqp.Delivery, origin string, wait time.Duration, due time.Time) (topology.Destination, amqp.Publishing) {
	delay := policy.RoundUp(wait, r.Policies.For(origin).Digits())
	return r.Topology.Delayed(delay, origin), copyOf(d, r.Codec.Moved(d.Headers, due))
}
