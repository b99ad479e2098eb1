// Package holder holds rebound's delayed copies in hold mode
// (REBOUND_DELAY_MODE=hold, RabbitMQ 4.3+). Every delayed copy waits in
// one quorum queue, the hold queue; a holder consumes it over AMQP 1.0
// and settles each copy it is given: one not yet due is returned with
// the modified outcome and the annotation x-opt-delivery-time, and the
// broker holds it until then; one that is due is rejected, and the broker
// dead-letters it, as it is, into its origin queue (its routing key). A
// copy is held at most a slice at a time, so that it comes back to a
// holder at least once a slice.
//
// The decision for one copy is judge, a pure function of what the copy
// carries and the time; Holder is the I/O around it. Every header a copy
// carries is untrusted: its due time is clamped to its policy's max delay
// from now, and a copy that would go somewhere rebound may not send it is
// parked.
//
// Concurrency: Run owns every goroutine it starts and returns after they
// have ended, every settlement written before its connection closed.
package holder

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
)

// Annotations the broker writes on a message it delivers over AMQP 1.0:
// the routing key a copy was published with (its origin), and the CC
// header's queues, which dead-lettering routes to as well.
const (
	routingKeyAnnotation = "x-routing-key"
	ccAnnotation         = "x-cc"
)

// Rules are what a holder judges copies by. Every field is required.
type Rules struct {
	Topology topology.Topology // rebound's queues, and the allowlist of origins
	Policies policy.Set        // each origin's max delay
	Codec    headers.Codec     // the header names; the due time's reader
	Slice    time.Duration     // REBOUND_HOLD_SLICE
}

// heldCopy is what a holder reads of a held copy: its message annotations
// (AMQP 0-9-1 headers whose names start with x-, and the broker's) and its
// application properties (the other headers).
type heldCopy struct {
	Annotations map[any]any
	Properties  map[string]any
}

// action is what is done with a copy.
type action int

// Actions.
const (
	hold    action = iota // return it to wait until verdict.Until
	release               // reject it: the broker sends it to its origin
	park                  // publish it to the parking queue, then accept it
)

func (a action) String() string {
	switch a {
	case hold:
		return "held"
	case release:
		return "released"
	default:
		return "parked"
	}
}

// verdict is what judge decided for a copy.
type verdict struct {
	Action action
	Origin string
	// Due is the copy's due time as trusted: read, and clamped to its
	// policy's max delay from now. Zero when unreadable (the copy is then
	// due now).
	Due time.Time
	// Until is when a held copy comes back: the sooner of Due and now +
	// the slice.
	Until time.Time
	// Reason is why a copy is parked.
	Reason policy.Reason
	// Problem says, for the log, what was wrong with the copy's headers;
	// "" when nothing was.
	Problem string
}

// judge decides what is done with c as of now: parked when its origin
// is missing, one of rebound's own queues, not allowed, or joined by CC
// queues (the broker would dead-letter it to those too); released when
// due; held otherwise. Of cmds, the first that applies to c (a flush or
// cancel of its origin, issued after c entered the hold queue, and still
// lasting) releases it now or parks it cancelled.
func (r Rules) judge(c heldCopy, now time.Time, cmds []command) verdict {
	origin, _ := c.Annotations[routingKeyAnnotation].(string)
	v := verdict{Origin: origin}
	switch {
	case origin == "" || r.Topology.Owns(origin):
		v.Action, v.Reason = park, policy.UnknownOrigin
		v.Problem = fmt.Sprintf("routing key %q is not an application queue", origin)
		return v
	case !r.Topology.Allows(origin):
		v.Action, v.Reason = park, policy.OriginNotAllowed
		v.Problem = fmt.Sprintf("origin %q does not match REBOUND_ORIGIN_QUEUES", origin)
		return v
	case c.Annotations[ccAnnotation] != nil:
		v.Action, v.Reason = park, policy.OriginNotAllowed
		v.Problem = "the copy carries CC queues, which the broker would send it to as well"
		return v
	}
	name := r.Codec.Names.DueAt
	raw, ok := c.Annotations[name]
	if !ok {
		raw, ok = c.Properties[name]
	}
	s, problems := r.Codec.Decode(amqp.Table{name: raw}, time.Time{}, now, nil)
	due := s.DueAt
	if !ok || len(problems) > 0 || due.IsZero() {
		v.Action = release
		v.Problem = fmt.Sprintf("%s %v unreadable: due now", name, raw)
		return v
	}
	if latest := now.Add(r.Policies.For(origin).MaxDelay); due.After(latest) {
		v.Problem = fmt.Sprintf("%s %s is past the policy's max delay from now: clamped to %s", name, due.UTC().Format(time.RFC3339Nano), latest.UTC().Format(time.RFC3339Nano))
		due = latest
	}
	v.Due = due
	if entered := due.Add(-r.lastDelay(c)); len(cmds) > 0 {
		for _, cmd := range cmds {
			if !cmd.applies(origin, entered, now, r.Slice) {
				continue
			}
			if cmd.Op == opCancel {
				v.Action, v.Reason = park, policy.Cancelled
			} else {
				v.Action, v.Due = release, time.Time{}
			}
			return v
		}
	}
	if !due.After(now) {
		v.Action = release
		return v
	}
	v.Action, v.Until = hold, due
	if slice := now.Add(r.Slice); slice.Before(due) {
		v.Until = slice
	}
	return v
}

// lastDelay is the delay c was published with (x-retry-last-delay-ms, the
// delay drawn), which puts when it entered the hold queue at its due time
// less that; 0 when unreadable.
func (r Rules) lastDelay(c heldCopy) time.Duration {
	name := r.Codec.Names.LastDelay
	raw, ok := c.Annotations[name]
	if !ok {
		raw, ok = c.Properties[name]
	}
	if !ok {
		return 0
	}
	s, problems := r.Codec.Decode(amqp.Table{name: raw}, time.Time{}, time.Time{}, nil)
	if len(problems) > 0 {
		return 0
	}
	return s.LastDelay
}
