package delayed

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/delayqueue"
	"github.com/rebound-mq/rebound/policy"
	"github.com/rebound-mq/rebound/republisher"
)

// TestFlushAndCancelTwoOrigins: a flush sends the copies of the matching
// origin back to it and puts every other copy back into the delay queue
// of the time it still had to wait, with its due time; a copy without one
// (an older rebound's) stays in its queue; a matching copy whose origin
// the allowlist refuses stays too. A cancel then parks the other origin's
// copies, reason cancelled. Nothing is lost. Classic and quorum delay
// queues.
func TestFlushAndCancelTwoOrigins(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		prefix := "" // set once the deployment is
		e := newEnv(t, queueType, map[string]string{"REBOUND_ORIGIN_QUEUES": `\.(a|b)$`})
		prefix = e.Prefix
		a, b, c := e.app("a"), e.app("b"), e.app("c") // c exists, but the allowlist refuses it
		now := time.Now()
		long, longer := 10*time.Minute, 20*time.Minute
		var ws []waiting
		for i := range 3 {
			ws = append(ws,
				waiting{id: fmt.Sprintf("a%d", i), origin: a, delay: long, due: now.Add(5 * time.Minute)},
				waiting{id: fmt.Sprintf("b%d", i), origin: b, delay: long, due: now.Add(4*time.Minute + 35*time.Second)})
		}
		ws = append(ws,
			waiting{id: "b-old", origin: b, delay: longer},                              // no due time: an older rebound's
			waiting{id: "c0", origin: c, delay: longer, due: now.Add(15 * time.Minute)}) // matches the flush, refused
		e.seed(ws...)
		e.WaitQueueLen(e.delayQueue(long), 6, 10*time.Second)
		e.WaitQueueLen(e.delayQueue(longer), 2, 10*time.Second)

		start := time.Now()
		res, err := e.dp.Move(context.Background(), e.find(), matching(Flush, `^`+regexp.QuoteMeta(prefix)+`(a|c)$`), time.Now)
		end := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		if res.Read != 8 || res.Matched != 4 || res.Sent != 3 || res.Redelayed != 3 || res.Left[whyNoDueTime] != 1 || len(res.Kept) != 1 ||
			res.Kept[0].ID != "c0" || res.Kept[0].Why != "origin queue not allowed by REBOUND_ORIGIN_QUEUES" {
			t.Fatalf("flush: %+v", res)
		}
		e.WaitQueueLen(a, 3, 10*time.Second)
		// b's copies came due at 4m35s: each waits in the queue of what it
		// had left, rounded up (never earlier, and not much later), with
		// its due time unchanged.
		lo, hi := ws[1].due.Sub(end), policy.Policy{}.RoundUp(ws[1].due.Sub(start))
		var redelayed []Queue
		for _, q := range e.find() {
			if q.Delay >= lo && q.Delay <= hi {
				redelayed = append(redelayed, q)
			}
		}
		if len(redelayed) == 0 {
			t.Fatalf("no delay queue between %s and %s: %+v", lo, hi, e.find())
		}
		seen := 0
		for _, q := range redelayed {
			e.WaitQueueLen(q.Name, q.Messages, 10*time.Second)
			for id, d := range e.take(q.Name) {
				want := ws[1].due.UnixMilli()
				if d.RoutingKey != e.topo.InboxQueue || d.Headers["x-retry-origin-queue"] != b || d.Headers["x-retry-due-at"] != want || d.Headers["tenant"] != "acme" || d.Headers["x-retry-count"] != int64(3) {
					t.Errorf("%s in %s: routing key %s, headers %v; want the inbox, origin %s, due %d, the rest as it was", id, q.Name, d.RoutingKey, d.Headers, b, want)
				}
				seen++
				e.seed(waiting{id: id, origin: b, delay: q.Delay, due: ws[1].due}) // put it back for the cancel
			}
		}
		if seen != 3 {
			t.Errorf("%d of b's 3 copies re-delayed", seen)
		}
		// Left and kept copies are still in the longer queue.
		e.WaitQueueLen(e.delayQueue(longer), 2, 10*time.Second)
		e.WaitQueueLen(e.delayQueue(long), 0, 10*time.Second)

		res, err = e.dp.Move(context.Background(), e.find(), matching(Cancel, `^`+regexp.QuoteMeta(b)+`$`), time.Now)
		if err != nil {
			t.Fatal(err)
		}
		if res.Read != 5 || res.Matched != 4 || res.Parked != 4 || res.Redelayed != 1 || len(res.Kept) != 0 {
			t.Fatalf("cancel: %+v", res)
		}
		e.WaitQueueLen(e.topo.ParkingQueue, 4, 10*time.Second)
		parked := e.take(e.topo.ParkingQueue)
		for _, id := range []string{"b0", "b1", "b2", "b-old"} {
			d, ok := parked[id]
			if !ok || d.Headers["x-retry-parked-reason"] != "cancelled" || d.Headers["x-retry-origin-queue"] != b || d.Headers["x-retry-due-at"] != nil {
				t.Errorf("parked %s: %v, %v; want reason cancelled, origin %s, no due time", id, ok, d.Headers, b)
			}
		}
		// Nothing lost: 3 in a, 4 parked, c0 still waiting.
		total := 0
		for _, q := range e.find() {
			total += q.Messages
		}
		if total != 1 || e.QueueLen(a) != 3 || e.QueueLen(b) != 0 || e.QueueLen(c) != 0 {
			t.Errorf("after both: %d waiting, %d in a, %d in b, %d in c; want 1, 3, 0, 0", total, e.QueueLen(a), e.QueueLen(b), e.QueueLen(c))
		}
	})
}

