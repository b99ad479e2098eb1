package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/topology"
)

// A storm: N messages in an application queue, rejected at once by its
// consumer, which rejects every retry too, so that their retries come
// back as fast as the policy spreads them, until rebound parks them. It
// runs without a retry rate budget and with one (REBOUND_RETRY_RATE), and
// counts the retries arriving back in the application queue each second.

// stormRetries is REBOUND_MAX_RETRIES of the storm's short policy:
// exponential from 1 s (the default), full jitter (the default), so the
// retries of a message come due within 1, 2 and 4 s of its failures.
const stormRetries = 3

// The storm's tolerance. The calendar's promise is exact: the copies'
// due seconds (x-retry-due-at) hold at most the cap. Arrivals are counted
// by the wall-clock second they land in, and a second's copies arrive
// together, in a burst (rounded delays keep the sub-second phase of the
// failures they follow): when the hops back (the delay queue hands a copy
// back when its TTL ends at the head of the queue) push a burst across a
// second's boundary, it lands in the next second with that one's. So any
// w consecutive seconds may hold up to w + 1 seconds' worth: at most
// stormSecondTolerance × the cap in one second, and
// stormWindowTolerance × the cap a second over stormWindow seconds.
const (
	stormSecondTolerance = 2.0
	stormWindow          = 5
	stormWindowTolerance = 1.2 // (stormWindow + 1) / stormWindow
)

// stormResult is one storm.
type stormResult struct {
	Rate    int // REBOUND_RETRY_RATE; 0 for no cap
	N       int // messages
	Retries int // retries that arrived back
	// Arrived counts the retries arriving in the application queue in
	// each wall-clock second, from the first retry's to the last's.
	Arrived []int
	// Due counts the copies by the second their x-retry-due-at falls in.
	Due  []int
	Span time.Duration // from the first retry's arrival to the last's
	// Late is how long after its x-retry-due-at each retry arrived,
	// sorted: the hops back, dead-lettering from the delay queue included.
	Late               []time.Duration
	Deferred, Overflow int           // rebound_retry_rate_deferred_total, _overflow_total
	Elapsed            time.Duration // from the first rejection to every message parked
}

// holds reports whether a capped storm kept to its cap within the
// tolerance.
func (r stormResult) holds() bool {
	if r.Rate <= 0 {
		return false
	}
	return slices.Max(r.Due) <= r.Rate && float64(slices.Max(r.Arrived)) <= stormSecondTolerance*float64(r.Rate) &&
		float64(brokertest.BusiestWindow(r.Arrived, stormWindow)) <= stormWindowTolerance*float64(stormWindow*r.Rate)
}

// stormCounts is the distribution of a storm's retries per second over
// its span: the peak second, the peak over stormWindow seconds (as a rate)
// and the median and 90th percentile of the seconds.
func stormCounts(counts []int) (peak int, window, p50, p90 float64) {
	if len(counts) == 0 {
		return 0, 0, 0, 0
	}
	xs := make([]float64, len(counts))
	for i, c := range counts {
		xs[i] = float64(c)
	}
	slices.Sort(xs)
	at := func(p float64) float64 { return xs[min(int(p*float64(len(xs))), len(xs)-1)] }
	return slices.Max(counts), float64(brokertest.BusiestWindow(counts, stormWindow)) / float64(min(stormWindow, len(counts))), at(0.5), at(0.9)
}

// perSecond counts times by the wall-clock second they fall in, from the
// earliest's to the latest's.
func perSecond(times []time.Time) []int {
	if len(times) == 0 {
		return []int{0}
	}
	first := slices.MinFunc(times, func(a, b time.Time) int { return a.Compare(b) }).Truncate(time.Second)
	var counts []int
	for _, at := range times {
		i := int(at.Sub(first) / time.Second)
		for len(counts) <= i {
			counts = append(counts, 0)
		}
		counts[i]++
	}
	return counts
}

