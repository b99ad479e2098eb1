// Package parking operates on rebound's parking queue from outside the
// sidecar: it lists, inspects, replays and purges parked messages, for the
// `rebound parked` command.
//
// Every operation reads the queue once through a republisher.Mover: a
// message is removed only once its fate is settled (for a replay, once the
// broker has confirmed the copy sent back to the origin queue and did not
// return it), and every other one is requeued, so a command killed at any
// point loses nothing (at worst a message is both replayed and still
// parked). A replay follows the sidecar's rules of where a message may go
// (package route).
//
// A Queue is not safe for concurrent use; run one operation at a time.
package parking

import (
	"regexp"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/group"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/policy"
	"github.com/rebound-mq/rebound/republisher"
)

// Message is one parked message as read from the parking queue.
type Message struct {
	Delivery  amqp.Delivery
	Reason    string    // why it was parked; "" when unknown
	ParkedAt  time.Time // zero when unknown
	Origin    string    // queue a replay sends it to; "" when unknown
	Retries   int       // retries scheduled before it was parked
	StartedAt time.Time // task start, as rebound reads it
	Error     string    // the consumer's last error header, if any
	// FirstDeathReason and FirstDeathQueue say why and where the task was
	// first dead-lettered (rejected, expired, maxlen, delivery_limit).
	FirstDeathReason, FirstDeathQueue string
	// Policy is the label ("<name>:<fingerprint>") of the policy that
	// parked it; "" when unknown (an earlier rebound, or the broker).
	Policy string
	// Group is the failure's group: the group header, or, on a message
	// parked before rebound wrote one, computed the same way (group.Of).
	Group string
	// Reported is the error the group was made of: the error reported
	// with the failure that parked the message; "" when the group is its
	// origin's and reason's. Error may still hold an earlier attempt's.
	Reported string
	// ErrorRetry is the retry count Error was reported at (-1: before a
	// replay); ErrorStamped says the message says so.
	ErrorRetry   int
	ErrorStamped bool
	// RedirectedFrom is the origin of a message `parked replay --to` sent
	// elsewhere and that came back parked; "" otherwise.
	RedirectedFrom string
}

// ID returns the message id property.
func (m Message) ID() string { return m.Delivery.MessageId }

// Filter selects parked messages. The zero Filter selects every message.
type Filter struct {
	Reason    string        // parked reason equals this
	Origin    string        // origin queue equals this
	OlderThan time.Duration // parked more than this long ago (unknown parked-at never matches)
	ID        string        // message id equals this
	Group     string        // failure group equals this
	Limit     int           // act on at most this many matches; 0 = no limit
	// ParkedBefore: parked before this time (zero: any; an unknown
	// parked-at matches).
	ParkedBefore time.Time
	// Origins: the origin queue matches this regular expression
	// (unanchored, as REBOUND_ORIGIN_QUEUES and `rebound delayed
	// --origin`); nil for any.
	Origins *regexp.Regexp
	// SkipReasons: never a message parked for one of these, unless
	// Reason names it.
	SkipReasons []string
}

// Bound is the earlier of f's ParkedBefore and t: the bound that keeps
// an action to what was there at t, and to f's own bound when that came
// first.
func (f Filter) Bound(t time.Time) time.Time {
	if !f.ParkedBefore.IsZero() && f.ParkedBefore.Before(t) {
		return f.ParkedBefore
	}
	return t
}

// match reports whether m passes every condition of f except Limit.
func (f Filter) match(m Message, now time.Time) bool {
	switch {
	case f.Reason != "" && m.Reason != f.Reason:
		return false
	case f.Origin != "" && m.Origin != f.Origin:
		return false
	case f.ID != "" && m.ID() != f.ID:
		return false
	case f.Group != "" && m.Group != f.Group:
		return false
	case f.OlderThan > 0 && (m.ParkedAt.IsZero() || now.Sub(m.ParkedAt) < f.OlderThan):
		return false
	case !f.ParkedBefore.IsZero() && !m.ParkedAt.IsZero() && !m.ParkedAt.Before(f.ParkedBefore):
		return false
	case f.Origins != nil && !f.Origins.MatchString(m.Origin):
		return false
	case m.Reason != f.Reason && slices.Contains(f.SkipReasons, m.Reason):
		return false
	}
	return true
}

