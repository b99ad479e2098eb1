package e2e

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// TestMeasureHoldVsQueues measures, when REBOUND_MEASURE is set, copies
// per second through the whole loop (application queue → inbox → delay →
// application queue, twice, then parked) in each delay mode, in one run on
// one broker: hold, queues with quorum delay queues, queues with classic
// ones, and one quorum delay queue (no jitter). Delays are drawn with full
// jitter from 1s to 4s, spread over about as many delay queues as two
// digits give. It checks that every message is parked, and logs the rate;
// run it on an idle machine for numbers worth quoting:
//
//	REBOUND_MEASURE=1 REBOUND_TEST_BROKER=4.3 go test -run TestMeasureHoldVsQueues -v ./e2e/
func TestMeasureHoldVsQueues(t *testing.T) {
	if os.Getenv("REBOUND_MEASURE") == "" {
		t.Skip("set REBOUND_MEASURE=1 to measure")
	}
	holdBroker(t)
	n, _ := strconv.Atoi(os.Getenv("REBOUND_MEASURE_N"))
	if n <= 0 {
		n = 5000
	}
	spread := map[string]string{"REBOUND_BACKOFF": "exponential", "REBOUND_JITTER": "full", "REBOUND_MIN_DELAY": "1s",
		"REBOUND_MAX_DELAY": "4s", "REBOUND_MAX_RETRIES": "2"}
	for _, mode := range []struct {
		name string
		vars map[string]string
	}{
		{"hold", with(spread, "REBOUND_DELAY_MODE", "hold", "REBOUND_QUEUE_TYPE", "quorum")},
		{"queues-quorum", with(spread, "REBOUND_QUEUE_TYPE", "quorum")},
		{"queues-classic", with(spread, "REBOUND_QUEUE_TYPE", "classic")},
		{"one-quorum-delay-queue", with(spread, "REBOUND_QUEUE_TYPE", "quorum", "REBOUND_BACKOFF", "constant", "REBOUND_JITTER", "none")},
	} {
		t.Run(mode.name, func(t *testing.T) {
			e := newTestEnv(t, mode.vars)
			e.startInProcess()
			e.rejectAll(e.App)
			started := time.Now()
			e.publishNumbered(n)
			parking := e.Vars["REBOUND_PARKING_QUEUE"]
			e.WaitQueueLen(parking, n, 10*time.Minute)
			elapsed := time.Since(started)
			t.Logf("MEASURE mode=%s broker=%s messages=%d retried_copies=%d elapsed=%s copies_per_s=%.0f",
				mode.name, e.Broker.Version(), n, 2*n, elapsed.Round(time.Millisecond), float64(2*n)/elapsed.Seconds())
			if mode.name == "hold" {
				// How late the holders released the copies after their due
				// time (rebound_hold_lateness_seconds): p99 ≤ 1 s when 99 %
				// fall in the le="1" bucket.
				late := func(le string) float64 {
					v, _ := strconv.ParseFloat(e.metric(`rebound_hold_lateness_seconds_bucket{le="`+le+`"}`), 64)
					return v
				}
				all := late("+Inf")
				if all == 0 {
					t.Fatal("no lateness observed in hold mode")
				}
				t.Logf("MEASURE mode=hold lateness: %.1f %% released within 100 ms of due, %.1f %% within 1 s (p99 ≤ 1 s: %v), of %.0f",
					100*late("0.1")/all, 100*late("1")/all, late("1")/all >= 0.99, all)
			}
		})
	}
}
