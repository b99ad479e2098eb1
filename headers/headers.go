// Package headers reads rebound's retry state from AMQP message headers and
// writes it back onto the copies rebound republishes.
//
// It is the only package that knows header names and wire types. Reading is
// lenient (any integer type, floats, strings, timestamps; RabbitMQ's x-death
// as written and as it arrives malformed) and never fails: an unreadable
// header is reported as a Problem and treated as absent. Writing is strict:
// 64-bit integers, strings and booleans only, so whatever is written passes
// amqp.Table.Validate and reads back as it was meant. A Codec is safe for
// concurrent use.
package headers

import (
	"strings"
	"time"

	"github.com/rebound-mq/rebound/policy"
)

// Names are the header names rebound reads and writes. Each can be changed
// by configuration, so a team with its own conventions keeps them.
type Names struct {
	RetryCount    string // x-retry-count
	TaskStartedAt string // x-task-started-at
	LastDelay     string // x-retry-last-delay-ms
	OriginQueue   string // x-retry-origin-queue
	NonRetryable  string // x-retry-non-retryable
	Error         string // x-retry-error
	ParkedReason  string // x-retry-parked-reason
	ParkedAt      string // x-retry-parked-at
	// FirstDeathReason and FirstDeathQueue say why and where the task
	// was first dead-lettered (rejected, expired, maxlen, delivery_limit):
	// what RabbitMQ's x-first-death-* said, kept on rebound's copies,
	// which do not carry the broker's dead-letter headers.
	FirstDeathReason string // x-retry-first-death-reason
	FirstDeathQueue  string // x-retry-first-death-queue
	// Policy names the policy that made the last decision, as
	// "<name>:<fingerprint>" (policy.Named.Label).
	Policy string // x-retry-policy
	// DueAt is when a delayed copy's delay ends, Unix ms: what lets
	// `rebound delayed flush` move waiting copies without losing their
	// place in time.
	DueAt string // x-retry-due-at

	// The consumer's word on one failure. RetryAfter is the least delay it
	// asks for (a dependency's Retry-After); ErrorRetry the retry count at
	// which the error header was reported, written by rebound; Group the
	// failure's group (package group), written by rebound on every copy
	// and parked message; RedirectedFrom the origin of a message `rebound
	// parked replay --to` sent to another queue.
	RetryAfter     string // x-retry-after
	ErrorRetry     string // x-retry-error-retry
	Group          string // x-retry-group
	RedirectedFrom string // x-retry-redirected-from
	// The same facts as AMQP 1.0 message annotations: a consumer that
	// settles a delivery with the modified outcome sets them, and RabbitMQ
	// 4.x carries them into the dead-lettered message, from quorum queues
	// (classic queues drop them). Read like their twins above, which win
	// when both are present; never written on a copy.
	OptError        string // x-opt-retry-error
	OptNonRetryable string // x-opt-retry-non-retryable
	OptRetryAfter   string // x-opt-retry-after
}

// DefaultNames returns the header names of DESIGN.md.
func DefaultNames() Names {
	return Names{
		RetryCount:    "x-retry-count",
		TaskStartedAt: "x-task-started-at",
		LastDelay:     "x-retry-last-delay-ms",
		OriginQueue:   "x-retry-origin-queue",
		NonRetryable:  "x-retry-non-retryable",
		Error:         "x-retry-error",
		ParkedReason:  "x-retry-parked-reason",
		ParkedAt:      "x-retry-parked-at",

		FirstDeathReason: "x-retry-first-death-reason",
		FirstDeathQueue:  "x-retry-first-death-queue",
		Policy:           "x-retry-policy",
		DueAt:            "x-retry-due-at",

		RetryAfter:     "x-retry-after",
		ErrorRetry:     "x-retry-error-retry",
		Group:          "x-retry-group",
		RedirectedFrom: "x-retry-redirected-from",

		OptError:        "x-opt-retry-error",
		OptNonRetryable: "x-opt-retry-non-retryable",
		OptRetryAfter:   "x-opt-retry-after",
	}
}

// attempt lists the headers that hold one attempt's word, removed from
// every copy once read: a relative Retry-After applies once, and an
// annotation a consumer set on one failure says nothing of the next.
func (n Names) attempt() [4]string {
	return [...]string{n.RetryAfter, n.OptError, n.OptNonRetryable, n.OptRetryAfter}
}

// Read lists the headers Decode reads and reports problems with, under
// their configured names: the label values of the invalid-header metric.
func (n Names) Read() []string {
	return []string{n.RetryCount, n.TaskStartedAt, n.LastDelay, n.OriginQueue, n.NonRetryable, n.Policy, n.DueAt, XDeath, xFirstDeathQueue,
		n.RetryAfter, n.ErrorRetry, n.OptNonRetryable, n.OptRetryAfter}
}

// Headers RabbitMQ writes when it dead-letters a message. rebound reads
// them only to find the origin queue, the first failure's time, reason and
// queue, never to count retries: RabbitMQ 4.x ignores an x-death set by a
// client and 3.13 changed how it counts.
const (
	XDeath            = "x-death"
	xFirstDeathQueue  = "x-first-death-queue"
	xFirstDeathReason = "x-first-death-reason"
	// XOptDeliveryTime is the AMQP 1.0 message annotation (Unix ms) a
	// holder returns a copy to the hold queue with: the broker holds the
	// copy until then, and leaves the annotation on it as a header when it
	// dead-letters the copy home.
	XOptDeliveryTime = "x-opt-delivery-time"
)