// TestInterruptedFlushLosesNothing: a flush of thousands of copies
// interrupted mid-way (Ctrl-C cancels the command's context) stops, and
// every copy is either in its origin queue or still waiting, with no
// duplicate: it settles what it sent before it lets go. A second flush
// moves the rest. Classic and quorum delay queues.
func TestInterruptedFlushLosesNothing(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType, nil)
		a := e.app("a")
		const n = 3000
		due := time.Now().Add(5 * time.Minute)
		ws := make([]waiting, n)
		for i := range ws {
			ws[i] = waiting{id: fmt.Sprint(i), origin: a, delay: 10 * time.Minute, due: due}
		}
		e.seed(ws...)
		e.WaitQueueLen(e.delayQueue(10*time.Minute), n, 30*time.Second)

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		opt := matching(Flush, `^`+regexp.QuoteMeta(a)+`$`)
		opt.Progress = func(p Progress) {
			if p.Read == n/3 {
				cancel() // as SIGINT does
			}
		}
		res, err := e.dp.Move(ctx, e.find(), opt, time.Now)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("interrupted flush: %v, want context.Canceled", err)
		}
		if res.Read != n/3 || res.Sent != n/3 || len(res.Kept) != 0 {
			t.Fatalf("interrupted flush: %+v; want %d read and sent", res, n/3)
		}
		e.WaitQueueLen(a, n/3, 30*time.Second)
		e.WaitQueueLen(e.delayQueue(10*time.Minute), n-n/3, 30*time.Second)
		lost, dup := account(n, e.take(a), e.take(e.delayQueue(10*time.Minute)))
		t.Logf("%s: flush of %d interrupted after %d read: %d sent back, lost %d, duplicates %d", queueType, n, res.Read, res.Sent, lost, dup)
		if lost != 0 || dup != 0 {
			t.Errorf("lost %d, duplicates %d; want none", lost, dup)
		}
	})
}

// account returns how many of the ids "0".."n-1" none of the sets holds,
// and how many more copies they hold than distinct ids.
func account(n int, sets ...map[string]amqp.Delivery) (lost, duplicates int) {
	seen := map[string]int{}
	for _, s := range sets {
		for id := range s {
			seen[id]++
		}
	}
	for i := range n {
		switch c := seen[fmt.Sprint(i)]; {
		case c == 0:
			lost++
		case c > 1:
			duplicates += c - 1
		}
	}
	return lost, duplicates
}

