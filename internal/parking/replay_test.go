package parking

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/policy"
)

// Tests of paced and canary replays, on a brokertest.Deployment.

// newParked returns a deployment with its fixed queues declared and its
// parking Queue.
func newParked(t *testing.T) (*brokertest.Deployment, Queue) {
	t.Helper()
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	cfg, err := config.Load(d.Environ())
	if err != nil {
		t.Fatal(err)
	}
	q := Queue{Conn: b.Dial(t, d.URL()), PubConn: b.Dial(t, d.URL()), Router: cfg.Router()}
	q.Router.Topology = q.Router.Topology.ForServer(q.Conn.Properties)
	if _, err := declarer.Declare(q.Conn, q.Router.Topology); err != nil {
		t.Fatal(err)
	}
	return d, q
}

// park publishes messages parked as the sidecar parks them (Codec.Park),
// origin d's application queue, ids prefix0, prefix1, ..., and waits for
// the broker's confirms.
func park(d *brokertest.Deployment, q Queue, prefix string, n int, at time.Time) {
	d.T.Helper()
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		s := headers.State{State: policy.State{Retries: 10, StartedAt: at.Add(-time.Hour)}, Origin: d.App}
		h := q.Router.Codec.Park(amqp.Table{"tenant": "acme"}, s, policy.MaxRetries, at)
		id := fmt.Sprintf("%s%d", prefix, i)
		msgs[i] = amqp.Publishing{MessageId: id, Headers: h, Body: []byte("body of " + id)}
	}
	d.Publish(q.Name(), msgs...)
}

// TestReplayHoldsItsRate: a replay with --rate sends no faster than the
// rate (the time it takes is at least what the rate allows; how much
// longer depends on the machine, so it is logged, not asserted). Run with
// -v for the figure.
func TestReplayHoldsItsRate(t *testing.T) {
	t.Parallel()
	d, q := newParked(t)
	const n, rate = 1000, 500.0
	park(d, q, "m", n, time.Now())
	d.WaitQueueLen(q.Name(), n, 30*time.Second)
	start := time.Now()
	res, err := q.ReplayWith(context.Background(), Filter{}, time.Now(), ReplayOptions{Rate: rate})
	took := time.Since(start)
	if err != nil || res.Replayed != n {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	if least := time.Duration(float64(n-1) / rate * float64(time.Second)); took < least {
		t.Errorf("%d messages at --rate %g took %s, less than the %s the rate allows", n, rate, took, least)
	}
	t.Logf("replay of %d messages at --rate %g: %s, %.1f messages a second (%.1f from the first copy to the last confirm)",
		n, rate, took.Round(time.Millisecond), float64(n)/took.Seconds(), float64(n)/res.Took.Seconds())
	d.WaitQueueLen(d.App, n, 30*time.Second)
}

// TestCanaryStopsOnAMessageThatComesBackParked: one of the canaries comes
// back parked while the replay watches (its consumer rejects it again and
// the sidecar parks it): the replay stops there and replays nothing more.
func TestCanaryStopsOnAMessageThatComesBackParked(t *testing.T) {
	t.Parallel()
	d, q := newParked(t)
	park(d, q, "m", 10, time.Now().Add(-time.Minute))
	d.WaitQueueLen(q.Name(), 10, 30*time.Second)
	done := make(chan CanaryResult, 1)
	errs := make(chan error, 1)
	go func() {
		res, err := q.ReplayCanary(context.Background(), Filter{}, 2, time.Minute, 20*time.Millisecond, time.Now, ReplayOptions{}, nil)
		done <- res
		errs <- err
	}()
	// The consumer fails one canary again, and the sidecar parks it.
	canary := d.Get(d.App, 30*time.Second)
	s := headers.State{State: policy.State{Retries: 10, StartedAt: time.Now()}, Origin: d.App}
	d.Publish(q.Name(), amqp.Publishing{MessageId: canary.MessageId, Body: canary.Body,
		Headers: q.Router.Codec.Park(canary.Headers, s, policy.MaxRetries, time.Now())})
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
	d.WaitQueueLen(q.Name(), 9, 30*time.Second)
	d.WaitQueueLen(d.App, 1, 30*time.Second)
}

// TestCanaryGoesOnWhenNoneComesBack: when no canary comes back parked
// within the wait, the replay goes on with the rest, leaving what was
// parked since the canaries went out.
func TestCanaryGoesOnWhenNoneComesBack(t *testing.T) {
	t.Parallel()
	d, q := newParked(t)
	park(d, q, "m", 10, time.Now().Add(-time.Minute))
	d.WaitQueueLen(q.Name(), 10, 30*time.Second)
	late := func(ReplayResult) { park(d, q, "late", 1, time.Now()) } // a new failure while the canaries are watched
	res, err := q.ReplayCanary(context.Background(), Filter{}, 3, time.Second, 20*time.Millisecond, time.Now, ReplayOptions{Rate: 100}, late)
	if err != nil {
		t.Fatal(err)
	}
	if res.Canaries.Replayed != 3 || len(res.Back) != 0 || res.Rest.Replayed != 7 || res.Watched < time.Second {
		t.Fatalf("canary: %+v, watched %s, back %v, rest %+v", res.Canaries, res.Watched, res.Back, res.Rest)
	}
	d.WaitQueueLen(d.App, 10, 30*time.Second)
	d.WaitQueueLen(q.Name(), 1, 30*time.Second)
	if m := d.Get(q.Name(), 10*time.Second); m.MessageId != "late0" {
		t.Errorf("left parked: %s, want late0", m.MessageId)
	}
}
