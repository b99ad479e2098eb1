package consumer

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/policy"
	"github.com/rebound-mq/rebound/republisher"
)

// Plan returns where the copy of d goes and what it carries, given the
// state decoded from its headers and the decision taken on it, as of now.
// It is the whole of the sidecar's work on a message besides I/O:
//
//   - park (decision.Retry false): to the parking queue, with the reason
//     and the time;
//   - retry at once (delay 0): straight back to the origin queue;
//   - retry after a delay: into that delay's queue, which hands it back to
//     the origin queue when the delay ends.
//
// The copy keeps the body, the properties (but expiration and user id)
// and every application header; it carries the retry state rewritten,
// and none of the broker's headers (dead-letter records, CC, BCC).
func Plan(topo republisher.Topology, codec headers.Codec, d amqp.Delivery, state headers.State, decision policy.Decision, now time.Time) (republisher.Destination, amqp.Publishing) {
	switch {
	case !decision.Retry:
		return republisher.Direct(topo.ParkingQueue), republisher.Copy(d, codec.Park(d.Headers, state, decision.Reason, now))
	case decision.Delay == 0:
		return republisher.Direct(state.Origin), republisher.Copy(d, codec.Retry(d.Headers, state, 0))
	default:
		return topo.Delayed(decision.Delay, state.Origin), republisher.Copy(d, codec.Retry(d.Headers, state, decision.Drawn))
	}
}
