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
	// Returning says the message is a delayed copy whose delay ended
	// (Router.Returning): it goes on to its origin as it is, not counted
	// as another retry.
	Returning bool
	// Refused says the origin refuses copies for now, and Decision is what
	// the policy's budget allows for that (Router.Refuse): wait in a
	// delay queue, or park with policy.OriginRefused.
	Refused bool
	// Attempt is the id a copy sent straight to its origin carries
	// (headers.Attempt); "" for none.
	Attempt string
}

// Decide decides for a message whose state s was decoded from its
// headers, with origin o (CheckOrigin) and exists, the broker's word on
// whether o.Queue exists (not asked, and ignored, when o refuses). A
// message that may not go back is parked for o's reason; one whose
// origin is gone is parked UnknownOrigin (the broker would drop its copy
// when the delay ends); every other message gets its policy's decision,
// as of now, with rng.
func (r Router) Decide(s headers.State, o Origin, exists bool, now time.Time, rng policy.Rand) Route {
	rt, parked := r.start(s, o, exists)
	if !parked {
		rt.Decision = rt.Policy.Decide(s.State, now, rng)
	}
	return rt
}

// start is what Decide and Return share: the route of a message with
// origin o, its policy and its conflict, and parked true with the
// decision made when o refuses or its queue is gone.
func (r Router) start(s headers.State, o Origin, exists bool) (rt Route, parked bool) {
	rt = Route{Origin: o, Policy: r.Policies.For(o.Queue)}
	rt.Conflict = r.Policies.Conflict(s.Policy, rt.Policy)
	switch {
	case o.Refused != "":
		rt.Decision, rt.Why = policy.Decision{Reason: o.Refused}, o.Why
	case !exists:
		rt.Decision, rt.Why = policy.Decision{Reason: policy.UnknownOrigin}, "origin queue does not exist"
	default:
		return rt, false
	}
	return rt, true
}

// Returning reports whether d is a delayed copy coming back from its
// delay queue (Topology.Delayed): the broker dead-lettered it, its delay
// over, from one of rebound's delay queues to the default exchange under
// the inbox's name. Only the broker writes that record of it: RabbitMQ
// 4.x ignores an x-death a client sets. On 3.x a client that may publish
// into the inbox can forge one; what it gains is what a forged x-death
// naming a queue gains it anyway: the copy goes to the queue its origin
// header names if CheckOrigin allows that queue, never to one of
// rebound's own. A consumer that republishes into the inbox a message an
// earlier rebound's delay queue sent it (the routing key was the origin
// then) is not taken for one.
func (r Router) Returning(d amqp.Delivery) bool {
	inbox := r.Topology.InboxQueue
	if d.Exchange != "" || d.RoutingKey != inbox {
		return false
	}
	deaths, _ := d.Headers[headers.XDeath].([]any)
	if len(deaths) == 0 {
		return false
	}
	newest, _ := deaths[0].(amqp.Table)
	queue, _ := newest["queue"].(string)
	reason, _ := newest["reason"].(string)
	keys, _ := newest["routing-keys"].([]any)
	return reason == "expired" && r.Topology.IsDelayQueue(queue) && len(keys) == 1 && keys[0] == inbox
}

// Twin returns the attempt id (headers.Attempt) of d when d may be the
// twin of a copy rebound sent straight to its origin queue: a message the
// origin dead-lettered for maxlen as it refused it (overflow
// reject-publish-dlx). Only the replica that made that attempt knows
// whether the broker refused it (then d is a twin, and the refused copy is
// still rebound's) or took it (then d is a message the queue dropped,
// and it is retried like any other); "" when d is neither.
func (r Router) Twin(d amqp.Delivery) string {
	id, _ := d.Headers[headers.Attempt].(string)
	if id == "" {
		return ""
	}
	deaths := headers.Deaths(d.Headers)
	if len(deaths) == 0 || deaths[0].Reason != "maxlen" {
		return ""
	}
	return id
}

// Return decides for a delayed copy coming back (Returning), whose state
// s was decoded from its headers, with origin o (CheckOrigin, which takes
// the origin header for a copy the broker's record says left a delay
// queue) and exists, as Decide takes them: it goes on to its origin at
// once, or is parked when it may not (its origin refused by the rules, or
// gone). The policy is not asked: the copy is the retry it already
// decided.
func (r Router) Return(s headers.State, o Origin, exists bool) Route {
	rt, parked := r.start(s, o, exists)
	rt.Returning = true
	if !parked {
		rt.Decision = policy.Decision{Retry: true}
	}
	return rt
}

