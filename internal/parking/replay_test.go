package parking

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/policy"
)

// Tests of paced and canary replays, with the copies going out on a
// connection of their own as `rebound parked replay` sends them.

// newReplaying is newEnv on a classic parking queue whose replays publish
// on a connection of their own.
func newReplaying(t *testing.T) *env {
	t.Helper()
	e := newEnv(t, false)
	e.q.PubConn = e.Broker.Dial(t, e.Broker.URL)
	return e
}

// TestReplayHoldsItsRate: a replay with --rate sends no faster than the
// rate (the time it takes is at least what the rate allows; how much
// longer depends on the machine, so it is logged, not asserted). Run with
// -v for the figure.
func TestReplayHoldsItsRate(t *testing.T) {
	t.Parallel()
	e := newReplaying(t)
	const n, rate = 1000, 500.0
	e.park("m", n, time.Now())
	e.WaitQueueLen(e.q.Name(), n, 30*time.Second)
	start := time.Now()
	res, err := e.q.ReplayWith(context.Background(), Filter{}, time.Now(), ReplayOptions{Rate: rate})
	took := time.Since(start)
	if err != nil || res.Replayed != n {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	if least := time.Duration(float64(n-1) / rate * float64(time.Second)); took < least {
		t.Errorf("%d messages at --rate %g took %s, less than the %s the rate allows", n, rate, took, least)
	}
	t.Logf("replay of %d messages at --rate %g: %s, %.1f messages a second (%.1f from the first copy to the last confirm)",
		n, rate, took.Round(time.Millisecond), float64(n)/took.Seconds(), float64(n)/res.Took.Seconds())
	e.WaitQueueLen(e.App, n, 30*time.Second)
}

// TestCanaryStopsOnAMessageThatComesBackParked: one of the canaries comes
// back parked while the replay watches (its consumer rejects it again and
// the sidecar parks it): the replay stops there and replays nothing more.
func TestCanaryStopsOnAMessageThatComesBackParked(t *testing.T) {
	t.Parallel()
	e := newReplaying(t)
	e.park("m", 10, time.Now().Add(-time.Minute))
	e.WaitQueueLen(e.q.Name(), 10, 30*time.Second)
	done := make(chan CanaryResult, 1)
	errs := make(chan error, 1)
	go func() {
		res, err := e.q.ReplayCanary(context.Background(), Filter{}, 2, time.Minute, 20*time.Millisecond, time.Now, ReplayOptions{}, nil)
		done <- res
		errs <- err
	}()
	// The consumer fails one canary again, and the sidecar parks it.
	canary := e.Get(e.App, 30*time.Second)
	s := headers.State{State: policy.State{Retries: 10, StartedAt: time.Now()}, Origin: e.App}
	e.Publish(e.q.Name(), amqp.Publishing{MessageId: canary.MessageId, Body: canary.Body,
		Headers: e.q.Router.Codec.Park(canary.Headers, s, policy.MaxRetries, time.Now())})
	if err := canary.Ack(false); err != nil {
		t.Fatal(err)
	}
	var res CanaryResult
	select {
	case res = <-done:
	case <-time.After(50 * time.Second):
		t.Fatal("the canary replay did not stop within 50s of a canary coming back parked")
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if res.Canaries.Replayed != 2 || len(res.Back) != 1 || res.Back[0].ID() != canary.MessageId || res.Rest.Replayed != 0 {
		t.Fatalf("canary: %+v, back %v", res.Canaries, res.Back)
	}
	// 8 never replayed and the one back; the other canary in the app queue.
	e.WaitQueueLen(e.q.Name(), 9, 30*time.Second)
	e.WaitQueueLen(e.App, 1, 30*time.Second)
}

// TestCanaryGoesOnWhenNoneComesBack: when no canary comes back parked
// within the wait, the replay goes on with the rest, leaving what was
// parked since the canaries went out.
func TestCanaryGoesOnWhenNoneComesBack(t *testing.T) {
	t.Parallel()
	e := newReplaying(t)
	e.park("m", 10, time.Now().Add(-time.Minute))
	e.WaitQueueLen(e.q.Name(), 10, 30*time.Second)
	late := func(ReplayResult) { e.park("late", 1, time.Now()) } // a new failure while the canaries are watched
	res, err := e.q.ReplayCanary(context.Background(), Filter{}, 3, time.Second, 20*time.Millisecond, time.Now, ReplayOptions{Rate: 100}, late)
	if err != nil {
		t.Fatal(err)
	}
	if res.Canaries.Replayed != 3 || len(res.Back) != 0 || res.Rest.Replayed != 7 || res.Watched < time.Second {
		t.Fatalf("canary: %+v, watched %s, back %v, rest %+v", res.Canaries, res.Watched, res.Back, res.Rest)
	}
	e.WaitQueueLen(e.App, 10, 30*time.Second)
	e.WaitQueueLen(e.q.Name(), 1, 30*time.Second)
	if m := e.Get(e.q.Name(), 10*time.Second); m.MessageId != "late0" {
		t.Errorf("left parked: %s, want late0", m.MessageId)
	}
}

// TestCanaryWithinItsLimits: a canary replay that finds nothing to
// replay says so and watches nothing; one interrupted while it watches
// (Ctrl-C) stops with the canaries out and the rest still parked; the
// filter's limit counts the canaries, so the rest is the limit less them,
// and none when the canaries took it all.
func TestCanaryWithinItsLimits(t *testing.T) {
	t.Parallel()
	e := newReplaying(t)
	e.park("m", 10, time.Now().Add(-time.Minute))
	e.WaitQueueLen(e.q.Name(), 10, 30*time.Second)
	canary := func(ctx context.Context, f Filter, k int, announce func(ReplayResult)) (CanaryResult, error) {
		return e.q.ReplayCanary(ctx, f, k, 200*time.Millisecond, 20*time.Millisecond, time.Now, ReplayOptions{}, announce)
	}

	res, err := canary(context.Background(), Filter{Origin: "nowhere"}, 2, nil)
	if !errors.Is(err, errNoCanary) || res.Canaries.Matched != 0 {
		t.Errorf("canary with no match: %+v, %v; want errNoCanary", res, err)
	}
	e.WaitQueueLen(e.q.Name(), 10, 30*time.Second)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, err = canary(ctx, Filter{}, 2, func(ReplayResult) { cancel() })
	if !errors.Is(err, context.Canceled) || res.Canaries.Replayed != 2 || res.Rest.Replayed != 0 {
		t.Errorf("canary interrupted while watching: %+v, %v; want 2 canaries out, nothing more, context.Canceled", res, err)
	}
	e.WaitQueueLen(e.q.Name(), 8, 30*time.Second)

	for _, tc := range []struct {
		limit, k, rest, left int
	}{
		{3, 2, 1, 5}, // the limit less the canaries
		{2, 5, 0, 3}, // the canaries took the limit
	} {
		res, err := canary(context.Background(), Filter{Limit: tc.limit}, tc.k, nil)
		if err != nil || res.Canaries.Replayed != min(tc.k, tc.limit) || res.Rest.Replayed != tc.rest {
			t.Errorf("canary %d within a limit of %d: %+v, %v; want %d canaries and %d more", tc.k, tc.limit, res, err, min(tc.k, tc.limit), tc.rest)
		}
		e.WaitQueueLen(e.q.Name(), tc.left, 30*time.Second)
	}
	e.WaitQueueLen(e.App, 7, 30*time.Second)
}
