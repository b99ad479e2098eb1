// Package policy decides whether and when a failed message is tried again.
//
// A Policy is a pure function of its inputs: the retry state carried in the
// message headers, the current time and a random source. It reads no clock,
// keeps no state and does no I/O, which is what lets any number of rebound
// replicas share one inbox. A Policy value is safe for concurrent use; the
// random source passed to Decide is not shared by the policy and must be
// owned by the caller (one per goroutine, or locked).
package policy

import "time"

// Backoff names the curve that maps the retry number to a nominal delay.
type Backoff string

// Backoff shapes. Linear, Arithmetic and Geometric are fitted between
// MinDelay and MaxDelay over MaxRetries retries.
const (
	Constant    Backoff = "constant"
	Linear      Backoff = "linear"
	Arithmetic  Backoff = "arithmetic"
	Geometric   Backoff = "geometric"
	Exponential Backoff = "exponential"
)

// Backoffs lists every shape, in the order documentation shows them.
var Backoffs = []Backoff{Constant, Linear, Arithmetic, Geometric, Exponential}

// Fitted reports whether the shape is fitted from MinDelay to MaxDelay over
// MaxRetries retries, and so needs MaxRetries >= 2.
func (b Backoff) Fitted() bool {
	return b == Linear || b == Arithmetic || b == Geometric
}

// Jitter names how randomness is applied to the nominal delay.
type Jitter string

// Jitter modes, as DESIGN.md defines them.
const (
	NoJitter           Jitter = "none"
	FullJitter         Jitter = "full"
	EqualJitter        Jitter = "equal"
	BoundedJitter      Jitter = "bounded"
	DecorrelatedJitter Jitter = "decorrelated"
	ProportionalJitter Jitter = "proportional"
	GaussianJitter     Jitter = "gaussian"
	AdditiveJitter     Jitter = "additive"
)

// Jitters lists every jitter mode.
var Jitters = []Jitter{NoJitter, FullJitter, EqualJitter, BoundedJitter, DecorrelatedJitter, ProportionalJitter, GaussianJitter, AdditiveJitter}

// Deadline names what happens when the next delay would end past the
// duration budget.
type Deadline string

// Deadline modes.
const (
	Clamp   Deadline = "clamp"   // shorten the delay to end at the deadline
	Strict  Deadline = "strict"  // park now
	Lenient Deadline = "lenient" // schedule it anyway
)

// Deadlines lists every deadline mode.
var Deadlines = []Deadline{Clamp, Strict, Lenient}

// Reason says why a message was parked. The values are written into the
// x-retry-parked-reason header and are public interface.
type Reason string

// Park reasons.
const (
	MaxRetries    Reason = "max-retries"
	MaxDuration   Reason = "max-duration"
	NonRetryable  Reason = "non-retryable"
	UnknownOrigin Reason = "unknown-origin"
)

// Reasons lists every park reason.
var Reasons = []Reason{MaxRetries, MaxDuration, NonRetryable, UnknownOrigin}

// Policy is a validated retry policy. The zero value is not useful; build
// one from configuration (package config validates every field).
type Policy struct {
	Backoff          Backoff
	MinDelay         time.Duration
	MaxDelay         time.Duration
	Multiplier       float64 // growth factor of Exponential, > 1
	Jitter           Jitter
	JitterFactor     float64       // spread of Proportional and Gaussian
	JitterMax        time.Duration // upper bound of what Additive adds
	ImmediateRetries int           // the first k retries have no delay
	MaxRetries       int           // 0 = no limit by count
	MaxDuration      time.Duration // budget from the task start; 0 = none
	Deadline         Deadline
}

// State is the retry state of one message, as decoded from its headers.
type State struct {
	Retries      int           // retries already scheduled (0-based n)
	StartedAt    time.Time     // when the task was first attempted
	LastDelay    time.Duration // last delay chosen; 0 when absent
	NonRetryable bool          // the consumer marked the failure permanent
}

// Decision is the outcome of Decide: retry after Delay, or park for Reason.
type Decision struct {
	Retry  bool
	Delay  time.Duration // when Retry; 0 for an immediate retry
	Reason Reason        // when !Retry
}

// Rand is the random source Decide draws from. *math/rand/v2.Rand
// satisfies it; tests pass a seeded one so results are exact.
type Rand interface {
	Float64() float64     // uniform on [0, 1)
	NormFloat64() float64 // standard normal
}
