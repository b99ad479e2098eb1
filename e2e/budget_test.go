package e2e

import (
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// The retry rate budget against the broker: a storm of messages rejected
// at once, two replicas sharing the cap.

// TestRetryRateBudgetHoldsAStorm: 400 messages rejected at once, retried
// twice after 100 ms each, two replicas on one inbox. With
// REBOUND_RETRY_RATE=40:
//   - the copies are due (x-retry-due-at) at most 40 in any second, both
//     replicas together: the calendar's own promise, exact;
//   - the copies' due times span at least 4/5 of the 20 seconds 800
//     retries need at 40 a second;
//   - every message is parked after its two retries, none lost.
//
// When the broker hands a copy back is the broker's business: its TTL
// ends at the head of its delay queue, and a busy broker hands copies over
// late and in bursts (88 in one second and 447 over ten were seen on 4.3
// at load 40 on two cores; 101 and 482 failed a fresh clone's CI when this
// test bounded arrivals). The arrivals per second are logged, and measured
// in the benchmarks, never asserted here.
//
// Without the cap the copies of the storm come due within a few seconds,
// well over the cap in one second, which the test checks so that it can
// fail.
func TestRetryRateBudgetHoldsAStorm(t *testing.T) {
	t.Parallel()
	const n, rate, retries = 400, 40, 2
	for _, capped := range []bool{true, false} {
		name := "uncapped"
		if capped {
			name = "capped"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			vars := with(nil, "REBOUND_BACKOFF", "constant", "REBOUND_MIN_DELAY", "100ms", "REBOUND_MAX_RETRIES", strconv.Itoa(retries),
				"REBOUND_MAX_DURATION", "1h", "REBOUND_PREFETCH", "1000")
			if capped {
				vars["REBOUND_RETRY_RATE"] = strconv.Itoa(rate)
			}
			e := newTestEnv(t, vars)
			replicas := []*testEnv{e, e.replica()}
			for _, r := range replicas {
				r.startInProcess()
			}
			// Each replica's share is the rate over the inbox's consumers,
			// which it reads every 10 s: wait until both count two. Without
			// a cap only the replica that holds the watch reads the count.
			if !brokertest.Await(30*time.Second, func() bool {
				a, b := replicas[0].metric("rebound_inbox_consumers") == "2", replicas[1].metric("rebound_inbox_consumers") == "2"
				return a && b || !capped && (a || b)
			}) {
				t.Fatal("the replicas do not see each other on the inbox")
			}
			app := e.storm(n)
			got := e.parked(n, 2*time.Minute)
			lost := n - len(got)
			for _, d := range got {
				if d.Headers["x-retry-count"] != int64(retries) {
					t.Errorf("%s parked after %v retries, want %d", d.MessageId, d.Headers["x-retry-count"], retries)
				}
			}
			e.logAccount(n, lost, 0, 0, "-", 0)
			if lost > 0 {
				t.Fatalf("%d of %d messages not parked", lost, n)
			}
			arrived, span := retriesPerSecond(app.seen(), func(a arrival) time.Time { return a.at })
			due, dueSpan := retriesPerSecond(app.seen(), func(a arrival) time.Time {
				ms, _ := a.d.Headers["x-retry-due-at"].(int64)
				return time.UnixMilli(ms)
			})
			deferred := 0
			for _, r := range replicas {
				v, _ := strconv.Atoi(r.metric(`rebound_retry_rate_deferred_total{policy="default"}`))
				deferred += v
			}
			const window = 10 // seconds
			peak, peakDue, peakWindow := slices.Max(arrived), slices.Max(due), brokertest.BusiestWindow(arrived, window)
			t.Logf("BUDGET broker=%s capped=%v rate=%d replicas=2 messages=%d retries=%d peak_due_per_second=%d due_span=%s peak_arrived_per_second=%d peak_arrived_per_%ds=%d span=%s deferred=%d arrived_per_second=%v",
				e.Broker.Version(), capped, rate, n, len(app.seen())-n, peakDue, dueSpan.Round(100*time.Millisecond), peak, window, peakWindow, span.Round(100*time.Millisecond), deferred, arrived)
			if !capped {
				if peakDue <= rate {
					t.Errorf("without the cap at most %d copies came due in one second: the storm this test needs did not happen", peakDue)
				}
				return
			}
			if peakDue > rate {
				t.Errorf("%d copies due in one second, over the cap of %d", peakDue, rate)
			}
			if dueSpan < time.Duration(n*retries/rate)*time.Second*4/5 {
				t.Errorf("%d retries came due over %s, faster than the cap of %d a second allows", n*retries, dueSpan, rate)
			}
			if deferred == 0 {
				t.Error("no copy was counted as deferred")
			}
		})
	}
}

