package consumer

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/policy"
)

// TestBudgetKeepsDeadlineCopiesOnTheGrid: a copy the retry rate budget
// sends at its policy's deadline, over budget, goes through a delay queue
// of the policy's precision (the one just before the deadline), not one
// named after the deadline's exact millisecond: a storm would otherwise
// leave thousands of delay queues, which `rebound delayed` could not find.
func TestBudgetKeepsDeadlineCopiesOnTheGrid(t *testing.T) {
	p := policy.Policy{Backoff: policy.Constant, MinDelay: 10 * time.Second, MaxDelay: 10 * time.Second, Jitter: policy.NoJitter,
		MaxDuration: time.Hour, Deadline: policy.Clamp, RetryRate: 1}
	r := route.Router{Policies: policy.NewSet(p), Codec: headers.NewCodec(headers.DefaultNames())}
	reg := prometheus.NewRegistry()
	s := New(Options{Router: r, Logger: zap.NewNop(), Metrics: NewMetrics(reg, r)})
	ss := &session{s: s}
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	// 10.623s of the budget left: one copy a second fits at 10s, the rest
	// are over budget, at the deadline.
	st := headers.State{State: policy.State{StartedAt: now.Add(-time.Hour + 10623*time.Millisecond)}}
	remaining := p.Remaining(st.State, now)
	for i := range 5 {
		rt := route.Route{Origin: route.Origin{Queue: "orders"}, Policy: r.Policies.Default(),
			Decision: policy.Decision{Retry: true, Delay: 10 * time.Second, Drawn: 10 * time.Second}}
		d := ss.budget(rt, st, now).Decision.Delay
		if policy.Round(d, p.Digits()) != d || d > remaining || d < 10*time.Second {
			t.Errorf("copy %d: delay %v; want one a delay queue of %d digits holds, from 10s to the deadline (%v)", i, d, p.Digits(), remaining)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	overflow := -1.0
	for _, f := range families {
		if f.GetName() == "rebound_retry_rate_overflow_total" {
			overflow = f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if overflow != 4 {
		t.Errorf("%v copies over budget, want 4", overflow)
	}
}

// TestShareIgnoresAMomentWithoutAConsumer: the share divides by the
// largest consumer count read within consumerMemory, so a reading taken
// while another replica replaces its consumer (one fewer for a moment)
// does not raise this replica's share; a replica that joins lowers it at
// once, and one that left raises it once consumerMemory has passed.
func TestShareIgnoresAMomentWithoutAConsumer(t *testing.T) {
	p := policy.Policy{Backoff: policy.Constant, MinDelay: time.Second, MaxDelay: time.Second, Jitter: policy.NoJitter,
		MaxDuration: time.Hour, RetryRate: 60}
	r := route.Router{Policies: policy.NewSet(p), Codec: headers.NewCodec(headers.DefaultNames())}
	start := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	s := New(Options{Router: r, Logger: zap.NewNop(), Metrics: NewMetrics(prometheus.NewRegistry(), r), Now: func() time.Time { return start }})
	named := r.Policies.Default()
	for _, step := range []struct {
		after     time.Duration
		consumers int
		share     float64
	}{
		{0, 2, 30},
		{inboxEvery, 1, 30}, // the other replica between two consumers
		{2 * inboxEvery, 3, 20},
		{3 * inboxEvery, 2, 20},                  // the third left: not yet
		{3*inboxEvery + consumerMemory, 2, 30},   // now
		{4*inboxEvery + consumerMemory, 0, 30},   // a reading of none: this replica counts
		{4*inboxEvery + 2*consumerMemory, 0, 60}, // alone for consumerMemory
	} {
		s.setConsumers(step.consumers, start.Add(step.after))
		if got := s.share(named); got != step.share {
			t.Errorf("after %v, %d consumers read: share %v, want %v", step.after, step.consumers, got, step.share)
		}
	}
}
