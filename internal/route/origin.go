package route

import "github.com/rebound-mq/rebound/policy"

// Origin is where a message may go back to, or why it may not.
type Origin struct {
	Queue string // the queue it goes back to; "" when unknown
	// Disputed is an origin header the broker's x-death record overrode,
	// for the log and the metric; "" for none.
	Disputed string
	// Refused is why it may not go back: policy.UnknownOrigin or
	// policy.OriginNotAllowed; "" when it may.
	Refused policy.Reason
	Why     string // what was wrong, for people; "" when it may go back
}

// CheckOrigin applies the rules the sidecar, `rebound parked replay` and
// `rebound delayed` share to a message's origin: recorded is the queue
// the broker's record names first (headers.State.Origin), claimed an
// origin header that disagrees with it (headers.State.ClaimedOrigin, ""
// for none). The message may go back unless its origin is unknown or one
// of rebound's own queues (a message sent "back" to one would loop through
// rebound, or slip into the parking queue unmarked), both UnknownOrigin,
// or the topology's allowlist (REBOUND_ORIGIN_QUEUES) does not allow it,
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
func (r Router) CheckOrigin(recorded, claimed string) Origin {
	t := r.Topology
	o := Origin{Queue: recorded, Disputed: claimed}
	if t.IsDelayQueue(o.Queue) && o.Disputed != "" {
		o.Queue, o.Disputed = o.Disputed, ""
	}
	switch {
	case o.Queue == "":
		o.Refused, o.Why = policy.UnknownOrigin, "no origin queue in x-death or the origin headers"
	case t.Owns(o.Queue):
		o.Refused, o.Why = policy.UnknownOrigin, "origin is one of rebound's own queues"
	case !t.Allows(o.Queue):
		o.Refused, o.Why = policy.OriginNotAllowed, "origin queue not allowed by REBOUND_ORIGIN_QUEUES"
	}
	return o
}