// retriesPerSecond counts, second by second, the retries among arrivals
// (every delivery of a message after its first) by the time when gives
// each, from the earliest on, and returns the counts and the time from the
// earliest to the latest.
func retriesPerSecond(arrivals []arrival, when func(arrival) time.Time) (counts []int, span time.Duration) {
	seen := map[string]bool{}
	var times []time.Time
	for _, a := range arrivals {
		if seen[a.d.MessageId] {
			times = append(times, when(a))
		}
		seen[a.d.MessageId] = true
	}
	if len(times) == 0 {
		return []int{0}, 0
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	first := times[0].Truncate(time.Second)
	for _, at := range times {
		i := int(at.Sub(first) / time.Second)
		for len(counts) <= i {
			counts = append(counts, 0)
		}
		counts[i]++
	}
	return counts, times[len(times)-1].Sub(times[0])
}

// TestRetryRateBudgetLosesNothingWhenAReplicaIsKilled: the calendar lives
// in a replica's memory only, and its deferred copies wait in the delay
// queues. One of two replicas under a cap of 40 is killed (SIGKILL) in
// the middle of a storm of 400 and started again with an empty calendar:
// every message is still parked after its two retries, duplicates within
// the window the kill caught, and the copies stay due at most a share
// over the cap while the restarted replica refills its calendar.
func TestRetryRateBudgetLosesNothingWhenAReplicaIsKilled(t *testing.T) {
	t.Parallel()
	const n, rate, retries = 400, 40, 2
	e := newTestEnv(t, with(nil, "REBOUND_BACKOFF", "constant", "REBOUND_MIN_DELAY", "100ms", "REBOUND_MAX_RETRIES", strconv.Itoa(retries),
		"REBOUND_MAX_DURATION", "1h", "REBOUND_RETRY_RATE", strconv.Itoa(rate)))
	e.startInProcess()
	killed := e.replica()
	p := killed.startBinary()
	if !brokertest.Await(30*time.Second, func() bool { return e.metric("rebound_inbox_consumers") == "2" }) {
		t.Fatal("the replicas do not see each other on the inbox")
	}
	app := e.storm(n)
	// Mid-storm: a quarter of the retries back in the application queue.
	if !brokertest.Await(time.Minute, func() bool { return len(app.seen()) >= n+n*retries/4 }) {
		t.Fatalf("%d arrivals in the application queue, want %d before the kill", len(app.seen()), n+n*retries/4)
	}
	if err := p.signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.wait(10 * time.Second)
	restarted := time.Now()
	killed.startBinary()
	faults := []recovery{{fault: "rebound-SIGKILL"}}
	if killed.waitReceivedOrParked(time.Minute, e.Vars["REBOUND_PARKING_QUEUE"]) {
		faults[0].recover = time.Since(restarted) // the restarted replica moves messages again
	}
	duplicates := e.accountRecovered(n, 0, faults, 2*time.Minute)
	for _, d := range e.Drain(e.App) {
		t.Errorf("%s left in the application queue", d.MessageId)
	}
	// Not a bound: the restarted replica books from an empty calendar
	// over seconds the killed one had filled, and the deliveries the kill
	// caught are decided again (docs/policies.md, Retry rate budget).
	due, _ := retriesPerSecond(app.seen(), func(a arrival) time.Time {
		ms, _ := a.d.Headers["x-retry-due-at"].(int64)
		return time.UnixMilli(ms)
	})
	t.Logf("broker %s: %d messages, one of two replicas killed mid-storm: duplicates %d, at most %d copies due in one second (cap %d)",
		e.Broker.Version(), n, duplicates, slices.Max(due), rate)
}

// storm has the application queue's consumer reject every message and
// publishes n messages to it at once, ids "0" to n-1.
func (e *testEnv) storm(n int) *rejector {
	e.t.Helper()
	app := e.rejectAll(e.App)
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: strconv.Itoa(i)}
	}
	e.Publish(e.App, msgs...)
	return app
}

