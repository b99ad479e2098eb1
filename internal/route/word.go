package route

import (
	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/group"
	"github.com/rebound-mq/rebound/policy"
)

// reported returns the application's error reported with the failure
// being decided, and whether there is one. An AMQP 1.0 consumer's
// annotation (State.OptError) always is: rebound never writes one on a
// copy. The error header is, unless it came back from an earlier attempt:
// stamped with an earlier retry count (or before a replay) on a message
// the broker has just dead-lettered from its application queue. A consumer
// that republishes with a new error copies the old stamp along, but its
// message carries no fresh x-death from an application queue (none, or a
// delay queue's), so its error counts. The header wins over the annotation
// when both are current.
func (r Router) reported(s headers.State) (string, bool) {
	switch {
	case s.Error != "" && r.current(s):
		return s.Error, true
	case s.OptError != "":
		return s.OptError, true
	}
	return "", false
}

// current reports whether s's error header was reported with this failure.
func (r Router) current(s headers.State) bool {
	republished := s.LastDeathQueue == "" || r.Topology.Owns(s.LastDeathQueue)
	return republished || !s.ErrorStamped || s.ErrorRetry == s.Retries
}

// group returns the group of the failure s describes, decided as d: the
// origin and the error reported with it, else the origin and the reason
// it is parked for (group.Retry for a retry).
func (r Router) group(s headers.State, origin string, d policy.Decision) string {
	text, _ := r.reported(s)
	reason := group.Retry
	if !d.Retry {
		reason = string(d.Reason)
	}
	return group.Of(origin, text, reason)
}

// What became of a consumer's Retry-After, the outcome label of
// rebound_retry_after_total.
const (
	retryAfterApplied = "applied"         // the delay is at least what was asked
	retryAfterCapped  = "capped"          // shorter: the policy's max delay or budget
	retryAfterInvalid = "ignored-invalid" // unreadable, ignored
)

// RetryAfterOutcomes lists the outcomes, for the metric's series.
var RetryAfterOutcomes = []string{retryAfterApplied, retryAfterCapped, retryAfterInvalid}

// RetryAfter says what became of the Retry-After of a message whose state
// is s and decision d: "" when it asked for none, or is parked.
func RetryAfter(s headers.State, d policy.Decision) string {
	switch {
	case s.RetryAfterInvalid:
		return retryAfterInvalid
	case s.RetryAfter <= 0 || !d.Retry:
		return ""
	case d.Drawn >= s.RetryAfter:
		return retryAfterApplied
	}
	return retryAfterCapped
}
