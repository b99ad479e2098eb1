package consumer

import (
	"testing"
	"time"
)

func TestRefusalsBackOffPerOrigin(t *testing.T) {
	r := newRefusals()
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	if w := r.admit("orders", t0); w != 0 {
		t.Fatalf("an origin that refused nothing: wait %s", w)
	}
	// A burst of five in flight is refused: one refusal, the first wait.
	for range 5 {
		r.refused("orders", t0, at(time.Millisecond))
	}
	steps := []struct {
		at   time.Duration
		want time.Duration
	}{
		{10 * time.Millisecond, refusedFirstWait},                 // every copy waits
		{refusedFirstWait + time.Millisecond, 0},                  // this one tries
		{refusedFirstWait + 2*time.Millisecond, refusedFirstWait}, // the others wait while it does
	}
	for _, s := range steps {
		if w := r.admit("orders", at(s.at)); w != s.want {
			t.Errorf("admit at %s: wait %s, want %s", s.at, w, s.want)
		}
	}
	if w := r.admit("payments", at(time.Second)); w != 0 {
		t.Errorf("another origin waits %s", w)
	}
	// The try is refused too: the wait doubles, up to the longest.
	sent := at(refusedFirstWait + time.Millisecond)
	want := refusedFirstWait
	for range 10 {
		r.refused("orders", sent, sent.Add(time.Millisecond))
		want = min(2*want, refusedLongest)
		if w := r.admit("orders", sent.Add(2*time.Millisecond)); w != want {
			t.Fatalf("after a refused try: wait %s, want %s", w, want)
		}
		sent = sent.Add(want + 2*time.Millisecond)
		if w := r.admit("orders", sent); w != 0 {
			t.Fatalf("once the wait is over: wait %s, want a try", w)
		}
	}
	if n := r.refusing(sent); n != 1 {
		t.Errorf("refusing = %d, want 1", n)
	}
	r.accepted("orders")
	if w := r.admit("orders", sent); w != 0 || r.refusing(sent) != 0 {
		t.Errorf("after the origin took a copy: wait %s, refusing %d", w, r.refusing(sent))
	}
	// An origin nothing was sent to for a longest wait is forgotten.
	r.refused("mail", t0, t0)
	if n := r.refusing(t0.Add(refusedFirstWait + refusedLongest)); n != 0 || len(r.origins) != 0 {
		t.Errorf("a stale origin is kept: refusing %d, %d kept", n, len(r.origins))
	}
}

func TestRefusalsKnowTwins(t *testing.T) {
	r := newRefusals()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	r.sent("a.1", now)
	r.sent("a.2", now)
	if got := r.twin("a.1"); got != twinPending {
		t.Errorf("an attempt without its outcome: %v, want pending", got)
	}
	r.settled("a.1", true, now)
	r.settled("a.2", false, now)
	if got := r.twin("a.1"); got != twinRefused {
		t.Errorf("the twin of a refused attempt: %v, want refused", got)
	}
	if got := r.twin("a.1"); got != notTwin {
		t.Errorf("a second message with a refused attempt's id: %v, want a message of its own", got)
	}
	if got := r.twin("a.2"); got != notTwin {
		t.Errorf("a message the origin took and dropped later: %v, want a message of its own", got)
	}
	r.sent("a.3", now)
	r.settled("a.3", true, now)
	r.refusing(now.Add(attemptMemory))
	if got := r.twin("a.3"); got != notTwin {
		t.Errorf("a twin later than attemptMemory: %v, want a message of its own (a duplicate, never lost)", got)
	}
}