// Queue is the parking queue of a deployment, reached through one
// connection.
type Queue struct {
	Conn *amqp.Connection
	// PubConn, if not nil, is where replayed copies go out (Conn
	// otherwise): the broker throttles a connection that publishes, and
	// reads on it with it (see republisher.Mover.PublishThrough).
	PubConn *amqp.Connection
	// Router holds the deployment's topology (the allowlist of origins
	// among it), policies and header names.
	Router route.Router
	// ConfirmTimeout bounds the wait for the broker's confirm of a
	// replayed copy; 0 means 30s.
	ConfirmTimeout time.Duration
	// Tracer, if not nil, gives each replayed message a span (package
	// tracing).
	Tracer trace.Tracer
}

// Name is the parking queue's name.
func (q Queue) Name() string { return q.Router.Topology.ParkingQueue }

// decode reads what rebound wrote on a parked delivery, or, for a message
// the broker moved there from rebound's quorum inbox after its delivery
// limit, what the broker wrote: reason delivery-limit, parked when the
// inbox dead-lettered it, origin the queue that dead-lettered it into the
// inbox before (else the origin header).
func (q Queue) decode(d amqp.Delivery, now time.Time) Message {
	codec := q.Router.Codec
	s, _ := codec.Decode(d.Headers, d.Timestamp, now, nil)
	m := Message{Delivery: d, Origin: s.Origin, Retries: s.Retries, StartedAt: s.StartedAt,
		FirstDeathReason: s.FirstDeathReason, FirstDeathQueue: s.FirstDeathQueue, Policy: s.Policy}
	if reason, at, ok := codec.Parked(d.Headers); ok {
		m.Reason, m.ParkedAt = string(reason), at
	} else if deaths := headers.Deaths(d.Headers); len(deaths) > 0 && deaths[0].Queue == q.Router.Topology.InboxQueue && deaths[0].Reason == "delivery_limit" {
		m.Reason, m.ParkedAt = string(policy.DeliveryLimit), deaths[0].Time
		m.Origin = s.ClaimedOrigin // the origin header, rebound's own
		for _, earlier := range deaths[1:] {
			if earlier.Queue != "" && !q.Router.Topology.Owns(earlier.Queue) {
				m.Origin = earlier.Queue
				break
			}
		}
	}
	m.Error, m.ErrorRetry, m.ErrorStamped = s.Error, s.ErrorRetry, s.ErrorStamped
	m.RedirectedFrom, _ = d.Headers[codec.Names.RedirectedFrom].(string)
	m.Reported = reported(s)
	m.Group = s.Group
	if m.Group == "" {
		m.Group = group.Of(m.Origin, m.Reported, m.Reason)
	}
	return m
}

// reported is the error reported with the failure that parked a message
// whose state is s: rebound stamps it with the retry count it parks the
// message at, so an error stamped otherwise came from an earlier attempt;
// an unstamped one was parked by a rebound that did not stamp errors, or
// by the broker. An annotation the broker carried along counts when the
// header does not.
func reported(s headers.State) string {
	if s.Error != "" && (!s.ErrorStamped || s.ErrorRetry == s.Retries) {
		return s.Error
	}
	return s.OptError
}

// open opens a Mover on the parking queue.
func (q Queue) open() (*republisher.Mover, error) {
	timeout := q.ConfirmTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	m, err := republisher.OpenMover(q.Conn, q.Router.Topology, q.Name(), replayBatch, timeout)
	if err == nil && q.PubConn != nil {
		m.PublishThrough(q.PubConn)
	}
	if err == nil {
		m.Trace(q.Tracer, "replay")
	}
	return m, err
}
