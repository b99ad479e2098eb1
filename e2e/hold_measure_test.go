package e2e

import (
	"bytes"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// TestMeasureHoldVsQueues measures, when REBOUND_MEASURE is set, copies
// per second through the whole loop (application queue → inbox → delay →
// application queue, twice, then parked) in each delay mode, in one run on
// one broker: hold (with the broker's default dead-letter window, and with
// it raised to 512), queues with quorum delay queues, queues with classic
// ones, one quorum delay queue (no jitter), and no delay at all (every
// retry immediate: the loop's floor). Delays are drawn with full
// jitter from 1s to 4s, spread over about as many delay queues as two
// digits give. It checks that every message is parked, and logs the rate,
// the broker's CPU per retried copy and how late the copies reached the
// application queue after their x-retry-due-at; run it on an idle machine
// for numbers worth quoting:
//
//	REBOUND_MEASURE=1 REBOUND_TEST_BROKER=4.3 go test -run TestMeasureHoldVsQueues -v ./e2e/
//
// REBOUND_MEASURE_N is how many messages (5000), after a warm-up of a
// quarter as many that declares the delay queues; they are published at
// once, a burst, unless REBOUND_MEASURE_RATE gives messages a second, a
// steady stream: a mode keeps up with a rate when its copies arrive on
// time (p99 lateness ≤ 1 s).
func TestMeasureHoldVsQueues(t *testing.T) {
	brokertest.Measure(t, "REBOUND_MEASURE")
	holdBroker(t)
	n := brokertest.MeasureCount("REBOUND_MEASURE_N", 5000)
	rate := brokertest.MeasureCount("REBOUND_MEASURE_RATE", 0)
	spread := map[string]string{"REBOUND_BACKOFF": "exponential", "REBOUND_JITTER": "full", "REBOUND_MIN_DELAY": "1s",
		"REBOUND_MAX_DELAY": "4s", "REBOUND_MAX_RETRIES": "2"}
	hold := with(spread, "REBOUND_DELAY_MODE", "hold", "REBOUND_QUEUE_TYPE", "quorum")
	for _, mode := range []struct {
		name string
		vars map[string]string
		// dlxWindow, when set, is the broker's
		// dead_letter_worker_consumer_prefetch for this mode: how many
		// copies a quorum queue's at-least-once dead-lettering has in
		// flight to their targets (RabbitMQ's default is 32).
		dlxWindow int
	}{
		{name: "hold", vars: hold},
		{name: "hold-dlx-window-512", vars: hold, dlxWindow: 512},
		{name: "queues-quorum", vars: with(spread, "REBOUND_QUEUE_TYPE", "quorum")},
		{name: "queues-classic", vars: with(spread, "REBOUND_QUEUE_TYPE", "classic")},
		{name: "one-quorum-delay-queue", vars: with(spread, "REBOUND_QUEUE_TYPE", "quorum", "REBOUND_BACKOFF", "constant", "REBOUND_JITTER", "none")},
		// The loop without a delay: every retry immediate, straight back to
		// the application queue. What this costs the broker a copy bounds
		// what any way of delaying copies can save.
		{name: "no-delay", vars: with(spread, "REBOUND_QUEUE_TYPE", "quorum", "REBOUND_IMMEDIATE_RETRIES", "2")},
	} {
		t.Run(mode.name, func(t *testing.T) {
			if mode.dlxWindow > 0 {
				setDeadLetterWindow(t, mode.dlxWindow)
			}
			e := newTestEnv(t, mode.vars)
			e.startInProcess()
			app := e.rejectAll(e.App)
			parking := e.Vars["REBOUND_PARKING_QUEUE"]
			// A warm-up a quarter the size first (ids n and up), so that
			// the measured messages find their delay queues declared, as in
			// a steady state; only ids below n are measured.
			warm := n / 4
			e.publishNumberedFrom(n, warm)
			e.WaitQueueLen(parking, warm, 10*time.Minute)
			cpuBefore := brokerCPU(t)
			started := time.Now()
			if rate > 0 {
				e.publishPaced(n, rate)
			} else {
				e.publishNumbered(n)
			}
			published := time.Since(started)
			e.WaitQueueLen(parking, warm+n, 10*time.Minute)
			elapsed := time.Since(started)
			cpu := brokerCPU(t) - cpuBefore
			t.Logf("MEASURE mode=%s broker=%s messages=%d published_per_s=%.0f retried_copies=%d elapsed=%s copies_per_s=%.0f",
				mode.name, e.Broker.Version(), n, float64(n)/published.Seconds(), 2*n, elapsed.Round(time.Millisecond), float64(2*n)/elapsed.Seconds())
			// Everything the broker did for these messages (publish,
			// dead-lettering into the inbox, the delay, home again, parking)
			// divided by the retried copies: what a broker that is the
			// bottleneck pays per retry.
			t.Logf("MEASURE mode=%s broker CPU %s, %.0f µs per retried copy", mode.name, cpu.Round(time.Millisecond),
				float64(cpu.Microseconds())/float64(2*n))
			// The parking queue can count a duplicate before the last copy
			// it stands for has been seen arriving. A copy whose jittered
			// delay rounds to nothing is sent straight back, without
			// x-retry-due-at: it is counted apart.
			var late []time.Duration
			brokertest.Await(30*time.Second, func() bool {
				late = arrivalLateness(app.seen(), n)
				return len(late)+straightBack(app.seen(), n) >= 2*n
			})
			if got := len(late) + straightBack(app.seen(), n); got < 2*n {
				t.Errorf("%d copies arrived, want %d", got, 2*n)
			}
			t.Logf("MEASURE mode=%s %d copies sent straight back (delay rounded to nothing)", mode.name, straightBack(app.seen(), n))
			if len(late) > 0 {
				within := sortedIndex(late, time.Second)
				t.Logf("MEASURE mode=%s arrival lateness: p50 %s, p99 %s, max %s; %.1f %% within 1 s of due (p99 ≤ 1 s: %v)",
					mode.name, late[len(late)/2].Round(time.Millisecond), late[len(late)*99/100].Round(time.Millisecond),
					late[len(late)-1].Round(time.Millisecond), 100*float64(within)/float64(len(late)), late[len(late)*99/100] <= time.Second)
			}
			if mode.vars["REBOUND_DELAY_MODE"] == "hold" {
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
				t.Logf("MEASURE mode=hold release lateness: %.1f %% released within 100 ms of due, %.1f %% within 1 s (p99 ≤ 1 s: %v), of %.0f",
					100*late("0.1")/all, 100*late("1")/all, late("1")/all >= 0.99, all)
			}
		})
	}
}

// setDeadLetterWindow sets the broker's dead_letter_worker_consumer_prefetch
// to window until the test ends. A quorum queue's dead-letter worker reads
// it when it starts, so it applies to queues declared after this call.
func setDeadLetterWindow(t *testing.T, window int) {
	t.Helper()
	b := brokertest.Require(t)
	const key = "dead_letter_worker_consumer_prefetch"
	before := strings.TrimSpace(b.MustCtl(t, "eval", "application:get_env(rabbit, "+key+", 32)."))
	b.MustCtl(t, "eval", "application:set_env(rabbit, "+key+", "+strconv.Itoa(window)+").")
	t.Cleanup(func() { b.MustCtl(t, "eval", "application:set_env(rabbit, "+key+", "+before+").") })
}

// brokerCPU is the CPU time the broker's node has used so far (user and
// system, from /proc: the test brokers run on this machine).
func brokerCPU(t *testing.T) time.Duration {
	t.Helper()
	pid := strings.Trim(strings.TrimSpace(brokertest.Require(t).MustCtl(t, "eval", "os:getpid().")), `"`)
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		t.Fatalf("the broker's CPU time: %v", err)
	}
	// The fields after the command name, which is in parentheses:
	// utime and stime are the 12th and 13th, in clock ticks.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// clockTicks is the kernel's USER_HZ, the unit of /proc's CPU times: 100
// on every Linux architecture Go runs on here.
const clockTicks = 100

// publishPaced publishes n numbered messages at perSecond, a tenth of a
// second's worth at a time; a batch that takes longer than its tenth makes
// the rate lower (the caller logs the rate it got).
func (e *testEnv) publishPaced(n, perSecond int) {
	e.t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	batch := max(1, perSecond/10)
	for first := 0; first < n; first += batch {
		if err := e.tryPublishNumbered(first, min(batch, n-first)); err != nil {
			e.t.Fatal(err)
		}
		<-tick.C
	}
}

// arrivalLateness is, sorted, how long after its x-retry-due-at each
// delayed copy of a message id below n reached the application queue
// (early arrivals count as 0).
func arrivalLateness(arrivals []arrival, n int) []time.Duration {
	var late []time.Duration
	for _, a := range arrivals {
		if id, err := strconv.Atoi(a.d.MessageId); err != nil || id >= n {
			continue
		}
		var due int64
		switch v := a.d.Headers["x-retry-due-at"].(type) {
		case int64:
			due = v
		case int32:
			due = int64(v)
		case uint64:
			due = int64(v)
		default:
			continue // the message as first published
		}
		late = append(late, max(0, a.at.Sub(time.UnixMilli(due))))
	}
	slices.Sort(late)
	return late
}

// sortedIndex is the index of the first duration in sorted past limit.
func sortedIndex(sorted []time.Duration, limit time.Duration) int {
	i, _ := slices.BinarySearchFunc(sorted, limit, func(d, l time.Duration) int {
		if d <= l {
			return -1
		}
		return 1
	})
	return i
}

// straightBack counts the arrivals of ids below n, beyond each id's first,
// without x-retry-due-at: copies sent back with no delay.
func straightBack(arrivals []arrival, n int) int {
	first := map[string]bool{}
	count := 0
	for _, a := range arrivals {
		if id, err := strconv.Atoi(a.d.MessageId); err != nil || id >= n {
			continue
		}
		if !first[a.d.MessageId] {
			first[a.d.MessageId] = true
			continue
		}
		if _, ok := a.d.Headers["x-retry-due-at"]; !ok {
			count++
		}
	}
	return count
}
