package consumer

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rebound-mq/rebound/internal/route"
)

// Tests of what /healthz and /readyz report, which need no broker.

func TestHealthy(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	s := New(Options{
		Logger: zap.NewNop(), Metrics: NewMetrics(prometheus.NewRegistry(), route.Router{}), ConfirmTimeout: 10 * time.Second,
		Now: func() time.Time { return now },
	})
	// With a 10s confirm timeout, 2m20s without a sign of life is a wedge.
	playHealth(t, s, []healthStep{
		{"just built", func() {}, ""},
		{"2m19s later", func() { now = now.Add(2*time.Minute + 19*time.Second) }, ""},
		{"2m21s later", func() { now = now.Add(2 * time.Second) }, "no progress for 2m21s"},
		{"blocked by a resource alarm", func() { s.setBlocked(true) }, ""},
		{"unblocked", func() { s.setBlocked(false) }, "no progress for 2m21s"},
		{"a sign of life", s.beat, ""},
		{"3m later", func() { now = now.Add(3 * time.Minute) }, "no progress for 3m0s"},
	})
}

// healthStep is one step of a story told to Healthy: what happens, and
// the error Healthy reports after it.
type healthStep struct {
	what string
	do   func()
	want string // "" when healthy
}

// playHealth takes the steps in order and checks Healthy after each.
func playHealth(t *testing.T, s *Sidecar, steps []healthStep) {
	t.Helper()
	for _, step := range steps {
		step.do()
		err := s.Healthy()
		switch {
		case step.want == "" && err != nil:
			t.Errorf("%s: Healthy = %v, want nil", step.what, err)
		case step.want != "" && (err == nil || err.Error() != step.want):
			t.Errorf("%s: Healthy = %v, want %q", step.what, err, step.want)
		}
	}
}

// TestHealthyFailsOnAStall: the consume connection unread for the
// in-flight bytes budget while rebound holds no delivery, longer than a
// heartbeat interval, is a stall a restart cures: /healthz fails. Waiting
// on deliveries rebound holds (an origin's backoff, a slow confirm) is
// not, nor is a resource alarm.
func TestHealthyFailsOnAStall(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	s := New(Options{
		Logger: zap.NewNop(), Metrics: NewMetrics(prometheus.NewRegistry(), route.Router{}), ConfirmTimeout: 10 * time.Second,
		Now: clock,
	})
	m := newMeter(nil, 1000)
	m.now = clock
	s.inboxMeter.Store(m)
	s.stallAfter.Store(int64(30 * time.Second))
	waiting := func(held int64) func() {
		return func() {
			m.mu.Lock()
			m.waitingSince, m.held = now, held
			m.mu.Unlock()
		}
	}
	later := func(d time.Duration) func() { return func() { now = now.Add(d); s.beat() } }
	playHealth(t, s, []healthStep{
		{"reading", func() {}, ""},
		{"waiting, holding deliveries", waiting(2000), ""},
		{"a minute later", later(time.Minute), ""},
		{"waiting, holding nothing", waiting(0), ""},
		{"29s later", later(29 * time.Second), ""},
		{"31s later", later(2 * time.Second), "inbox stalled: the consume connection unread for 31s while rebound holds no delivery"},
		{"blocked by a resource alarm", func() { s.setBlocked(true) }, ""},
		{"unblocked", func() { s.setBlocked(false) }, "inbox stalled: the consume connection unread for 31s while rebound holds no delivery"},
		{"between sessions", func() { s.inboxMeter.Store(nil) }, ""},
	})
}

func TestReadyFollowsSessionAndResourceAlarm(t *testing.T) {
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zap.InfoLevel)
	s := New(Options{Logger: zap.New(core), Metrics: NewMetrics(reg, route.Router{})})
	for _, step := range []struct {
		what           string
		do             func()
		ready, blocked bool
		log            string // logged by this step; "" for none
	}{
		{"built", func() {}, false, false, ""},
		{"consuming", func() { s.setReady(true) }, true, false, ""},
		{"blocked", func() { s.setBlocked(true) }, false, true, "broker blocked publishing (resource alarm); taking no new work until it lifts"},
		{"still blocked", func() { s.setBlocked(true) }, false, true, ""},
		{"unblocked", func() { s.setBlocked(false) }, true, false, "broker unblocked publishing; resuming"},
		{"session over", func() { s.setReady(false) }, false, false, ""},
	} {
		before := logs.Len()
		step.do()
		if s.Ready() != step.ready {
			t.Errorf("%s: Ready = %v, want %v", step.what, s.Ready(), step.ready)
		}
		if got := metricValue(t, reg, "rebound_ready"); got != b2f(step.ready) {
			t.Errorf("%s: rebound_ready = %v, want %v", step.what, got, b2f(step.ready))
		}
		if got := metricValue(t, reg, "rebound_connection_blocked"); got != b2f(step.blocked) {
			t.Errorf("%s: rebound_connection_blocked = %v, want %v", step.what, got, b2f(step.blocked))
		}
		var logged []string
		for _, l := range logs.All()[before:] {
			logged = append(logged, l.Message)
		}
		if want := step.log; (want == "" && len(logged) > 0) || (want != "" && (len(logged) != 1 || logged[0] != want)) {
			t.Errorf("%s: logged %q, want %q", step.what, logged, want)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func TestQuoteShort(t *testing.T) {
	long := strings.Repeat("q", 150)
	for _, tc := range []struct{ in, want string }{
		{"orders", `"orders"`},
		{"", `""`},
		{"line\nbreak", `"line\nbreak"`},
		{strings.Repeat("q", 100), `"` + strings.Repeat("q", 100) + `"`},
		{long, `"` + long[:100] + `"...`},
	} {
		if got := quoteShort(tc.in); got != tc.want {
			t.Errorf("quoteShort(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestHealthyAfterAReconnectLoopEnds: the count of sessions that ended
// soon after connecting fails Healthy while the loop goes on, and stops
// failing it once a session has stayed connected for the churn window,
// though the count resets only when that session ends.
func TestHealthyAfterAReconnectLoopEnds(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	s := New(Options{
		Logger: zap.NewNop(), Metrics: NewMetrics(prometheus.NewRegistry(), route.Router{}), ConfirmTimeout: 10 * time.Second,
		Now: func() time.Time { return now },
	})
	connect := func() { s.connectedAt.Store(now.UnixNano()) }
	playHealth(t, s, []healthStep{
		{"4 short sessions", func() { s.churn.Store(churnLimit - 1) }, ""},
		{"a 5th", func() { s.churn.Store(churnLimit) }, `5 sessions in a row ended within 1m0s of connecting (see the log's "session ended; reconnecting")`},
		{"connected again", connect, `5 sessions in a row ended within 1m0s of connecting (see the log's "session ended; reconnecting")`},
		{"connected for the window", func() { now = now.Add(churnWindow); s.beat() }, ""},
	})
}
