package consumer

import (
	"slices"
	"testing"
	"time"
)

// TestReplicasTakePlacesAndMoveDown: replicas on one inbox take the
// places 0, 1 and 2 and count each other; when the one at place 0
// leaves, the others count two within a second or so and the one at
// place 2 moves down to the free place, so the places are 0 and 1 again.
func TestReplicasTakePlacesAndMoveDown(t *testing.T) {
	e := newEnv(t, "classic")
	opt := e.options()
	var replicas []*Sidecar
	var stops []func() error
	for range 3 {
		s, stop := e.start(opt)
		replicas, stops = append(replicas, s), append(stops, stop)
	}
	places := func(rs []*Sidecar) (places []int64, counts []int64) {
		for _, s := range rs {
			places, counts = append(places, s.place.Load()), append(counts, s.consumers.Load())
		}
		return places, counts
	}
	e.eventually("three replicas at places 0, 1 and 2, each counting three", func() bool {
		p, c := places(replicas)
		slices.Sort(p)
		return slices.Equal(p, []int64{0, 1, 2}) && slices.Equal(c, []int64{3, 3, 3})
	})
	first := slices.IndexFunc(replicas, func(s *Sidecar) bool { return s.place.Load() == 0 })
	if err := stops[first](); err != nil {
		t.Fatal(err)
	}
	rest := slices.Delete(slices.Clone(replicas), first, first+1)
	e.eventually("two replicas at places 0 and 1, each counting two", func() bool {
		p, c := places(rest)
		slices.Sort(p)
		return slices.Equal(p, []int64{0, 1}) && slices.Equal(c, []int64{2, 2})
	})
	p, c := places(rest)
	t.Logf("after the replica at place 0 left: places %v, counts %v", p, c)
	for _, s := range rest {
		sh := s.share(opt.Router.Policies.Default())
		if sh.Replicas != 2 {
			t.Errorf("share %+v, want over 2 replicas", sh)
		}
	}
}

// TestAReplicaBetweenTwoConsumersIsNotALeave: a third replica (played by
// the test: it holds place 2 and consumes the inbox) cancels its inbox
// consumer and takes a long time to consume again, as inbox.refit can on
// a busy broker. The two sidecars read one consumer fewer, but the places
// say no replica left: they keep counting three for readings on end. Once
// it lets its place go too, they count two.
func TestAReplicaBetweenTwoConsumersIsNotALeave(t *testing.T) {
	e := newEnv(t, "classic")
	opt := e.options()
	a, _ := e.start(opt)
	b, _ := e.start(opt)
	conn := e.b.Dial(t, e.URL())
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	e.eventually("the sidecars at places 0 and 1", func() bool { return a.place.Load()+b.place.Load() == 1 })
	if _, err := ch.QueueDeclare(e.topo.PlaceQueue(2), false, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Consume(e.topo.InboxQueue, "third", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	counting := func(n int64) bool { return a.consumers.Load() == n && b.consumers.Load() == n }
	e.eventually("both count three", func() bool { return counting(3) })
	if err := ch.Cancel("third", false); err != nil {
		t.Fatal(err)
	}
	e.eventually("both read two consumers on the inbox", func() bool {
		return e.metric("rebound_inbox_consumers") == 2
	})
	// Readings come twice a second: three seconds is six of them, where
	// the count without places would have fallen at the second.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !counting(3) {
			t.Fatalf("a replica between two consumers taken for one that left: counts %d and %d", a.consumers.Load(), b.consumers.Load())
		}
	}
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	e.eventually("both count two once its place is gone", func() bool { return counting(2) })
}

// TestReplicasCountAJoinOrLeaveWithinASecond: a replica that joins the
// inbox is counted by the one already there at its next reading of the
// inbox's consumers (twice a second), and one that leaves at the second
// reading that shows it gone. The bound allows a loaded test machine four
// seconds more, counted from when the joining replica is consuming (its
// connecting and declaring are the broker's pace, not the reading's) and
// from when the leaving replica has stopped (its own drain is not the
// reading's delay); reading every 10 s, as replicas once did, misses a
// leave every time.
func TestReplicasCountAJoinOrLeaveWithinASecond(t *testing.T) {
	const within = 5 * time.Second
	e := newEnv(t, "classic")
	opt := e.options()
	a, _ := e.start(opt)
	e.eventually("the first replica counts itself", func() bool { return a.consumers.Load() == 1 })
	counted := func(what string, n int64, since time.Time) {
		t.Helper()
		e.eventually(what, func() bool { return a.consumers.Load() == n })
		took := time.Since(since)
		t.Logf("%s after %s", what, took.Round(10*time.Millisecond))
		if took > within {
			t.Errorf("%s after %s, more than %s", what, took.Round(10*time.Millisecond), within)
		}
	}
	_, stop := e.start(opt)
	counted("a joining replica counted", 2, time.Now()) // start returns once it consumes
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	counted("a leaving replica counted", 1, time.Now())
}

// TestOnlyASecondLowerReadingProbesThePlaces: a replica between two
// consumers for a moment (inbox.refit, after every burst) lowers one
// reading of the inbox's consumers; probing the places on it would cost
// every replica up to N declarations per dip, N × N across the fleet.
// setConsumers holds the count over that one reading, so only the second
// lower reading in a row, the one it would take, is probed.
func TestOnlyASecondLowerReadingProbesThePlaces(t *testing.T) {
	var l lowerReadings
	for i, step := range []struct {
		consumers, counted int
		probe              bool
	}{
		{50, 50, false},
		{49, 50, false}, // a dip: held by setConsumers, not probed
		{50, 50, false},
		{49, 50, false},
		{50, 50, false},
		{49, 50, false}, // a leave: lower twice, probed at the second
		{49, 50, true},
		{48, 50, false}, // after a probe, two lower readings again
		{48, 50, true},
		{0, 1, false}, // this replica counts itself whatever the broker says
		{0, 1, false},
	} {
		if got := l.probe(step.consumers, step.counted); got != step.probe {
			t.Errorf("reading %d: %d consumers with %d counted: probe %v, want %v", i, step.consumers, step.counted, got, step.probe)
		}
	}
}
