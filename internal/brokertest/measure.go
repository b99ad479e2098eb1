package brokertest

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// Measurements are tests that print numbers for a person to read (copies
// a second, checks a second, lateness) and run for minutes, so they run
// only when asked for: REBOUND_MEASURE, or REBOUND_MEASURE_WATCH for the
// watch measurements of several minutes. Their sizes and windows come
// from the environment variables below, with a default each.

// Measure skips t unless the environment variable env is set.
func Measure(t testing.TB, env string) {
	t.Helper()
	if os.Getenv(env) == "" {
		t.Skipf("a measurement: set %s=1", env)
	}
}

// MeasureCount is the whole number above 0 in the environment variable
// env (such as REBOUND_MEASURE_N, how many messages, or
// REBOUND_MEASURE_RATE, how many a second), or def when it holds none.
func MeasureCount(env string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(env)); err == nil && n > 0 {
		return n
	}
	return def
}

// MeasureWindow is the duration in the environment variable env
// (REBOUND_MEASURE_WINDOW: how long a measurement counts), or def when it
// holds none.
func MeasureWindow(env string, def time.Duration) time.Duration {
	if w, err := time.ParseDuration(os.Getenv(env)); err == nil {
		return w
	}
	return def
}