// Refuse turns rt, a route that sends the copy straight to its origin (a
// returning copy, or an immediate retry), into what the policy's budget
// allows while the origin refuses copies, until it is tried again after
// wait (policy.Policy.Refused): wait in a delay queue, or park with
// policy.OriginRefused. Any other route is returned as it is.
func (r Router) Refuse(rt Route, s headers.State, now time.Time, wait time.Duration) Route {
	if !rt.Decision.Retry || rt.Decision.Delay != 0 {
		return rt
	}
	rt.Decision, rt.Refused = rt.Policy.Refused(s.State, now, wait), true
	if !rt.Decision.Retry {
		rt.Why = "origin queue kept refusing the copy until the budget was spent"
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
//     rebound when the delay ends (Topology.Delayed); the copy says when
//     that is;
//   - a returning copy (rt.Returning): straight to its origin, its
//     headers as they were but the broker's (its due time kept, when
//     readable); one whose origin refuses it
//     (rt.Refused) into a delay queue again, counted as a retry only when
//     the policy has no duration budget (policy.Policy.Refused).
//
// In hold mode every retry, at once or later, and every returning copy
// goes through the hold queue with its due time (now for one at once),
// and the holder sends it back when it is due (holder/release.go), and
// a park goes through the parking exchange (Topology.Parked): the
// sidecar then never writes to the default exchange, which reaches every
// queue of the vhost. Such a copy carries its table and array headers twice
// (headers.HoldTables), so that a holder can park it whole.
//
// The copy keeps the body, the properties (but expiration and user id)
// and every application header; it carries the retry state rewritten,
// the label of the policy that decided, the failure's group (Group), the
// error reported with this failure stamped with its retry count
// (Reported), and none of the broker's headers (dead-letter records, CC,
// BCC) nor one attempt's word (Retry-After, annotations).
func (r Router) Plan(d amqp.Delivery, s headers.State, rt Route, now time.Time) (topology.Destination, amqp.Publishing) {
	s.Origin = rt.Origin.Queue
	s.Policy = rt.Policy.Label()
	s.Group = r.group(s, s.Origin, rt.Decision)
	if text, ok := r.reported(s); ok {
		s.Error, s.ErrorCurrent = text, true
	}
	switch decision := rt.Decision; {
	case !decision.Retry:
		return r.Topology.Parked(), copyOf(d, r.Codec.Park(d.Headers, s, decision.Reason, now))
	case rt.Returning && r.Topology.Hold:
		// A copy a delay queue of queues mode sent back, after a switch to
		// hold: home through the hold queue too, due when its delay ended.
		due := now.Add(decision.Delay)
		if decision.Delay == 0 && !s.DueAt.IsZero() {
			due = s.DueAt
		}
		h := r.Codec.Moved(d.Headers, due)
		headers.HoldTables(h)
		return r.Topology.Held(s.Origin), copyOf(d, h)
	case rt.Returning && decision.Delay == 0:
		// Its delay did end: the copy keeps saying when, for the
		// application (the retry rate budget's promise is counted from it).
		dest, msg := topology.Direct(s.Origin), copyOf(d, r.Codec.Moved(d.Headers, s.DueAt))
		if rt.Attempt != "" {
			headers.MarkAttempt(msg.Headers, rt.Attempt)
		}
		return dest, msg
	case rt.Returning && rt.Policy.MaxDuration > 0:
		return r.Topology.Delayed(decision.Delay), copyOf(d, r.Codec.Moved(d.Headers, now.Add(decision.Delay)))
	case rt.Returning:
		return r.Topology.Delayed(decision.Delay), copyOf(d, r.Codec.Retry(d.Headers, s, s.LastDelay, now.Add(decision.Delay)))
	case r.Topology.Hold:
		h := r.Codec.Retry(d.Headers, s, decision.Drawn, now.Add(decision.Delay))
		headers.HoldTables(h)
		return r.Topology.Held(s.Origin), copyOf(d, h)
	case decision.Delay == 0:
		h := r.Codec.Retry(d.Headers, s, 0, time.Time{})
		if rt.Attempt != "" {
			headers.MarkAttempt(h, rt.Attempt)
		}
		return topology.Direct(s.Origin), copyOf(d, h)
	default:
		return r.Topology.Delayed(decision.Delay), copyOf(d, r.Codec.Retry(d.Headers, s, decision.Drawn, now.Add(decision.Delay)))
	}
}

// Replay returns the copy `rebound parked replay` sends back to origin (a
// queue CheckOrigin allowed, that exists): straight to it, with the retry
// state reset as of now (headers.Codec.Replay).
func (r Router) Replay(d amqp.Delivery, origin string, now time.Time) (topology.Destination, amqp.Publishing) {
	return topology.Direct(origin), copyOf(d, r.Codec.Replay(d.Headers, origin, now))
}

// Redirect returns the copy `rebound parked replay --to` sends to queue to
// (a queue CheckOrigin allowed, that exists) instead of the message's
// origin, from ("" when unknown): straight to it, with the retry state
// reset as a replay's, and the redirected-from header naming from.
func (r Router) Redirect(d amqp.Delivery, from, to string, now time.Time) (topology.Destination, amqp.Publishing) {
	return topology.Direct(to), copyOf(d, r.Codec.Redirect(d.Headers, from, to, now))
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
	delay := r.Policies.For(origin).RoundUp(wait)
	return r.Topology.Delayed(delay), copyOf(d, r.Codec.Moved(d.Headers, due))
}

// WaitingOrigin is the origin queue of d, a copy read from a delay queue,
// whose state s was decoded from its headers: the queue its routing key
// names, where the broker sends it when its delay ends, for a copy an
// earlier rebound published; the origin header for one that comes back
// through the inbox (Topology.Delayed).
func (r Router) WaitingOrigin(d amqp.Delivery, s headers.State) string {
	if d.RoutingKey == r.Topology.InboxQueue {
		return s.Origin
	}
	return d.RoutingKey
}
