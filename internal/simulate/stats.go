package simulate

import "math"

// censoredPercentile returns the p-th percentile (0 < p <= 1, nearest rank)
// of a population of n values of which only the sorted ones in done are
// known; the other n - len(done) never happened (a client that never
// succeeded, a message never delivered) and rank above every known value.
// ok is false when the percentile falls on one of those: the value is then
// unbounded, and reporting the percentile of the known values alone would
// flatter a strategy that strands its work.
func censoredPercentile[T int | float64](done []T, n int, p float64) (v T, ok bool) {
	if n <= 0 {
		return v, false
	}
	rank := int(math.Ceil(p*float64(n))) - 1
	rank = max(rank, 0)
	if rank >= len(done) {
		return v, false
	}
	return done[rank], true
}

// percentile is the nearest-rank p-th percentile of the sorted values, 0
// when there are none.
func percentile[T int | float64](sorted []T, p float64) T {
	v, _ := censoredPercentile(sorted, len(sorted), p)
	return v
}

// ptr returns a pointer to v when ok, else nil: a JSON null.
func ptr[T any](v T, ok bool) *T {
	if !ok {
		return nil
	}
	return &v
}
