// Package headers reads rebound's retry state from AMQP message headers and
// writes it back onto the copies rebound republishes.
//
// It is the only package that knows header names and wire types. Reading is
// lenient (any integer type, floats, strings, timestamps; RabbitMQ's x-death
// as written and as it arrives malformed) and never fails: an unreadable
// header is reported as a Problem and treated as absent. Writing is strict:
// 64-bit integers and strings only, so whatever is written passes
// amqp.Table.Validate. A Codec is safe for concurrent use.
package headers

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
