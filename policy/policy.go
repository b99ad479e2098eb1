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
// MinDelay and MaxDelay over the delayed retries (MaxRetries minus
// ImmediateRetries); see Policy.Nominal for the formulas.
const (
	Constant    Backoff = "constant"
	linear      Backoff = "linear"
	arithmetic  Backoff = "arithmetic"
	geometric   Backoff = "geometric"
	Exponential Backoff = "exponential"
)

// Backoffs lists every shape, in the order documentation shows them.
var Backoffs = []Backoff{Constant, linear, arithmetic, geometric, Exponential}

// Fitted reports whether the shape is fitted from MinDelay to MaxDelay over
// the delayed retries, and so needs MaxRetries - ImmediateRetries >= 2.
func (b Backoff) Fitted() bool {
	return b == linear || b == arithmetic || b == geometric
}

// Jitter names how randomness is applied to the nominal delay.
type Jitter string

// Jitter modes, as DESIGN.md defines them. With d the nominal delay, m
// MinDelay, M MaxDelay, U uniform on [0, 1) and Z standard normal:
//
//	none          d
//	full          U·d
//	equal         d/2 + U·d/2
//	bounded       m/2 + U·(d − m/2)
//	decorrelated  m + U·(min(M, 3·last) − m), last = State.LastDelay or m when 0;
//	              the backoff curve is not used
//	proportional  d·(1 + f·(2U − 1)), f = JitterFactor
//	gaussian      d·(1 + f·Z)
//	additive      d + U·JitterMax
//
// Every result is then clamped to [0, M].
const (
	NoJitter           Jitter = "none"
	fullJitter         Jitter = "full"
	EqualJitter        Jitter = "equal"
	boundedJitter      Jitter = "bounded"
	decorrelatedJitter Jitter = "decorrelated"
	ProportionalJitter Jitter = "proportional"
	GaussianJitter     Jitter = "gaussian"
	additiveJitter     Jitter = "additive"
)

// Jitters lists every jitter mode.
var Jitters = []Jitter{NoJitter, fullJitter, EqualJitter, boundedJitter, decorrelatedJitter, ProportionalJitter, GaussianJitter, additiveJitter}

// Deadline names what happens when the next delay would end past the
// duration budget.
type Deadline string

// Deadline modes.
const (
	clamp   Deadline = "clamp"   // shorten the delay to end at the deadline
	Strict  Deadline = "strict"  // park now
	Lenient Deadline = "lenient" // schedule it anyway
)

// Deadlines lists every deadline mode.
var Deadlines = []Deadline{clamp, Strict, Lenient}

// Reason says why a message was parked. The values are written into the
// x-retry-parked-reason header and are public interface.
type Reason string

// Park reasons.
const (
	MaxRetries    Reason = "max-retries"
	maxDuration   Reason = "max-duration"
	NonRetryable  Reason = "non-retryable"
	UnknownOrigin Reason = "unknown-origin" // no origin, one of rebound's own queues, or one that does not exist
	// OriginNotAllowed: the origin does not match REBOUND_ORIGIN_QUEUES.
	OriginNotAllowed Reason = "origin-not-allowed"
	// DeliveryLimit is the reason `rebound parked` shows for a message
	// the broker moved from rebound's quorum inbox to the parking queue
	// after its delivery limit; rebound itself never parks with it.
	DeliveryLimit Reason = "delivery-limit"
	// Cancelled is the reason `rebound delayed cancel` parks a waiting
	// copy for; the sidecar never parks with it.
	Cancelled Reason = "cancelled"
	// OriginRefused: the broker kept refusing to put the copy into its
	// origin queue (a full queue with overflow reject-publish) until the
	// policy's budget was spent; see Policy.Refused.
	OriginRefused Reason = "origin-refused"
)

// Reasons lists every reason rebound parks a message for.
var Reasons = []Reason{MaxRetries, maxDuration, NonRetryable, UnknownOrigin, OriginNotAllowed, OriginRefused}

// Policy is a validated retry policy. The zero value is not useful; build
// one from configuration (package config validates every field). Decide
// does not panic on an unvalidated Policy, but its guarantees hold only for
// valid ones; unknown names behave like Constant, NoJitter and clamp.
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
	// RetryRate is the most copies a second sent back to one origin queue,
	// all replicas together; 0 = no cap. Decide does not read it: the
	// sidecar's retry calendar applies it to what Decide returns.
	RetryRate float64
	// DelayDigits is how many significant digits of its milliseconds a
	// delay keeps for its delay queue (round): 1, 2 or 3; 0 means the
	// default, 2.
	DelayDigits int
}

