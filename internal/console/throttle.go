package console

import (
	"sync"
	"time"
)

// throttle refuses sign-ins for a key (a user name, a client address)
// that failed max times within window, until the oldest of those failures
// is window old: the console must not become a tool to guess broker
// passwords with. It forgets a key once its failures are all past the
// window, and holds at most maxKeys keys (an attacker cycling through
// addresses fills it; then the keys with the oldest last failure go
// first). Safe for concurrent use.
type throttle struct {
	max     int
	window  time.Duration
	maxKeys int

	mu       sync.Mutex
	failures map[string][]time.Time // oldest first
}

func newThrottle(max int, window time.Duration) *throttle {
	return &throttle{max: max, window: window, maxKeys: 100_000, failures: map[string][]time.Time{}}
}

// wait returns how long key must wait before its next sign-in, 0 when it
// may try now.
func (t *throttle) wait(key string, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	fs := t.recent(key, now)
	if len(fs) < t.max {
		return 0
	}
	return fs[len(fs)-t.max].Add(t.window).Sub(now)
}

// failed records a failed sign-in of key at now.
func (t *throttle) failed(key string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fs := t.recent(key, now)
	if fs == nil && len(t.failures) >= t.maxKeys {
		t.evict(now)
	}
	t.failures[key] = append(fs, now)
}

// succeeded forgets key's failures: a user who signs in is not held back
// by their own typos of a minute ago.
func (t *throttle) succeeded(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.failures, key)
}

// recent returns key's failures within the window before now, dropping
// the older ones. The caller holds mu.
func (t *throttle) recent(key string, now time.Time) []time.Time {
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
	oldest, at := "", now
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
