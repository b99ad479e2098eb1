package policy

import (
	"strings"
	"time"
)

// defaultDelayDigits is how many significant digits of its millisecond
// count a delay keeps by default (REBOUND_DELAY_DIGITS).
const defaultDelayDigits = 2

// round rounds d to digits significant digits (1, 2 or 3; any other value
// counts as the default, 2) of its millisecond count, half up, never
// below a whole millisecond (what x-message-ttl counts). Every distinct
// delay needs its own delay queue (rebound.delay.<ms>), so rounding keeps
// their number bounded and their names readable. With the default two
// digits 1234ms becomes 1.2s and 56789ms 57s (under 5 % error, none for
// round delays, at most 90 delay queues a decade); with one digit 1234ms becomes 1s and 56789ms
// 60s (under 50 % error, at most 9 delay queues a decade); with three
// 1230ms and 56.8s (under 0.5 %, up to 900 a decade). A negative d rounds
// to 0.
func round(d time.Duration, digits int) time.Duration {
	if d <= 0 {
		return 0
	}
	step := significantStep(d, digits)
	q, rest := d/step, d%step
	if rest >= step/2 {
		q++
	}
	// No overflow: near the largest Duration the step is 1e17ns and
	// 9.2e18 rounds down.
	return q * step
}

// roundUp is the smallest delay of digits significant milliseconds that
// is not below d: where a copy that must not come due earlier than d can
// wait.
func roundUp(d time.Duration, digits int) time.Duration {
	down := roundDown(d, digits)
	if down >= d {
		return down
	}
	// The next multiple of d's step; at a power of ten the step grows, and
	// the multiple is still one of the coarser grid.
	return down + significantStep(d, digits)
}

// Grid lists, shortest first, every delay of digits significant
// milliseconds from 1ms up to longest: every delay round, roundUp and the
// policies give a delay queue within that range, and so every name a
// delay queue of that precision can have.
func Grid(digits int, longest time.Duration) []time.Duration {
	var grid []time.Duration
	for d := time.Millisecond; d <= longest; d += significantStep(d, digits) {
		grid = append(grid, d)
	}
	return grid
}

// roundDown is round rounding toward 0 instead: the largest delay of
// digits significant milliseconds that is not above d.
func roundDown(d time.Duration, digits int) time.Duration {
	if d <= 0 {
		return 0
	}
	step := significantStep(d, digits)
	return d / step * step
}

// significantStep is the unit of the last of digits significant digits of
// d in milliseconds, never below one millisecond.
func significantStep(d time.Duration, digits int) time.Duration {
	scale := time.Duration(100) // 10^digits
	switch digits {
	case 1:
		scale = 10
	case 3:
		scale = 1000
	}
	step := time.Millisecond
	// step <= d/scale is d >= scale·step without the overflow.
	for limit := d / scale; step <= limit; {
		step *= 10
	}
	return step
}

// FormatDuration writes d the way configuration writes durations, without
// the zero units Duration.String keeps: 1h, 1h30m, 2m, 1m30s, 500ms,
// 1.125s. The schedule and the simulator show a policy's delays with it.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