// arrival is one delivery to the storm's application.
type arrival struct {
	at     time.Time
	id     string
	retry  int64     // x-retry-count; 0 for the first delivery
	dueAt  time.Time // x-retry-due-at, when hasDue
	hasDue bool
}

// measureStorms runs the storm without a cap, then with rate.
func measureStorms(ctx context.Context, b *broker, n, rate int, stdout io.Writer) ([]stormResult, error) {
	var out []stormResult
	for _, r := range []int{0, rate} {
		res, err := runStorm(ctx, b, n, r, stdout)
		if err != nil {
			return out, err
		}
		fmt.Fprintln(stdout, res.line())
		out = append(out, res)
	}
	return out, nil
}

func (r stormResult) line() string {
	peak, window, p50, p90 := stormCounts(r.Arrived)
	return fmt.Sprintf("storm: %d messages, %s: %d retries back in %s; per second peak %d, over %d s %.0f, p50 %.0f, p90 %.0f; due per second peak %d; arrived after due %s; deferred %d, overflow %d; all parked after %s",
		r.N, r.capName(), r.Retries, r.Span.Round(100*time.Millisecond), peak, stormWindow, window, p50, p90, slices.Max(r.Due),
		r.lateness(), r.Deferred, r.Overflow, r.Elapsed.Round(100*time.Millisecond))
}

// lateness is the median, 99th percentile and most of Late.
func (r stormResult) lateness() string {
	if len(r.Late) == 0 {
		return "–"
	}
	return fmt.Sprintf("%s / %s / %s", ms(percentile(r.Late, 0.5)), ms(percentile(r.Late, 0.99)), ms(r.Late[len(r.Late)-1]))
}

// capName says which cap the storm ran with.
func (r stormResult) capName() string {
	if r.Rate <= 0 {
		return "no cap"
	}
	return fmt.Sprintf("REBOUND_RETRY_RATE=%d", r.Rate)
}