// The storm with replicas coming and going: a storm of stormN messages
// rejected at once, each retried stormRetries times after 100 ms, under
// a cap of stormRate copies a second to the application queue, all
// replicas together.
const stormN, stormRate, stormRetries = 400, 40, 2

// newStormEnv is the deployment of a storm test (stop with replicas'
// startInProcess; replicas come from replica()).
func newStormEnv(t *testing.T) *testEnv {
	return newTestEnv(t, with(nil, "REBOUND_BACKOFF", "constant", "REBOUND_MIN_DELAY", "100ms", "REBOUND_MAX_RETRIES", strconv.Itoa(stormRetries),
		"REBOUND_MAX_DURATION", "1h", "REBOUND_PREFETCH", "1000", "REBOUND_RETRY_RATE", strconv.Itoa(stormRate)))
}

// awaitShare waits until every replica counts n replicas on the inbox:
// its share of the cap is stormRate/n.
func awaitShare(t *testing.T, replicas []*testEnv, n int) {
	t.Helper()
	want := strconv.FormatFloat(float64(stormRate)/float64(n), 'g', -1, 64)
	if !brokertest.Await(30*time.Second, func() bool {
		for _, r := range replicas {
			if r.metric(`rebound_retry_rate_share{policy="default"}`) != want {
				return false
			}
		}
		return true
	}) {
		got := make([]string, len(replicas))
		for i, r := range replicas {
			got[i] = r.metric(`rebound_retry_rate_share{policy="default"}`)
		}
		t.Fatalf("the replicas' shares are %v, want %s each (%d replicas)", got, want, n)
	}
}

// dueAt is the second a retry's copy came due, from its x-retry-due-at.
func dueAt(a arrival) time.Time {
	ms, _ := a.d.Headers["x-retry-due-at"].(int64)
	return time.UnixMilli(ms)
}

// awaitParkedStorm waits until every message of the storm is parked after
// its retries, and fails the test for any that is not.
func (e *testEnv) awaitParkedStorm() {
	e.t.Helper()
	got := e.parked(stormN, 3*time.Minute)
	for _, d := range got {
		if d.Headers["x-retry-count"] != int64(stormRetries) {
			e.t.Errorf("%s parked after %v retries, want %d", d.MessageId, d.Headers["x-retry-count"], stormRetries)
		}
	}
	if lost := stormN - len(got); lost > 0 {
		e.t.Fatalf("%d of %d messages not parked", lost, stormN)
	}
}

// TestRetryRateBudgetReplicasStartedTogether: two and three replicas
// started together, the storm as soon as each counts the others: the
// copies due in any one second (x-retry-due-at), all replicas together,
// never exceed the cap, though the cap does not divide into whole shares
// (40 over 3 is 13⅓ a second each).
func TestRetryRateBudgetReplicasStartedTogether(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 3} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			t.Parallel()
			e := newStormEnv(t)
			replicas := []*testEnv{e}
			for len(replicas) < n {
				replicas = append(replicas, e.replica())
			}
			for _, r := range replicas {
				r.startInProcess()
			}
			awaitShare(t, replicas, n)
			app := e.storm(stormN)
			e.awaitParkedStorm()
			due, span := retriesPerSecond(app.seen(), dueAt)
			peak := slices.Max(due)
			t.Logf("BUDGET broker=%s replicas=%d started together: at most %d copies due in one second (cap %d), due over %s: %v",
				e.Broker.Version(), n, peak, stormRate, span.Round(100*time.Millisecond), due)
			if peak > stormRate {
				t.Errorf("%d copies due in one second, over the cap of %d", peak, stormRate)
			}
		})
	}
}

