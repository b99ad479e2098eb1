package console

import (
	"crypto/sha256"
	"sync"
	"time"
)

// throttle refuses sign-ins for a key (a user name, a client address)
// that failed max times within window, until the oldest of those failures
// is window old: the console must not become a tool to guess broker
// passwords with. An attempt under way counts as a failure until it ends
// (begin, end): otherwise attempts fired at once all pass a check made
// before any of them has failed (measured: 40 of 40 parallel guesses from
// one address reached the broker against a limit of 20). It forgets a key
// once its failures are all past the window, keeps keys as fixed-size
// digests (a key can be a 1 KiB user name) and holds at most maxKeys of
// them (an attacker cycling through addresses fills it; then the keys
// with the oldest last failure go first). Safe for concurrent use.
type throttle struct {
	max     int
	window  time.Duration
	maxKeys int

	mu       sync.Mutex
	failures map[keyDigest][]time.Time // oldest first
	pending  map[keyDigest]int         // attempts begun and not ended
}

// keyDigest is a throttle key as the throttle keeps it.
type keyDigest [16]byte

func digest(key string) keyDigest {
	sum := sha256.Sum256([]byte(key))
	return keyDigest(sum[:16])
}

// outcome is how a sign-in attempt ended.
type outcome int

const (
	wrongCredentials outcome = iota // the broker refused the user or password: a failure
	signedIn                        // forgets the key's failures
	inconclusive                    // the broker could not judge (unreachable, timed out): not held against anyone
)

// pendingWait is what a key waits when the attempts under way, not the
// failures, fill its limit: one of them ends within a dial's time.
const pendingWait = time.Second

func newThrottle(max int, window time.Duration) *throttle {
	return &throttle{max: max, window: window, maxKeys: 10_000, failures: map[keyDigest][]time.Time{}, pending: map[keyDigest]int{}}
}

// begin starts a sign-in attempt of key at now: 0 when it may go on (end
// must follow), or how long key must wait before it may try.
func (t *throttle) begin(key string, now time.Time) time.Duration {
	k := digest(key)
	t.mu.Lock()
	defer t.mu.Unlock()
	fs := t.recent(k, now)
	if len(fs) >= t.max {
		return fs[len(fs)-t.max].Add(t.window).Sub(now)
	}
	if len(fs)+t.pending[k] >= t.max {
		return pendingWait
	}
	t.pending[k]++
	return 0
}

// end ends an attempt begin let go on, with its outcome, at now.
func (t *throttle) end(key string, now time.Time, o outcome) {
	k := digest(key)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pending[k] <= 0 {
		panic("throttle: end without begin") // a bookkeeping bug, which would hide a leak
	}
	if t.pending[k]--; t.pending[k] == 0 {
		delete(t.pending, k)
	}
	switch o {
	case wrongCredentials:
		fs := t.recent(k, now)
		if fs == nil && len(t.failures) >= t.maxKeys {
			t.evict(now)
		}
		t.failures[k] = append(fs, now)
	case signedIn:
		// A user who signs in is not held back by their own typos of
		// a minute ago.
		delete(t.failures, k)
	}
}

// recent returns key's failures within the window before now, dropping
// the older ones. The caller holds mu.
func (t *throttle) recent(key keyDigest, now time.Time) []time.Time {
	fs := t.failures[key]
	i := 0
	for i < len(fs) && now.Sub(fs[i]) >= t.window {
		i++
	}
	switch {
	case i == len(fs):
		delete(t.failures, key)
		return nil
	case i > 0:
		fs = append(fs[:0:0], fs[i:]...)
		t.failures[key] = fs
	}
	return fs
}

// evict drops every key whose failures are past the window and, if that
// frees nothing, the key whose last failure is oldest. The caller holds
// mu.
func (t *throttle) evict(now time.Time) {
	var oldest keyDigest
	at := now
	for k, fs := range t.failures {
		last := fs[len(fs)-1]
		if now.Sub(last) >= t.window {
			delete(t.failures, k)
			continue
		}
		if !last.After(at) {
			oldest, at = k, last
		}
	}
	if len(t.failures) >= t.maxKeys {
		delete(t.failures, oldest)
	}
}

// throttlePlace is one place a sign-in attempt takes: a throttle and its
// key, and whether a success forgets that key's failures.
type throttlePlace struct {
	t               *throttle
	key             string
	forgetOnSuccess bool
}

// attempt is a sign-in's places in every throttle it passes.
type attempt []throttlePlace

// begin begins the attempt in every throttle, or in none: 0, or the wait
// of the first throttle that refused it.
func (a attempt) begin(now time.Time) time.Duration {
	for i, p := range a {
		if wait := p.t.begin(p.key, now); wait > 0 {
			for _, q := range a[:i] {
				q.t.end(q.key, now, inconclusive)
			}
			return wait
		}
	}
	return 0
}

// end ends the attempt in every throttle.
func (a attempt) end(now time.Time, o outcome) {
	for _, p := range a {
		if o == signedIn && !p.forgetOnSuccess {
			p.t.end(p.key, now, inconclusive)
			continue
		}
		p.t.end(p.key, now, o)
	}
}