// TestFlushManyWindows flushes eight windows of waiting copies and one
// more, half of them sent back to their origin, half put back for their
// remaining time, and checks that none is lost nor doubled. Run with -v
// for the time it took; REBOUND_MEASURE_N=10000 times a larger flush.
func TestFlushManyWindows(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType, nil)
		a, b := e.app("a"), e.app("b")
		n := brokertest.MeasureCount("REBOUND_MEASURE_N", 8*moveWindow+2)
		n -= n % 2 // half to each origin
		// Due long after the test's end, however slowly a loaded machine
		// runs it: a copy already due when the flush reads it stays where
		// it is, and one put back for a short remaining time would reach
		// its origin before it is counted (a flush of 10 000 can take
		// minutes on a loaded machine).
		due := time.Now().Add(40 * time.Minute)
		ws := make([]waiting, n)
		for i := range ws {
			origin := a
			if i%2 == 1 {
				origin = b
			}
			ws[i] = waiting{id: fmt.Sprint(i), origin: origin, delay: 50 * time.Minute, due: due}
		}
		e.seed(ws...)
		e.WaitQueueLen(e.delayQueue(50*time.Minute), n, time.Minute)
		queues := e.find()
		start := time.Now()
		res, err := e.dp.Move(context.Background(), queues, matching(Flush, `^`+regexp.QuoteMeta(a)+`$`), time.Now)
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if res.Read != n || res.Sent != n/2 || res.Redelayed != n/2 {
			t.Fatalf("flush: %+v", res)
		}
		e.WaitQueueLen(a, n/2, time.Minute)
		sets := []map[string]amqp.Delivery{e.take(a)}
		for _, q := range e.find() {
			e.WaitQueueLen(q.Name, q.Messages, time.Minute)
			sets = append(sets, e.take(q.Name))
		}
		lost, dup := account(n, sets...)
		t.Logf("%s: flush of %d copies (%d sent back, %d put back for their remaining time) took %s (%.0f copies/s): lost %d, duplicates %d",
			queueType, n, res.Sent, res.Redelayed, took.Round(time.Millisecond), float64(n)/took.Seconds(), lost, dup)
		if lost != 0 || dup != 0 {
			t.Errorf("lost %d, duplicates %d; want none", lost, dup)
		}
	})
}

// TestReadingQuorumCopiesOftenDropsNothing: reading a quorum queue's
// message counts as a delivery when it goes back by a closed channel, and
// on RabbitMQ 4.x a quorum queue dead-letters a message past its
// delivery limit (20 by default; a delay queue's go to their origin,
// early). `rebound delayed` returns what it leaves with a nack, which
// 4.x does not count: 21 dry runs and 21 interrupted flushes over the
// same copies (each read 21 or 42 times, past the limit) leave every one
// waiting in its queue, none early in its origin.
func TestReadingQuorumCopiesOftenDropsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "quorum", nil)
	a := e.app("a")
	const n = 20
	ws := make([]waiting, n)
	for i := range ws {
		ws[i] = waiting{id: fmt.Sprint(i), origin: a, delay: 10 * time.Minute} // no due time: left in place
		if i%2 == 0 {
			ws[i].due = time.Now().Add(8 * time.Minute) // would be put back: matched by the dry runs only
		}
	}
	e.seed(ws...)
	queue := e.delayQueue(10 * time.Minute)
	e.WaitQueueLen(queue, n, 30*time.Second)
	queues := []Queue{{Name: queue, Delay: 10 * time.Minute, Messages: n}}
	for i := range 21 {
		res, err := e.dp.Move(context.Background(), queues, Options{Op: Flush, Origins: regexp.MustCompile(`.`), DryRun: true}, time.Now)
		if err != nil || res.Read != n {
			t.Fatalf("dry run %d: %+v, %v; want all %d read", i, res, err, n)
		}
		// Left in place, and interrupted half-way.
		ctx, cancel := context.WithCancel(context.Background())
		opt := Options{Op: Flush, Origins: regexp.MustCompile(`^nothing$`), Progress: func(p Progress) {
			if p.Read == n/2 {
				cancel()
			}
		}}
		onlyOld := []Queue{{Name: queue, Delay: 10 * time.Minute, Messages: n}}
		res, err = e.dp.Move(ctx, onlyOld, opt, func() time.Time { return time.Now().Add(time.Hour) }) // all due by then: none put back
		cancel()
		if !errors.Is(err, context.Canceled) || res.Read != n/2 || res.Redelayed != 0 {
			t.Fatalf("interrupted run %d: %+v, %v; want %d read, none moved", i, res, err, n/2)
		}
		e.WaitQueueLen(queue, n, 30*time.Second)
	}
	if got := e.QueueLen(a); got != 0 {
		t.Errorf("%d copies reached their origin early", got)
	}
	waiting := e.take(queue)
	lost, dup := account(n, waiting)
	t.Logf("after 21 dry runs and 21 interrupted runs over %d quorum copies: lost %d, duplicates %d, x-delivery-count of copy 0: %v",
		n, lost, dup, waiting["0"].Headers["x-delivery-count"])
	if lost != 0 || dup != 0 {
		t.Errorf("lost %d, duplicates %d; want none", lost, dup)
	}
}

