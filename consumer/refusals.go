package consumer

import (
	"sync"
	"time"
)

// A copy sent straight to its origin queue (a delayed copy whose delay
// ended, an immediate retry) that the broker refuses (nack: the queue is
// full and its overflow is reject-publish) must neither spin nor be held:
// the origin is backed off, per origin queue and shared by every message
// for it, and the copies for it wait in a delay queue meanwhile
// (route.Router.Refuse), their inbox deliveries acked once that copy is
// confirmed.

// Backing off an origin that refuses copies: the first wait, and the
// longest. While an origin refuses, one copy a wait tries it; every
// other copy for it waits in a delay queue, so each of them passes
// through rebound at most once per wait.
const (
	refusedFirstWait = 250 * time.Millisecond
	refusedLongest   = 30 * time.Second
)

// maxRefusingOrigins bounds what refusals keeps: origin names come from
// messages (within REBOUND_ORIGIN_QUEUES).
const maxRefusingOrigins = 4096

// refusals is, per origin queue that refused a copy, when a copy may next
// be sent to it. It is safe for concurrent use: the session asks before
// sending, the publisher's goroutine reports outcomes. Its lock is never
// held across I/O.
type refusals struct {
	mu      sync.Mutex
	origins map[string]*refusal
	// attempts are the copies this replica sent straight to an origin, by
	// attempt id (headers.Attempt), whose outcome is pending, and those
	// the broker refused, for attemptMemory: the twin of a refused one
	// (route.Router.Twin) is dropped, rebound still holds the copy.
	attempts map[string]attempt
}

// attempt is a copy sent straight to an origin: pending, or refused at.
type attempt struct {
	refused bool
	at      time.Time
}

// attemptMemory is how long a refused attempt is remembered: its twin,
// dead-lettered by the broker as it refused the copy, reaches the inbox
// within it unless the inbox holds a backlog that long.
const attemptMemory = 5 * time.Minute

// maxAttempts bounds attempts: a twin that comes later than the bound
// allows is retried as a message of its own, a duplicate, never lost.
const maxAttempts = 1 << 16

// A twin is what the session makes of a message Twin names.
type twin int

const (
	notTwin     twin = iota // retried like any message
	twinRefused             // the twin of a refused copy: dropped
	twinPending             // the attempt's outcome is not known yet: requeued
)

type refusal struct {
	refusedAt time.Time     // when the last refusal was recorded
	wait      time.Duration // how long the last refusal holds the origin off
	until     time.Time     // no copy is sent to the origin before
}

func newRefusals() *refusals {
	return &refusals{origins: map[string]*refusal{}, attempts: map[string]attempt{}}
}

// sent records an attempt id sent at now, its outcome pending.
func (r *refusals) sent(id string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.attempts) >= maxAttempts {
		r.forgetAttempts(now)
	}
	r.attempts[id] = attempt{at: now}
}

// settled records the outcome of attempt id at now: refused, or not (then
// it is forgotten).
func (r *refusals) settled(id string, refused bool, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !refused {
		delete(r.attempts, id)
		return
	}
	r.attempts[id] = attempt{refused: true, at: now}
}

// twin says what a message carrying attempt id is, and forgets a refused
// attempt once its twin came.
func (r *refusals) twin(id string) twin {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.attempts[id]
	switch {
	case !ok:
		return notTwin
	case !a.refused:
		return twinPending
	}
	delete(r.attempts, id)
	return twinRefused
}

func (r *refusals) forgetAttempts(now time.Time) {
	for id, a := range r.attempts {
		if now.Sub(a.at) >= attemptMemory {
			delete(r.attempts, id)
		}
	}
	for id := range r.attempts {
		if len(r.attempts) < maxAttempts {
			break
		}
		delete(r.attempts, id) // a twin then comes as a duplicate, never lost
	}
}

// admit says how long a copy for origin, about to be sent to it at now,
// must wait instead: 0 when the origin refuses nothing or its wait is
// over. In the second case the copy tries the origin, and until its
// outcome is known (at most one more wait) every other copy waits. A
// copy waits the origin's whole wait, not what is left of it: a few
// delay queues serve every wait (refusedFirstWait doubled), and copies
// that came at different times stay spread.
func (r *refusals) admit(origin string, now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.origins[origin]
	if !ok {
		return 0
	}
	if o.until.After(now) {
		return o.wait
	}
	o.until = now.Add(o.wait)
	return 0
}

// refused records that origin refused a copy sent at sent, as of now. The
// wait doubles, from refusedFirstWait up to refusedLongest, for a copy
// sent after the last refusal was recorded; copies sent before it (a
// burst in flight when the origin filled up) refuse nothing new.
func (r *refusals) refused(origin string, sent, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.origins[origin]
	switch {
	case !ok:
		if len(r.origins) >= maxRefusingOrigins {
			r.forget(now)
			if len(r.origins) >= maxRefusingOrigins {
				return // the copy is requeued, as before backing off
			}
		}
		r.origins[origin] = &refusal{refusedAt: now, wait: refusedFirstWait, until: now.Add(refusedFirstWait)}
	case sent.Before(o.refusedAt):
	default:
		o.wait = min(2*o.wait, refusedLongest)
		o.refusedAt, o.until = now, now.Add(o.wait)
	}
}

// accepted records that origin took a copy: it refuses nothing now.
func (r *refusals) accepted(origin string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.origins, origin)
}

// refusing returns how many origins still hold copies off as of now, and
// forgets those whose wait ended a longest wait ago with nothing sent to
// them since: the next copy for one simply tries it.
func (r *refusals) refusing(now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forget(now)
	r.forgetAttempts(now)
	n := 0
	for _, o := range r.origins {
		if o.until.After(now) {
			n++
		}
	}
	return n
}

func (r *refusals) forget(now time.Time) {
	for name, o := range r.origins {
		if now.Sub(o.until) >= refusedLongest {
			delete(r.origins, name)
		}
	}
}