// runStorm fills an application queue that dead-letters to rebound with n
// messages, starts rebound with the storm's policy and the cap rate (0
// for none), then an application that rejects every delivery, and waits
// until every message is parked.
func runStorm(ctx context.Context, b *broker, n, rate int, stdout io.Writer) (stormResult, error) {
	res := stormResult{Rate: rate, N: n}
	prefix := fmt.Sprintf("%sstorm%d.", b.prefix, rate)
	defer func() {
		if err := b.sweep(context.Background(), prefix); err != nil {
			fmt.Fprintf(stdout, "could not delete what the storm left (%s*): %v\n", prefix, err)
		}
	}()
	topo := topology.Topology{
		InboxQueue: prefix + "inbox", DeadLetterExchange: prefix + "dlx", DelayExchange: prefix + "delay",
		DelayQueuePrefix: prefix + "delay.", ParkingQueue: prefix + "parked",
	}
	app := prefix + "app"
	if !topology.VersionAtLeast(b.version(), 3, 12) {
		// As deploy/rabbitmq/setup.sh sets it: before 3.12 a classic
		// delay queue hands its copies back late now and then unless lazy.
		unset, err := b.setPolicy(ctx, topo.LazyDelayQueuePolicy("", prefix+"lazy"))
		if err != nil {
			return res, err
		}
		defer unset()
	}
	if err := b.declareTopology(topo); err != nil {
		return res, err
	}
	if err := b.declare(app, amqp.Table{"x-dead-letter-exchange": topo.DeadLetterExchange}); err != nil {
		return res, err
	}
	if err := b.fill(ctx, app, n, func(i int) amqp.Publishing { return message(i, "") }); err != nil {
		return res, err
	}
	// The storm's policy overrides startRebound's constant delay: the
	// last setting of a name wins.
	env := []string{"REBOUND_BACKOFF=exponential", "REBOUND_MIN_DELAY=1s", "REBOUND_JITTER=full",
		"REBOUND_MAX_RETRIES=" + strconv.Itoa(stormRetries)}
	if rate > 0 {
		env = append(env, "REBOUND_RETRY_RATE="+strconv.Itoa(rate))
	}
	r, err := b.startConsuming(ctx, topo, reboundSettings{Delay: time.Second, Env: env})
	if err != nil {
		return res, err
	}
	defer func() { _ = r.stop() }()

	appCtx, stopApp := context.WithCancel(ctx)
	defer stopApp()
	var (
		wg       sync.WaitGroup
		arrivals []arrival
		appErr   error
	)
	wg.Add(1)
	started := time.Now()
	go func() {
		defer wg.Done()
		arrivals, appErr = rejectAll(appCtx, b.url, app)
	}()
	timeout := 2 * time.Minute
	if rate > 0 {
		timeout += time.Duration(n*stormRetries/rate) * time.Second * 3 / 2
	}
	_, waitErr := b.waitFor(ctx, topo.ParkingQueue, 250*time.Millisecond, timeout, func(m, _ int) bool { return m >= n })
	res.Elapsed = time.Since(started)
	stopApp()
	wg.Wait()
	if waitErr != nil {
		return res, fmt.Errorf("storm, %s: not every message parked: %w (%w)", res.capName(), waitErr, errLost)
	}
	if appErr != nil {
		return res, appErr
	}
	if err := r.stop(); err != nil {
		return res, fmt.Errorf("stop rebound: %w", err)
	}
	res.Deferred, res.Overflow = int(r.sum("rebound_retry_rate_deferred_total")), int(r.sum("rebound_retry_rate_overflow_total"))
	var arrived, due []time.Time
	var first, last time.Time
	seen := map[string]int{}
	for _, a := range arrivals {
		seen[a.id]++
		if a.retry == 0 {
			continue
		}
		arrived = append(arrived, a.at)
		if a.hasDue {
			due = append(due, a.dueAt)
			res.Late = append(res.Late, a.at.Sub(a.dueAt))
		}
		if first.IsZero() || a.at.Before(first) {
			first = a.at
		}
		if a.at.After(last) {
			last = a.at
		}
	}
	res.Retries, res.Span = len(arrived), last.Sub(first)
	res.Arrived, res.Due = perSecond(arrived), perSecond(due)
	slices.Sort(res.Late)
	for i := range n {
		if seen[strconv.Itoa(i)] < 1+stormRetries {
			return res, fmt.Errorf("storm, %s: message %d arrived %d times, want %d: %w", res.capName(), i, seen[strconv.Itoa(i)], 1+stormRetries, errLost)
		}
	}
	return res, nil
}

// rejectAll is the storm's application: it consumes queue and rejects
// every delivery (requeue=false, so the broker dead-letters it to
// rebound), noting when each arrived, until ctx is cancelled.
func rejectAll(ctx context.Context, url, queue string) ([]arrival, error) {
	conn, _, deliveries, err := consumeOn(url, queue, 1000, "storm application")
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var out []arrival
	for {
		select {
		case <-ctx.Done():
			return out, nil
		case d, ok := <-deliveries:
			if !ok {
				return out, fmt.Errorf("storm application: deliveries stopped")
			}
			// rebound writes both as long ints.
			a := arrival{at: time.Now(), id: d.MessageId}
			a.retry, _ = d.Headers["x-retry-count"].(int64)
			if ms, ok := d.Headers["x-retry-due-at"].(int64); ok {
				a.dueAt, a.hasDue = time.UnixMilli(ms), true
			}
			out = append(out, a)
			if err := d.Reject(false); err != nil {
				return out, fmt.Errorf("storm application: reject: %w", err)
			}
		}
	}
}

// joinCounts writes per-second counts on one line.
func joinCounts(counts []int) string {
	parts := make([]string, len(counts))
	for i, c := range counts {
		parts[i] = strconv.Itoa(c)
	}
	return strings.Join(parts, " ")
}