// TestRetryRateBudgetReplicaJoinsOrLeavesMidStorm: a third replica joins
// two mid-storm, or one of three leaves (stopped as by SIGTERM).
//   - A join: seconds the others booked before it came cannot be
//     unbooked (there is no shared state), so the copies due over the cap,
//     summed over the seconds, stay within the newcomer's share (the cap
//     over three, rounded up) for each second booked before the change,
//     and two more (a second for the others to count it, a second's
//     rounding).
//   - A leave: the others keep their old shares over the seconds they
//     had booked, where the copies of the one that left still come due,
//     so at most its share for the two seconds it takes to count the
//     leave and move places.
func TestRetryRateBudgetReplicaJoinsOrLeavesMidStorm(t *testing.T) {
	t.Parallel()
	for _, join := range []bool{true, false} {
		name := "leaves"
		if join {
			name = "joins"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newStormEnv(t)
			replicas := []*testEnv{e, e.replica(), e.replica()}
			stops := make([]func() error, len(replicas))
			before := 3
			if join {
				before = 2
			}
			for i, r := range replicas[:before] {
				stops[i] = r.startInProcess()
			}
			awaitShare(t, replicas[:before], before)
			app := e.storm(stormN)
			// Mid-storm: a quarter of the retries back in the application queue.
			if !brokertest.Await(time.Minute, func() bool { return len(app.seen()) >= stormN+stormN*stormRetries/4 }) {
				t.Fatalf("%d arrivals in the application queue, want %d before the change", len(app.seen()), stormN+stormN*stormRetries/4)
			}
			var changed time.Time
			if join {
				replicas[2].startInProcess()
				changed = time.Now() // ready: consuming
			} else {
				if err := stops[2](); err != nil {
					t.Fatal(err)
				}
				changed = time.Now()
			}
			e.awaitParkedStorm()
			arrivals := app.seen()
			due, _ := retriesPerSecond(arrivals, dueAt)
			excess := 0
			for _, c := range due {
				excess += max(c-stormRate, 0)
			}
			booked := bookedBefore(arrivals, changed)
			share := (stormRate + 2) / 3 // the cap over three, rounded up
			// Either way the bound is one share (the newcomer's, the
			// leaver's) for each second booked before the change, plus
			// two. A leaver's overshoot is its share over the seconds it
			// had booked beyond the others' own bookings: none on a quiet
			// machine (measured 0), but at load 30 one replica got 3–4
			// seconds ahead of the others (54 due in one second, 45 over
			// the cap in all, 14 s booked), and which replica booked
			// which copy the test cannot tell, so the seconds anyone had
			// booked stand for them. The per-second rule is proven exactly
			// in internal/calendar (TestReplicasJoiningOrLeavingMidStorm).
			bound := share * (int(booked.Seconds()) + 2)
			t.Logf("BUDGET broker=%s replica %s mid-storm (2↔3): at most %d copies due in one second (cap %d), %d over the cap in all, seconds booked before the change %.1f, bound %d: %v",
				e.Broker.Version(), name, slices.Max(due), stormRate, excess, booked.Seconds(), bound, due)
			if excess > bound {
				t.Errorf("%d copies due over the cap, more than the bound of %d (a share of %d; %.1f seconds booked before the change)", excess, bound, share, booked.Seconds())
			}
		})
	}
}

// bookedBefore is how far past changed reach the copies booked before
// it: a copy is booked when its message's previous delivery is rejected,
// at once on arrival in the application queue.
func bookedBefore(arrivals []arrival, changed time.Time) time.Duration {
	last := map[string]time.Time{}
	var latest time.Time
	for _, a := range arrivals {
		if prev, ok := last[a.d.MessageId]; ok && prev.Before(changed) {
			if due := dueAt(a); due.After(latest) {
				latest = due
			}
		}
		last[a.d.MessageId] = a.at
	}
	return max(latest.Sub(changed), 0)
}
