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
	}
}

// Headers RabbitMQ writes when it dead-letters a message. rebound reads
// them only to find the origin queue and a first-failure time, never to
// count retries: RabbitMQ 4.x ignores an x-death set by a client and 3.13
// changed how it counts.
const (
	XDeath           = "x-death"
	XFirstDeathQueue = "x-first-death-queue"
)

// Limits on what a reader accepts. Values outside them are not retry state
// anyone meant to write; they are reported and treated as absent.
const (
	// MaxRetryCount is far above any sane retry budget, low enough that a
	// garbage number is noticed instead of parking the message at once.
	MaxRetryCount = 1_000_000
	// MaxLastDelay is far above any delay rebound chooses (REBOUND_MAX_DELAY
	// is typically minutes to hours).
	MaxLastDelay = 30 * 24 * time.Hour
	// MaxQueueName is the AMQP limit on a queue name (a short string).
	MaxQueueName = 255
	// DefaultMaxFutureSkew is how far in the future a task start may be:
	// room for clock skew between producers, the broker and rebound.
	DefaultMaxFutureSkew = 5 * time.Minute

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
// distinct (package config checks them), with DefaultMaxFutureSkew.
func NewCodec(n Names) Codec {
	return Codec{Names: n, MaxFutureSkew: DefaultMaxFutureSkew}
}

// State is the retry state of one message plus where it goes back to.
type State struct {
	policy.State
	Origin string // queue the message goes back to; "" when unknown
}

// Problem is one header that could not be read and was treated as absent.
type Problem struct {
	Header string // header name as found
	Reason string // what was wrong, short, no values that could be huge (truncate)
}

func (p Problem) String() string {
	return p.Header + ": " + p.Reason
}
