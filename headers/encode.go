package headers

import (
	"maps"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/policy"
)

// The writers below return a new table and never modify h, which is the
// delivery's own header table. The copy is shallow: nested arrays and
// tables are shared with h, and neither side may modify them. None of
// them carries the headers the broker owns (x-death, x-first-death-*,
// x-last-death-*, x-delivery-count, x-acquired-count, CC, BCC): see
// brokerHeaders for why; nor the legacy routing header. What an operator needs of them, the first death's
// reason and queue, is kept in rebound's own first-death headers.
//
// Numbers are written as int64 (an AMQP long), never as Go int, which
// amqp091-go encodes in 32 bits. Every rebound header a writer leaves in
// the table is rewritten from the decoded state, so a header that Decode
// could not read never travels on with the copy.

// Retry returns the headers for a copy sent back for another attempt: a
// new table with every header of h kept as is, plus count = s.Retries+1,
// task start = s.StartedAt, last delay = delay (ms; the policy's
// Decision.Drawn: the delay as chosen, before the delay queue's rounding,
// which decorrelated jitter grows the next one from), origin = s.Origin,
// policy = s.Policy (the policy that decided), and due = when the copy's
// delay ends, for a copy that goes through a delay queue (zero for an
// immediate retry, which carries none). s is what Decode returned for h,
// with Policy set to the deciding policy.
//
// The delay is written in whole milliseconds, clamped to [0, MaxLastDelay],
// and the count is capped at MaxRetryCount, so the next Decode accepts
// both. When s.Origin is "" the origin header is dropped if it cannot be
// read. The non-retryable header is rewritten as a boolean when h has one.
// Parked reason and parked-at are dropped: a copy on its way back to its
// queue is not parked. The first-death headers are written when s knows
// them. The consumer's word is written as putReport says.
func (c Codec) Retry(h amqp.Table, s State, delay time.Duration, due time.Time) amqp.Table {
	n := c.Names
	out := clone(h)
	strip(out)
	out[n.RetryCount] = retryCount(s.Retries + 1)
	putInt64(out, n.TaskStartedAt, s.StartedAt.UnixMilli())
	out[n.LastDelay] = clampDelay(delay).Milliseconds()
	c.putOrigin(out, s.Origin)
	c.putNonRetryable(out, s.NonRetryable)
	c.putFirstDeath(out, s)
	c.putPolicy(out, s.Policy)
	c.putReport(out, s)
	if due.IsZero() {
		delete(out, n.DueAt)
	} else {
		out[n.DueAt] = due.UnixMilli()
	}
	delete(out, n.ParkedReason)
	delete(out, n.ParkedAt)
	return out
}

// Park returns the headers for the parked copy: every header of h kept,
// count = s.Retries, task start, origin (when known), policy = s.Policy,
// parked reason and parked-at (Unix ms). s is what Decode returned for h,
// with Policy set to the deciding policy.
//
// The origin is what `rebound parked` replays to, so it is written even
// when it came from x-death. The last delay and non-retryable headers are
// rewritten from s when h has them. A parked message is due nowhere: the
// due header is dropped. The consumer's word is written as putReport says.
func (c Codec) Park(h amqp.Table, s State, reason policy.Reason, at time.Time) amqp.Table {
	n := c.Names
	out := clone(h)
	strip(out)
	out[n.RetryCount] = retryCount(s.Retries)
	putInt64(out, n.TaskStartedAt, s.StartedAt.UnixMilli())
	if _, ok := h[n.LastDelay]; ok || s.LastDelay > 0 {
		putInt64(out, n.LastDelay, clampDelay(s.LastDelay).Milliseconds())
	}
	c.putOrigin(out, s.Origin)
	c.putNonRetryable(out, s.NonRetryable)
	c.putFirstDeath(out, s)
	c.putPolicy(out, s.Policy)
	c.putReport(out, s)
	delete(out, n.DueAt)
	out[n.ParkedReason] = string(reason)
	out[n.ParkedAt] = at.UnixMilli()
	return out
}

