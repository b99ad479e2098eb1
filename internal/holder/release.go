package holder

import (
	"sync"
	"time"
)

// A due copy goes home by one of two ways:
//
//   - dead-lettered: the holder rejects it and the broker dead-letters it,
//     as it is, into its origin queue. Nothing is re-encoded and rebound
//     needs no write access to the origin; but an origin that refuses it
//     (full, reject-publish) leaves it in the hold queue's at-least-once
//     dead-letter state, retried by the broker every few minutes, seen by
//     no one and never parked;
//   - published: the holder publishes it into its origin itself (rebuilt
//     as a parked copy is, confirmed and mandatory) and accepts it once
//     the origin took it. A refusal is then seen: the copy is held again,
//     with backoff per origin, and parked origin-refused once its policy's
//     budget is spent, as in queues mode.
//
// A copy is published when the holder has not seen its origin take a
// copy within the last homeTrust, and dead-lettered when it has: one
// publish per origin per homeTrust, the rest as before. One at a time:
// the copies for an origin judged while one of its copies is being
// published wait for that publish's outcome, then go its way. Without
// that, every settler judging a due copy for the origin in that round
// trip would publish too, and a burst for one origin would be published
// one confirm at a time while the holder's settlers waited in line. An
// origin that fills up within homeTrust of taking a publish can still
// refuse copies dead-lettered meanwhile; those wait in the broker's care,
// not lost.
//
// A holder whose user may not write to the default exchange dead-letters
// every copy (least privilege; refusals unseen, as before).

// homeTrust is how long after an origin took a published copy the
// holder dead-letters copies for it.
const homeTrust = time.Second

// Backing off an origin that refuses: the first wait and the longest, as
// the sidecar does for copies it sends straight to an origin
// (consumer/refusals.go).
const (
	refusedFirstWait = 250 * time.Millisecond
	refusedLongest   = 30 * time.Second
)

// maxHomes bounds what homes keeps: origin names come from copies.
const maxHomes = 4096

// way is how a due copy goes home.
type way int

const (
	wayPublish    way = iota // published by the holder, refusal seen
	wayDeadLetter            // rejected, dead-lettered by the broker
	wayWait                  // its origin refuses: held until it may try again
	wayAwait                 // a copy for its origin is being published: ask again once it is
)

// homes is what a holder knows of origins, for choosing a copy's way.
// Safe for concurrent use; its lock is never held across I/O.
type homes struct {
	mu      sync.Mutex
	origins map[string]*homeState
	noWrite bool // the broker refused a publish: every copy is dead-lettered
}

type homeState struct {
	accepted   time.Time     // when the origin last took a published copy
	wait       time.Duration // the last refusal's wait; 0 when not refusing
	until      time.Time     // no copy tries the origin before
	publishing chan struct{} // closed when the copy being published is answered; nil when none is
}

func newHomes() *homes { return &homes{origins: map[string]*homeState{}} }

// way returns how a copy for origin, due as of now, goes home; for
// wayWait until when it waits, and for wayAwait a channel closed once the
// copy being published for origin is answered. A caller given wayPublish
// records the answer (accepted, refused), or calls published when there
// is none.
func (hs *homes) way(origin string, now time.Time) (w way, until time.Time, answered <-chan struct{}) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.noWrite {
		return wayDeadLetter, time.Time{}, nil
	}
	st := hs.origins[origin]
	switch {
	case st != nil && st.publishing != nil:
		return wayAwait, time.Time{}, st.publishing
	case st != nil && now.Before(st.until):
		return wayWait, st.until, nil
	case st != nil && st.wait == 0 && now.Sub(st.accepted) < homeTrust:
		return wayDeadLetter, time.Time{}, nil
	}
	hs.state(origin, now).publishing = make(chan struct{})
	return wayPublish, time.Time{}, nil
}

// published says the publish of a copy for origin that way chose is over;
// accepted and refused say so too. The copies awaiting it ask their way
// again.
func (hs *homes) published(origin string) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if st := hs.origins[origin]; st != nil {
		st.answered()
	}
}

func (st *homeState) answered() {
	if st.publishing != nil {
		close(st.publishing)
		st.publishing = nil
	}
}

// accepted records that origin took a published copy at now.
func (hs *homes) accepted(origin string, now time.Time) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	st := hs.state(origin, now)
	st.accepted, st.wait, st.until = now, 0, time.Time{}
	st.answered()
}

// refused records that origin refused a published copy at now, and
// returns how long copies for it wait: the first wait, doubled by each
// refusal of a try made after the last wait ended, up to the longest.
func (hs *homes) refused(origin string, now time.Time) time.Duration {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	st := hs.state(origin, now)
	switch {
	case st.wait == 0:
		st.wait = refusedFirstWait
	case !now.Before(st.until):
		st.wait = min(2*st.wait, refusedLongest)
	}
	st.until = now.Add(st.wait)
	st.answered()
	return st.wait
}

// forbidden records that the broker refused the holder a publish, and
// reports whether that is news (copies judged meanwhile try once more).
func (hs *homes) forbidden() (first bool) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	first = !hs.noWrite
	hs.noWrite = true
	return first
}

// state returns origin's state, made when absent; when the map is full,
// states neither refusing nor trusted nor being published as of now are
// forgotten first.
func (hs *homes) state(origin string, now time.Time) *homeState {
	st := hs.origins[origin]
	if st != nil {
		return st
	}
	if len(hs.origins) >= maxHomes {
		for o, s := range hs.origins {
			if !now.Before(s.until) && now.Sub(s.accepted) >= homeTrust && s.publishing == nil {
				delete(hs.origins, o)
			}
		}
	}
	st = &homeState{}
	hs.origins[origin] = st
	return st
}
