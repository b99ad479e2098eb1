package holder

import (
	"fmt"
	"testing"
	"time"
)

// TestHomesWay: an origin unknown, or not seen taking a copy within
// homeTrust, gets its copies published; one that took one within it, dead-
// lettered; one that refused, none until its wait ends, which doubles at
// each refused try after a wait, up to the longest, and ends at the next
// acceptance. Without write access every copy is dead-lettered.
func TestHomesWay(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	hs := newHomes()
	step := func(what string, at time.Duration, want way) {
		t.Helper()
		got, _, _ := hs.way("q", t0.Add(at))
		if got != want {
			t.Errorf("%s (at %s): way %d, want %d", what, at, got, want)
		}
		if got == wayPublish {
			hs.published("q") // answered below, if at all
		}
	}
	step("unknown", 0, wayPublish)
	hs.accepted("q", t0)
	step("just took one", 500*time.Millisecond, wayDeadLetter)
	step("took one a while ago", homeTrust, wayPublish)
	if w := hs.refused("q", t0.Add(2*time.Second)); w != refusedFirstWait {
		t.Errorf("first wait %s, want %s", w, refusedFirstWait)
	}
	step("refusing", 2*time.Second+refusedFirstWait/2, wayWait)
	// A refusal of a try made during the wait does not double it.
	if w := hs.refused("q", t0.Add(2*time.Second+refusedFirstWait/2)); w != refusedFirstWait {
		t.Errorf("wait after a refusal within the wait %s, want %s", w, refusedFirstWait)
	}
	at := 3 * time.Second
	want := refusedFirstWait
	for range 10 {
		step("wait over", at, wayPublish)
		want = min(2*want, refusedLongest)
		if w := hs.refused("q", t0.Add(at)); w != want {
			t.Fatalf("wait at %s: %s, want %s", at, w, want)
		}
		at += want
	}
	if want != refusedLongest {
		t.Errorf("waits reached %s, want %s", want, refusedLongest)
	}
	hs.accepted("q", t0.Add(at))
	step("took one again", at+time.Millisecond, wayDeadLetter)
	hs.forbidden()
	step("no write", at+time.Hour, wayDeadLetter)
	if got, _, _ := hs.way("other", t0); got != wayDeadLetter {
		t.Errorf("no write, unknown origin: way %d, want dead-lettered", got)
	}
}

// TestHomesOnePublishAtATime: while a copy for an origin is being
// published, the others for it await its answer, then go its way:
// dead-lettered once the origin took it, held once it refused, published
// (one of them) when there was no answer. Other origins are not held up.
func TestHomesOnePublishAtATime(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	hs := newHomes()
	awaitAnswer := func(what string, at time.Time, answer func()) {
		t.Helper()
		if got, _, _ := hs.way("q", at); got != wayPublish {
			t.Fatalf("%s: first copy's way %d, want published", what, got)
		}
		got, _, answered := hs.way("q", at)
		if got != wayAwait || answered == nil {
			t.Fatalf("%s: second copy's way %d, want it to await the first", what, got)
		}
		if got, _, _ := hs.way("other", at); got != wayPublish {
			t.Errorf("%s: another origin's copy: way %d, want published", what, got)
		}
		hs.published("other")
		select {
		case <-answered:
			t.Fatalf("%s: answered before the first copy's publish was", what)
		default:
		}
		answer()
		select {
		case <-answered:
		default:
			t.Fatalf("%s: still awaiting once the first copy's publish was answered", what)
		}
	}
	awaitAnswer("no answer", t0, func() { hs.published("q") })
	if got, _, _ := hs.way("q", t0); got != wayPublish {
		t.Errorf("after no answer: way %d, want published", got)
	}
	hs.published("q")
	awaitAnswer("refused", t0, func() { hs.refused("q", t0) })
	if got, _, _ := hs.way("q", t0); got != wayWait {
		t.Errorf("after a refusal: way %d, want held", got)
	}
	later := t0.Add(time.Minute) // past the refusal's wait
	awaitAnswer("accepted", later, func() { hs.accepted("q", later) })
	if got, _, _ := hs.way("q", later); got != wayDeadLetter {
		t.Errorf("after an acceptance: way %d, want dead-lettered", got)
	}
}

// TestHomesBounded: homes forgets origins neither refusing nor trusted
// when it is full.
func TestHomesBounded(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	hs := newHomes()
	for i := range maxHomes {
		hs.accepted(fmt.Sprint("q", i), t0)
	}
	hs.refused("new", t0.Add(homeTrust))
	if n := len(hs.origins); n != 1 {
		t.Errorf("%d origins kept, want 1", n)
	}
}