// Replay returns the headers for a parked message sent back to origin (a
// queue name, not empty) by an operator: every application header kept,
// retry state reset (count removed, task start = now; last delay, parked
// reason, parked at, non-retryable, first death, policy and due removed),
// origin = origin.
//
// The message starts over as a new task: its retry budget is measured from
// now, its next failure is its first, and the policy of its origin decides
// it then, whatever policy parked it. x-retry-error is the application's
// and is kept, stamped replayedError: reported in the task's earlier life,
// so a failure after the replay that reports none is not filed under it.
// The group, the one attempt's word and a redirection's record are
// removed.
func (c Codec) Replay(h amqp.Table, origin string, now time.Time) amqp.Table {
	n := c.Names
	out := clone(h)
	strip(out)
	for _, name := range [...]string{n.RetryCount, n.LastDelay, n.ParkedReason, n.ParkedAt, n.NonRetryable, n.FirstDeathReason, n.FirstDeathQueue,
		n.Policy, n.DueAt, n.Group, n.RedirectedFrom, n.ErrorRetry} {
		delete(out, name)
	}
	c.dropAttempt(out)
	if Text(out[n.Error]) != "" {
		out[n.ErrorRetry] = int64(replayedError)
	}
	out[n.TaskStartedAt] = now.UnixMilli()
	putString(out, n.OriginQueue, origin)
	return out
}

// Redirect returns the headers for a parked message `rebound parked
// replay --to` sends to another queue than its origin: Replay's, to that
// queue, with the redirected-from header naming from, the origin it had
// ("" when unknown: no header).
func (c Codec) Redirect(h amqp.Table, from, to string, now time.Time) amqp.Table {
	out := c.Replay(h, to, now)
	if from != "" {
		out[c.Names.RedirectedFrom] = from
	}
	return out
}

// Moved returns the headers for a waiting copy an operator moves out of
// its delay queue (`rebound delayed flush` and `cancel`, for the copies
// they do not park): every header of h kept but the broker's, and due =
// when the copy now comes due, which is when it came due before for one
// put back into a delay queue, and zero, no header, for one sent back to
// its origin queue at once.
func (c Codec) Moved(h amqp.Table, due time.Time) amqp.Table {
	out := clone(h)
	strip(out)
	if due.IsZero() {
		delete(out, c.Names.DueAt)
	} else {
		out[c.Names.DueAt] = due.UnixMilli()
	}
	return out
}

// Parked reads what Park wrote, for tools that list parked messages. ok is
// false when h has no readable parked reason; at is zero when the parked-at
// header is absent or unreadable.
func (c Codec) Parked(h amqp.Table) (reason policy.Reason, at time.Time, ok bool) {
	r, why := queueName(h[c.Names.ParkedReason]) // same rules: a non-empty, short string
	if why != "" {
		return "", time.Time{}, false
	}
	if ms, why := integer(h[c.Names.ParkedAt]); why == "" && ms >= minTimeMs {
		at = time.UnixMilli(ms).UTC()
	}
	return policy.Reason(r), at, true
}

// putOrigin writes a known origin. An unknown one leaves a readable header
// alone (the caller built s by hand) and drops an unreadable one.
func (c Codec) putOrigin(out amqp.Table, origin string) {
	name := c.Names.OriginQueue
	if origin != "" {
		// On the first failure the origin usually is x-first-death-queue:
		// share its value instead of boxing the same string again.
		if q, ok := out[xFirstDeathQueue].(string); ok && q == origin {
			out[name] = out[xFirstDeathQueue]
			return
		}
		putString(out, name, origin)
		return
	}
	if _, why := queueName(out[name]); why != "" {
		delete(out, name)
	}
}

// putReport writes what the consumer said of the failure being decided:
// the group the caller put in s (none when ""), and, when s.ErrorCurrent,
// the error with the retry count it was reported at (s.Retries), the
// annotation's text when it came from there. An error from an earlier
// attempt travels as it is, with its stamp. The one attempt's word (the
// Retry-After and the annotations) is removed: it has been read.
func (c Codec) putReport(out amqp.Table, s State) {
	n := c.Names
	c.dropAttempt(out)
	if s.Group != "" {
		putString(out, n.Group, s.Group)
	} else {
		delete(out, n.Group)
	}
	if !s.ErrorCurrent || s.Error == "" {
		// The stamp travels with its error, rewritten, or not at all.
		if s.ErrorStamped {
			putInt64(out, n.ErrorRetry, int64(s.ErrorRetry))
		} else {
			delete(out, n.ErrorRetry)
		}
		return
	}
	if Text(out[n.Error]) != s.Error {
		out[n.Error] = s.Error
	}
	putInt64(out, n.ErrorRetry, int64(retryCount(s.Retries)))
}