// brokerHeaders are the headers RabbitMQ owns: those it writes on a
// message it dead-letters or delivers, and those it routes a publish on.
// rebound's copies never carry them. On RabbitMQ 3.10 (and 3.13.3 to
// 3.13.7) a copied x-death that names the origin queue without a
// "rejected" entry makes the broker drop the copy as a dead-letter cycle
// when its delay ends; the delivery counts of one queue mean nothing in
// another, as does the hold queue's delivery time; and CC and BCC send a publish to more queues than its routing
// key names, and rebound may publish to every queue of its vhost.
var brokerHeaders = [...]string{
	XDeath, xFirstDeathQueue, xFirstDeathReason, "x-first-death-exchange",
	"x-last-death-queue", "x-last-death-reason", "x-last-death-exchange",
	"x-delivery-count", "x-acquired-count", XOptDeliveryTime, "CC", "BCC",
}

// legacyDelayHeader is what rebound routed delayed copies on when they
// went through one shared headers exchange: copies made then still carry
// it, and the writers drop it.
const legacyDelayHeader = "rebound-delay-ms"

// BrokerOwned reports whether a header is one RabbitMQ owns (see
// brokerHeaders): none of rebound's header names may be one.
func BrokerOwned(name string) bool {
	for _, b := range brokerHeaders {
		if name == b {
			return true
		}
	}
	return strings.HasPrefix(name, "x-first-death-") || strings.HasPrefix(name, "x-last-death-")
}

// Limits on what a reader accepts. Values outside them are not retry state
// anyone meant to write; they are reported and treated as absent.
const (
	// MaxRetryCount is far above any sane retry budget, low enough that a
	// garbage number is noticed instead of parking the message at once.
	MaxRetryCount = 1_000_000
	// MaxLastDelay is far above any delay rebound chooses (REBOUND_MAX_DELAY
	// is typically minutes to hours).
	MaxLastDelay = 30 * 24 * time.Hour
	// maxQueueName is the AMQP limit on a queue name (a short string).
	maxQueueName = 255
	// maxRetryAfter is the longest delay a consumer may ask for: the
	// longest delay rebound queues. A longer one is not a Retry-After a
	// dependency meant.
	maxRetryAfter = MaxLastDelay
	// defaultMaxFutureSkew is how far in the future a task start may be:
	// room for clock skew between producers, the broker and rebound.
	defaultMaxFutureSkew = 5 * time.Minute

	// minTimeMs is 2000-01-01T00:00:00Z in Unix milliseconds. An earlier
	// task start is a unit mistake (seconds for milliseconds) or garbage.
	minTimeMs = 946_684_800_000
)

// Codec reads and writes retry state under configured names. The zero
// MaxFutureSkew rejects every task start in the future; use NewCodec.
type Codec struct {
	Names         Names
	MaxFutureSkew time.Duration // a start further in the future than this is invalid; NewCodec sets 5m
}

// NewCodec returns a Codec for the names, which must be non-empty and
// distinct (package config checks them), with defaultMaxFutureSkew.
func NewCodec(n Names) Codec {
	return Codec{Names: n, MaxFutureSkew: defaultMaxFutureSkew}
}

// State is the retry state of one message plus where it goes back to.
type State struct {
	policy.State
	// Origin is the queue the message goes back to, "" when unknown: the
	// broker's record first (the newest x-death entry, which a producer
	// cannot forge when the broker dead-lettered the message), else the
	// origin header, else x-first-death-queue.
	Origin string
	// ClaimedOrigin is the origin header's value when it names another
	// queue than the broker's record, which wins; "" otherwise.
	ClaimedOrigin string
	// FirstDeathReason and FirstDeathQueue: rebound's own first-death
	// headers, else the broker's x-first-death-*, else the oldest x-death
	// entry; "" when unknown.
	FirstDeathReason, FirstDeathQueue string
	// Policy is the policy header: "<name>:<fingerprint>" of the policy
	// that made the last decision, "" when absent. Decode reads it as the
	// message carries it; a writer writes what the caller put here (the
	// policy that decided this time).
	Policy string
	// DueAt is when a delayed copy's delay ends; zero when the message
	// carries none (it is not a delayed copy, or an older rebound made it).
	DueAt time.Time

	// Error is the error header as the message carries it ("" for none),
	// OptError the error annotation (x-opt-retry-error), which only the
	// failure just reported can carry: rebound never writes it on a copy.
	Error, OptError string
	// ErrorRetry is the retry count at which Error was reported
	// (x-retry-error-retry), or replayedError for an error reported before
	// the message was replayed; ErrorStamped says the header was there and
	// readable.
	ErrorRetry   int
	ErrorStamped bool
	// RetryAfterInvalid says a Retry-After header was there but could not
	// be read (a Problem says why); State.RetryAfter is then 0.
	RetryAfterInvalid bool
	// LastDeathQueue is the queue of the newest x-death entry, "" for none:
	// whether the broker dead-lettered the message from an application
	// queue just now, or a consumer republished it.
	LastDeathQueue string
	// Group is the failure's group: Decode reads the group header when it
	// holds a group id ("" otherwise); a writer writes what the caller put
	// here.
	Group string
	// ErrorCurrent, set by the caller before a writer runs, says Error was
	// reported with the failure being decided: the writer stamps it with
	// the retry count (ErrorRetry) and writes it when it came from the
	// annotation. Left false, the error header and its stamp travel as
	// they are.
	ErrorCurrent bool
}

// replayedError is the value of the error's stamp (State.ErrorRetry)
// that says it was reported before `rebound parked replay` started the
// task over.
const replayedError = -1

// Problem is one header that could not be read and was treated as absent.
type Problem struct {
	Header string // header name as found
	Reason string // what was wrong, short, no values that could be huge (truncate)
}

func (p Problem) String() string {
	return p.Header + ": " + p.Reason
}