// digits is the number of significant digits the policy rounds delays to.
func (p Policy) digits() int {
	if p.DelayDigits == 1 || p.DelayDigits == 3 {
		return p.DelayDigits
	}
	return defaultDelayDigits
}

// RoundUp is the shortest delay a delay queue of p's precision (its
// DelayDigits) holds that is not shorter than d: where a copy that must
// not come due before d can wait.
func (p Policy) RoundUp(d time.Duration) time.Duration { return roundUp(d, p.digits()) }

// RoundDown is the longest delay a delay queue of p's precision holds that
// is not longer than d (0 for d below a millisecond): where a copy that
// must come due by d can wait.
func (p Policy) RoundDown(d time.Duration) time.Duration { return roundDown(d, p.digits()) }

// State is the retry state of one message, as decoded from its headers.
type State struct {
	Retries      int           // retries already scheduled (0-based n); negative counts as 0
	StartedAt    time.Time     // when the task was first attempted; must be set (the zero time spends any budget)
	LastDelay    time.Duration // last delay chosen; 0 when absent
	NonRetryable bool          // the consumer marked the failure permanent
	// RetryAfter is the least delay the consumer asks for (a dependency's
	// Retry-After); 0 for none. Decide takes it as a floor on its delay,
	// never past MaxDelay or the budget.
	RetryAfter time.Duration
}

// Decision is the outcome of Decide: retry after Delay, or park for Reason.
type Decision struct {
	Retry  bool
	Delay  time.Duration // when Retry; 0 for an immediate retry
	Reason Reason        // when !Retry
	// Drawn is the delay the policy chose, jitter and deadline applied,
	// before Delay rounded it for the delay queue, in whole milliseconds:
	// what the next decision takes as State.LastDelay. Carrying the
	// rounded delay instead would compound rounding in decorrelated
	// jitter, whose range grows from the last delay.
	Drawn time.Duration
}

// Rand is the random source Decide draws from. *math/rand/v2.Rand
// satisfies it; tests pass a seeded one so results are exact. Decide draws
// at most once per call, and not at all for NoJitter or an immediate retry,
// so a nil Rand is allowed there.
type Rand interface {
	Float64() float64     // uniform on [0, 1)
	NormFloat64() float64 // standard normal
}

// Decide says whether the message whose retry state is s, failing at now,
// is retried and after which delay, or parked and why. It reads no clock
// and keeps no state: the same inputs and random draws give the same
// Decision.
//
// The checks run in this order, the first that applies wins:
//
//  1. s.NonRetryable: park with NonRetryable.
//  2. MaxRetries > 0 and n >= MaxRetries: park with MaxRetries.
//  3. MaxDuration > 0 and now − StartedAt >= MaxDuration: park with MaxDuration.
//  4. n < ImmediateRetries: retry with Delay 0.
//  5. Otherwise the delay is the nominal delay of retry n (Nominal) with
//     jitter applied and clamped to [0, MaxDelay]. When it would end past
//     StartedAt + MaxDuration, Deadline decides: clamp shortens it to end at
//     the deadline, Strict parks with "max-duration", Lenient keeps it.
//     A RetryAfter raises the delay (an immediate retry's too) to at least
//     itself, but no further than MaxDelay and the time the budget has
//     left, so it never parks a message by itself.
//
// The returned Delay is what the delay queue holds: rounded to DelayDigits
// significant digits in milliseconds (round), except that it is
// rounded down instead when rounding up would pass MaxDelay or, under clamp
// and Strict, the deadline. So 0 <= Delay <= MaxDelay, and under clamp and
// Strict a retry never lands past StartedAt + MaxDuration. A delay a
// RetryAfter raised is rounded up instead, where that stays within those
// bounds: the least delay asked for is not undercut by rounding. Under clamp, a
// budget that has less than a millisecond left (the delay queues' unit)
// parks with "max-duration" instead of retrying with no delay.
//
// A StartedAt in the future (clock skew between producers and rebound)
// counts as now.
func (p Policy) Decide(s State, now time.Time, r Rand) Decision {
	n := max(s.Retries, 0)
	if s.NonRetryable {
		return Decision{Reason: NonRetryable}
	}
	if p.MaxRetries > 0 && n >= p.MaxRetries {
		return Decision{Reason: MaxRetries}
	}
	elapsed := max(now.Sub(s.StartedAt), 0)
	if p.MaxDuration > 0 && elapsed >= p.MaxDuration {
		return Decision{Reason: maxDuration}
	}
	var d time.Duration
	switch {
	case n < p.ImmediateRetries:
		if s.RetryAfter <= 0 {
			return Decision{Retry: true}
		}
	case p.Jitter == NoJitter:
		d = p.Nominal(n)
	default:
		d = p.jitter(p.curve(n), s.LastDelay, r)
	}
	var floor time.Duration
	if s.RetryAfter > 0 {
		floor = min(s.RetryAfter, p.MaxDelay)
		if p.MaxDuration > 0 {
			floor = min(floor, p.MaxDuration-elapsed)
		}
		d = max(d, floor)
	}
	d, ceiling, ok := p.deadline(d, elapsed)
	if !ok {
		return Decision{Reason: maxDuration}
	}
	delay := roundWithin(d, ceiling, p.digits())
	if up := roundUp(d, p.digits()); delay < floor && up <= ceiling {
		delay = up // the least delay asked for is a floor: rounded up
	}
	return Decision{Retry: true, Delay: delay, Drawn: d.Truncate(time.Millisecond)}
}