// TestSurveyCountsWithoutMoving: what a person sees before flushing or
// cancelling: the copies waiting per origin queue, most first, when they
// are due (earliest, latest, and in windows of a minute, ten minutes, an
// hour...), how many do not say; every copy stays where it was, and a
// delay queue deleted since it was found is passed over. Classic and
// quorum delay queues.
func TestSurveyCountsWithoutMoving(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType, nil)
		a, b := e.app("a"), e.app("b")
		now := time.Now()
		e.seed(
			waiting{id: "a0", origin: a, delay: 10 * time.Minute, due: now.Add(30 * time.Second)},
			waiting{id: "a1", origin: a, delay: 10 * time.Minute, due: now.Add(5 * time.Minute)},
			waiting{id: "a2", origin: a, delay: 10 * time.Minute, due: now.Add(6 * time.Minute)},
			waiting{id: "b0", origin: b, delay: time.Hour, due: now.Add(50 * time.Minute)},
			waiting{id: "b-old", origin: b, delay: 20 * time.Minute}, // no due time: an older rebound's
		)
		held := map[string]int{e.delayQueue(10 * time.Minute): 3, e.delayQueue(time.Hour): 1, e.delayQueue(20 * time.Minute): 1}
		for q, n := range held {
			e.WaitQueueLen(q, n, 10*time.Second)
		}
		gone := Queue{Name: e.delayQueue(7 * time.Minute), Delay: 7 * time.Minute, Messages: 4}

		s, err := e.dp.Survey(context.Background(), append(e.find(), gone), now)
		if err != nil {
			t.Fatal(err)
		}
		want := []originWaiting{
			{Origin: a, Count: 3, Earliest: now.Add(30 * time.Second), Latest: now.Add(6 * time.Minute), Due: [5]int{1, 2, 0, 0, 0}},
			{Origin: b, Count: 2, NoDueTime: 1, Earliest: now.Add(50 * time.Minute), Latest: now.Add(50 * time.Minute), Due: [5]int{0, 0, 1, 0, 0}},
		}
		if s.Read != 5 || len(s.Origins) != len(want) {
			t.Fatalf("survey: %+v; want 5 copies read of 2 origins", s)
		}
		for i, w := range want {
			got := s.Origins[i]
			if got.Origin != w.Origin || got.Count != w.Count || got.NoDueTime != w.NoDueTime || got.Due != w.Due ||
				!got.Earliest.Equal(w.Earliest.Truncate(time.Millisecond)) || !got.Latest.Equal(w.Latest.Truncate(time.Millisecond)) {
				t.Errorf("origin %d: %+v, want %+v", i, got, w)
			}
		}
		for q, n := range held {
			e.WaitQueueLen(q, n, 10*time.Second)
		}
		if e.QueueLen(a) != 0 || e.QueueLen(b) != 0 {
			t.Error("the survey sent copies to their origin")
		}
	})
}

