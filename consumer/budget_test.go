package consumer

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/calendar"
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
		MaxDuration: time.Hour, Deadline: "clamp", RetryRate: 1}
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
		if p.RoundDown(d) != d || d > remaining || d < 10*time.Second {
			t.Errorf("copy %d: delay %v; want one a delay queue of its policy holds, from 10s to the deadline (%v)", i, d, remaining)
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

// TestShareIgnoresAMomentWithoutAConsumer: a lower consumer count is taken
// on the second reading in a row that shows it, so that a reading taken
// while another replica replaces its consumer (one fewer for a moment)
// does not raise this replica's share; a replica that joins lowers it at
// the first reading, one that left raises it at the second; the place
// among the replicas goes with the share.
func TestShareIgnoresAMomentWithoutAConsumer(t *testing.T) {
	p := policy.Policy{Backoff: policy.Constant, MinDelay: time.Second, MaxDelay: time.Second, Jitter: policy.NoJitter,
		MaxDuration: time.Hour, RetryRate: 60}
	r := route.Router{Policies: policy.NewSet(p), Codec: headers.NewCodec(headers.DefaultNames())}
	s := New(Options{Router: r, Logger: zap.NewNop(), Metrics: NewMetrics(prometheus.NewRegistry(), r)})
	named := r.Policies.Default()
	for i, step := range []struct {
		consumers int
		share     float64
	}{
		{2, 30},
		{1, 30}, // the other replica between two consumers
		{2, 30},
		{3, 20}, // a third joined
		{2, 20}, // and left, or a moment without its consumer
		{3, 20}, // a moment
		{2, 20},
		{2, 30}, // left
		{0, 30}, // a reading of none: this replica counts
		{0, 60},
		{4, 15},
		{2, 15},
		{3, 20}, // two lower readings: the larger of them
	} {
		s.setConsumers(step.consumers)
		if got := s.share(named).PerSecond(); got != step.share {
			t.Errorf("reading %d, %d consumers: share %v, want %v", i, step.consumers, got, step.share)
		}
	}
	s.setPlace(2)
	if sh := s.share(named); sh.Index != 2 || sh.Replicas != 3 || sh.Rate != 60 {
		t.Errorf("share %+v, want rate 60 over 3 replicas at place 2", sh)
	}
}

// TestDeferralLogForgetsQuietOrigins: a storm logs one deferral line per
// origin a minute, and the log of which origins it has logged for stays
// within calendar.MaxOrigins: once full, it forgets those it has not
// logged for a minute, and keeps those it has.
func TestDeferralLogForgetsQuietOrigins(t *testing.T) {
	var l deferralLog
	start := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for i := range calendar.MaxOrigins - 1 {
		if !l.first(fmt.Sprint("quiet", i), start) {
			t.Fatalf("origin %d: not logged the first time", i)
		}
	}
	later := start.Add(30 * time.Second)
	if !l.first("busy", later) {
		t.Fatal("busy: not logged the first time")
	}
	if l.first("busy", later.Add(59*time.Second)) || l.first("quiet0", later) {
		t.Error("an origin logged again within its minute")
	}
	if len(l.last) != calendar.MaxOrigins {
		t.Fatalf("remembers %d origins, want %d", len(l.last), calendar.MaxOrigins)
	}
	// A minute after the quiet ones: full, it forgets them, not busy.
	if !l.first("new", start.Add(time.Minute)) {
		t.Error("new: not logged the first time")
	}
	if _, ok := l.last["busy"]; !ok || len(l.last) != 2 {
		t.Errorf("remembers %d origins (busy kept: %v), want busy and new", len(l.last), ok)
	}
	if !l.first("quiet0", start.Add(time.Minute)) {
		t.Error("a forgotten origin is not logged again")
	}
}
