package consumer

import (
	"slices"
	"testing"
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
