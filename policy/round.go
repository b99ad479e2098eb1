package policy

import (
	"strings"
	"time"
)

// RoundDelay rounds d to two significant digits of its millisecond count,
// half up: 1234ms becomes 1.2s, 56789ms becomes 57s, 1ms stays 1ms and a
// delay under half a millisecond becomes 0. Below 100ms that is the whole
// millisecond, which is what x-message-ttl counts.
//
// Every distinct delay needs its own delay queue (rebound.delay.<ms>), so
// rounding keeps their number bounded and their names readable, at under
// 5 % error and none for round delays. A negative d rounds to 0.
func RoundDelay(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	step := significantStep(d)
	q, rest := d/step, d%step
	if rest >= step/2 {
		q++
	}
	// No overflow: near the largest Duration the step is 1e17ns and
	// 9.2e18 rounds down.
	return q * step
}

// roundDown is RoundDelay rounding toward 0 instead: the largest delay of
// two significant milliseconds that is not above d.
func roundDown(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	step := significantStep(d)
	return d / step * step
}

// significantStep is the unit of the second significant digit of d in
// milliseconds, never below one millisecond.
func significantStep(d time.Duration) time.Duration {
	step := time.Millisecond
	// step <= d/100 is d >= 100·step without the overflow.
	for hundredth := d / 100; step <= hundredth; {
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
