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
}

type refusal struct {
	refusedAt time.Time     // when the last refusal was recorded
	wait      time.Duration // how long the last refusal holds the origin off
	until     time.Time     // no copy is sent to the origin before
}

func newRefusals() *refusals {
	return &refusals{origins: map[string]*refusal{}}
}

// admit says how long a copy for origin, about to be sent to it at now,
// must wait instead: 0 when the origin refuses nothing or its wait is
// over. In the second case the copy tries the origin, and until its
// outcome is known (at most one more wait) every other copy waits.
func (r *refusals) admit(origin string, now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.origins[origin]
	if !ok {
		return 0
	}
	if wait := o.until.Sub(now); wait > 0 {
		return wait
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