// fit applies the deadline to a jittered delay d chosen when elapsed has
// passed since the task started (0 <= elapsed < MaxDuration when there is
// a budget), then rounds it for the delay queue. ok is false when the
// message must be parked with "max-duration" instead.
func (p Policy) fit(d, elapsed time.Duration) (delay time.Duration, ok bool) {
	d, ceiling, ok := p.deadline(d, elapsed)
	if !ok {
		return 0, false
	}
	return roundWithin(d, ceiling, p.digits()), true
}

// deadline applies the deadline to a jittered delay d chosen when elapsed
// has passed since the task started: it returns the delay, shortened under
// clamp, and the ceiling its rounding may not pass. ok is false when the
// message must be parked with "max-duration" instead.
func (p Policy) deadline(d, elapsed time.Duration) (delay, ceiling time.Duration, ok bool) {
	ceiling = p.MaxDelay
	if p.MaxDuration > 0 && p.Deadline != Lenient {
		remaining := p.MaxDuration - elapsed
		if d > remaining {
			if p.Deadline == Strict {
				return 0, 0, false
			}
			if remaining < time.Millisecond {
				// Nothing shorter than the budget left can be queued:
				// retrying now with no delay would only spin.
				return 0, 0, false
			}
			d = remaining
		}
		ceiling = min(ceiling, remaining)
	}
	return d, ceiling, true
}

// roundWithin rounds d for the delay queue (round), down instead where
// rounding up would pass ceiling.
func roundWithin(d, ceiling time.Duration, digits int) time.Duration {
	rounded := round(d, digits)
	if rounded > ceiling {
		rounded = roundDown(d, digits)
	}
	return rounded
}

// Remaining is how long a message whose retry state is s may still wait,
// as of now, before the budget (MaxDuration) ends: the most a delay may
// become under clamp and Strict. It is 0 when nothing bounds the delay:
// no MaxDuration, or Lenient, which schedules past it.
func (p Policy) Remaining(s State, now time.Time) time.Duration {
	if p.MaxDuration <= 0 || p.Deadline == Lenient {
		return 0
	}
	return max(p.MaxDuration-max(now.Sub(s.StartedAt), 0), time.Nanosecond)
}

// Refused decides for a copy whose origin queue refuses it for now (the
// broker nacked the last copy sent there), whose retry state is s, when
// the origin is to be tried again after wait: wait, or park with
// OriginRefused once the policy's budget is spent. Waiting on a refusing
// origin spends the duration budget, not the retry count:
//
//   - With MaxDuration, the message parks once now − StartedAt >=
//     MaxDuration; a wait that would end past it is shortened to end there
//     under clamp, parks under Strict, and is kept under Lenient (which
//     then parks on the next refusal).
//   - Without MaxDuration, each wait counts as a retry (the caller writes
//     the count up), and the message parks once n >= MaxRetries.
//
// The returned Delay is wait (or what is left of the budget) rounded up
// to the policy's precision, never below a millisecond; Drawn is 0.
func (p Policy) Refused(s State, now time.Time, wait time.Duration) Decision {
	wait = max(wait, time.Millisecond)
	if p.MaxDuration <= 0 {
		if p.MaxRetries > 0 && max(s.Retries, 0) >= p.MaxRetries {
			return Decision{Reason: OriginRefused}
		}
		return Decision{Retry: true, Delay: roundUp(wait, p.digits())}
	}
	remaining := p.MaxDuration - max(now.Sub(s.StartedAt), 0)
	if remaining <= 0 {
		return Decision{Reason: OriginRefused}
	}
	if wait > remaining && p.Deadline != Lenient {
		if p.Deadline == Strict || remaining < time.Millisecond {
			return Decision{Reason: OriginRefused}
		}
		return Decision{Retry: true, Delay: roundDown(remaining, p.digits())}
	}
	return Decision{Retry: true, Delay: roundUp(wait, p.digits())}
}
