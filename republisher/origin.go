package republisher

import (
	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/policy"
)

// OriginCheck is where a message may go back to, or why it may not.
type OriginCheck struct {
	Origin string // the queue it goes back to
	// Disputed is an origin header the broker's x-death record overrode,
	// for the log and the metric; "" for none.
	Disputed string
	// Refused is why it may not go back: policy.UnknownOrigin or
	// policy.OriginNotAllowed; "" when it may.
	Refused policy.Reason
	Why     string // what was wrong, for people; "" when it may go back
}

// CheckOrigin applies the rules the sidecar and `rebound parked replay`
// share to a message's decoded state: it may go back to its origin unless
// that is unknown or one of rebound's own queues (a message sent "back" to
// one would loop through rebound, or slip into the parking queue
// unmarked), both UnknownOrigin, or allowed does not allow it,
// OriginNotAllowed. Whether the queue exists is for the caller to ask the
// broker.
//
// One exception to the broker's record winning: when its newest x-death
// entry names one of rebound's delay queues, the broker last moved the
// message from there back to its origin, and a consumer then republished
// it straight into the inbox with its headers (to mark it permanent, or to
// record its error). Its origin is the one rebound wrote on that copy, in
// the origin header. A producer forging this gains nothing it could not
// get by naming the queue in a forged x-death.
func (t Topology) CheckOrigin(s headers.State, allowed func(queue string) bool) OriginCheck {
	c := OriginCheck{Origin: s.Origin, Disputed: s.ClaimedOrigin}
	if t.IsDelayQueue(c.Origin) && c.Disputed != "" {
		c.Origin, c.Disputed = c.Disputed, ""
	}
	switch {
	case c.Origin == "":
		c.Refused, c.Why = policy.UnknownOrigin, "no origin queue in x-death or the origin headers"
	case t.Owns(c.Origin):
		c.Refused, c.Why = policy.UnknownOrigin, "origin is one of rebound's own queues"
	case allowed != nil && !allowed(c.Origin):
		c.Refused, c.Why = policy.OriginNotAllowed, "origin queue not allowed by REBOUND_ORIGIN_QUEUES"
	}
	return c
}