// TestMoveWaitsForTheLockThenSaysWhoHoldsIt: while another rebound holds
// the lock of the delay queues (a replica sweeping, another flush), a
// flush waits for it up to its LockWait, then gives up saying so,
// having moved nothing; a flush whose context ends while it waits says
// so at once; once the lock is free, the flush runs.
func TestMoveWaitsForTheLockThenSaysWhoHoldsIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic", nil)
	a := e.app("a")
	e.seed(waiting{id: "a0", origin: a, delay: 10 * time.Minute, due: time.Now().Add(5 * time.Minute)})
	queues := e.find()
	release, err := delayqueue.Lock(context.Background(), e.Broker.Dial(t, e.Broker.URL), e.topo, 0)
	if err != nil {
		t.Fatal(err)
	}
	flush := matching(Flush, `^`+regexp.QuoteMeta(a)+`$`)

	dp := e.dp
	dp.LockWait = 500 * time.Millisecond
	start := time.Now()
	res, err := dp.Move(context.Background(), queues, flush, time.Now)
	if took := time.Since(start); err == nil || !strings.Contains(err.Error(), "holds the lock") || res.Read != 0 || took < dp.LockWait {
		t.Errorf("flush while locked: %+v, %v after %s; want the lock held by another after waiting %s, nothing read", res, err, took, dp.LockWait)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dp.LockWait = time.Minute
	if _, err := dp.Move(ctx, queues, flush, time.Now); !errors.Is(err, context.Canceled) {
		t.Errorf("flush interrupted while waiting for the lock: %v, want context.Canceled", err)
	}
	e.WaitQueueLen(e.delayQueue(10*time.Minute), 1, 10*time.Second)

	if err := release(); err != nil {
		t.Fatal(err)
	}
	if res, err := dp.Move(context.Background(), queues, flush, time.Now); err != nil || res.Sent != 1 {
		t.Fatalf("flush once the lock is free: %+v, %v; want a0 sent", res, err)
	}
	e.WaitQueueLen(a, 1, 10*time.Second)
}

// TestFlushKeepsWhatTheOriginRefuses: a flush into an origin queue that
// is full (reject-publish) keeps the copy waiting in its delay queue and
// says why; a delay queue deleted since it was found (a replica swept it)
// is passed over.
func TestFlushKeepsWhatTheOriginRefuses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic", nil)
	full := e.Prefix + "full"
	e.Declare(full, amqp.Table{"x-max-length": int64(1), "x-overflow": "reject-publish"})
	e.Publish(full, amqp.Publishing{MessageId: "filler"})
	e.seed(waiting{id: "f0", origin: full, delay: 10 * time.Minute, due: time.Now().Add(5 * time.Minute)})
	queue := e.delayQueue(10 * time.Minute)
	e.WaitQueueLen(queue, 1, 10*time.Second)
	gone := Queue{Name: e.delayQueue(7 * time.Minute), Delay: 7 * time.Minute, Messages: 1}

	res, err := e.dp.Move(context.Background(), append(e.find(), gone), matching(Flush, `full$`), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if res.Read != 1 || res.Matched != 1 || res.Sent != 0 || len(res.Kept) != 1 ||
		res.Kept[0] != (Kept{Queue: queue, ID: "f0", Origin: full, Why: republisher.Nacked.Why()}) {
		t.Fatalf("flush into a full queue: %+v; want f0 kept, nacked", res)
	}
	e.WaitQueueLen(queue, 1, 10*time.Second)
	if n := e.QueueLen(full); n != 1 {
		t.Errorf("the full queue holds %d, want its filler alone", n)
	}
}