// dropAttempt removes the headers of one attempt's word.
func (c Codec) dropAttempt(out amqp.Table) {
	for _, name := range c.Names.attempt() {
		delete(out, name)
	}
}

// putFirstDeath writes the first death's reason and queue, when known.
// They no longer change once written, so they are left alone when
// already there (see putString).
func (c Codec) putFirstDeath(out amqp.Table, s State) {
	if s.FirstDeathReason != "" {
		putString(out, c.Names.FirstDeathReason, s.FirstDeathReason)
	}
	if s.FirstDeathQueue != "" {
		putString(out, c.Names.FirstDeathQueue, s.FirstDeathQueue)
	}
}

// putPolicy writes the deciding policy's label, when the caller set one.
func (c Codec) putPolicy(out amqp.Table, label string) {
	if label != "" {
		putString(out, c.Names.Policy, label)
	}
}

// strip deletes the headers the broker owns, the one rebound no longer
// routes on, and HeldTables. Writers call it before they add their own: the room the
// broker's headers leave in the clone then takes rebound's, so the map
// does not grow (growing it made a copy cost 2.6 times the memory).
func strip(out amqp.Table) {
	for _, name := range brokerHeaders {
		delete(out, name)
	}
	delete(out, legacyDelayHeader)
	delete(out, HeldTables) // one copy's, rewritten by the next when it needs one
}

// putNonRetryable rewrites the flag as an AMQP boolean when the message
// had one, and adds it only when it is set, so copies stay as small as the
// message was.
func (c Codec) putNonRetryable(out amqp.Table, v bool) {
	name := c.Names.NonRetryable
	if _, ok := out[name]; ok || v {
		out[name] = v
	}
}

// clone copies h. maps.Clone copies the hash table as it is, which costs
// much less than inserting every header into a new map; the few headers
// added afterwards fit in the room a map keeps, or grow it once.
func clone(h amqp.Table) amqp.Table {
	if h == nil {
		return make(amqp.Table, 5)
	}
	return maps.Clone(h)
}

// putInt64 and putString leave a header alone when it already holds the
// value: putting a number or string into an interface allocates, and after
// the first retry the task start and origin no longer change.
func putInt64(out amqp.Table, name string, v int64) {
	if old, ok := out[name].(int64); !ok || old != v {
		out[name] = v
	}
}

func putString(out amqp.Table, name, v string) {
	if old, ok := out[name].(string); !ok || old != v {
		out[name] = v
	}
}

func retryCount(n int) int64 {
	return int64(min(max(n, 0), MaxRetryCount))
}

func clampDelay(d time.Duration) time.Duration {
	return min(max(d, 0), MaxLastDelay)
}

// Attempt is the header a copy sent straight to its origin queue carries:
// an id of that one attempt, unique across replicas. A full origin queue
// with overflow reject-publish-dlx both refuses the copy (rebound keeps
// it and tries again later) and dead-letters a twin of it back to rebound,
// reason maxlen; the id lets the replica that made the attempt know the
// twin (route.Router.Twin). It is not configurable: nothing but rebound
// reads it.
const Attempt = "x-retry-attempt"

// MarkAttempt writes attempt id into h, the headers of a copy about to be
// sent straight to its origin queue.
func MarkAttempt(h amqp.Table, id string) {
	h[Attempt] = id
}

// HeldTables is the header every copy bound for the hold queue carries:
// a table of its headers whose values are tables or arrays and whose
// names do not start with "x-", as they are (empty when it has none). RabbitMQ 4.3
// leaves such headers out of the AMQP 1.0 view of a message (AMQP 1.0
// application properties hold no maps or lists; x- headers become message
// annotations, which do), and a holder that parks a copy rebuilds it from
// that view: it puts them back from this header. A copy that goes home
// from the hold queue keeps its headers anyway (the broker dead-letters
// it as it is), and this one with them, until rebound's next copy of it
// drops it. Not configurable: nothing but rebound reads it.
const HeldTables = "x-retry-held-tables"

// HoldTables writes HeldTables into h, the headers of a copy about to be
// published to the hold queue: empty when h has no header that needs it,
// so that a holder knows a copy whose AMQP 1.0 view is whole from one an
// earlier rebound wrote.
func HoldTables(h amqp.Table) {
	held := amqp.Table{}
	for k, v := range h {
		switch v.(type) {
		case amqp.Table, []any:
			if !strings.HasPrefix(k, "x-") {
				held[k] = v
			}
		}
	}
	h[HeldTables] = held
}
