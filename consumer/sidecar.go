// Package consumer runs the rebound sidecar: it consumes the inbox, routes
// each dead-lettered message (package route: its origin, its policy, the
// decision), republishes a copy and acknowledges the inbox delivery only
// after the broker confirmed that copy (package republisher).
//
// Each connection generation (a session) has its own two connections, one
// to consume and one to publish, as RabbitMQ recommends so that a resource
// alarm blocking publishers never holds back acks. When anything in a
// session fails, the whole session is dropped: its connections are closed,
// its bookkeeping discarded, and the broker requeues every delivery that
// was not acked. A delivery tag is therefore never acked on a channel other
// than the one that delivered it. amqp091-go's own connection recovery is
// not used.
//
// Concurrency: Run owns every goroutine it starts and returns only after
// they have ended. Ready and Healthy may be called from any goroutine.
package consumer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/internal/calendar"
	"github.com/rebound-mq/rebound/internal/dialer"
	"github.com/rebound-mq/rebound/internal/holder"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/policy"
)

// Options configure a Sidecar. Dialer, Router, Logger and Metrics are
// required.
type Options struct {
	// Dialer reaches the broker: one node, or the nodes of a cluster.
	Dialer *dialer.Dialer
	// Router holds the deployment's topology (with the allowlist of
	// origins), its policies and the header names.
	Router route.Router
	// Prefetch is the most unacked inbox deliveries (REBOUND_PREFETCH),
	// and InflightBytes the most bytes of them (REBOUND_INFLIGHT_BYTES):
	// the prefetch follows the sizes seen to keep within both.
	Prefetch       int
	InflightBytes  int64
	ConfirmTimeout time.Duration
	ShutdownGrace  time.Duration
	// DelayQueueIdle: delay queues with no publish for this long (or twice
	// their delay) are deleted when classic and empty, and leased no more
	// (see topology.Lease); 0 deletes none, and stops leasing them after
	// defaultLeaseIdle.
	DelayQueueIdle time.Duration
	// EventsExchange receives an event for every park (see events.go);
	// "" publishes none. EventsFormat is its form (EventsCloudEvents,
	// the default when "", or EventsSchema1) and EventsSource the
	// CloudEvents source naming this deployment (EventsSource).
	EventsExchange string
	EventsFormat   string
	EventsSource   string
	Logger         *zap.Logger
	Metrics        *Metrics
	// Tracer starts each delivery's spans (package tracing); nil for
	// none.
	Tracer trace.Tracer
	// Holder, when not nil, consumes the hold queue alongside the inbox
	// (hold mode, or draining a hold queue in queues mode); Run runs it
	// and waits for it to end.
	Holder *holder.Holder
	// MetricsOrigins (REBOUND_METRICS_ORIGINS) matches the origin queues
	// that get a value of their own in the origin label of the retried
	// and parked counters (see originLabels), nil every one; at most
	// MetricsOriginLimit of them (REBOUND_METRICS_ORIGIN_LIMIT), and 0
	// leaves the label empty.
	MetricsOrigins     *regexp.Regexp
	MetricsOriginLimit int

	Now          func() time.Time   // default time.Now
	NewRand      func() policy.Rand // default a randomly seeded PCG
	SummaryEvery time.Duration      // default one minute
	// WindowIdle is how long without a delivery before the inbox's
	// window starts over at one delivery; default 10s.
	WindowIdle time.Duration
	// QueuesEvery is how often the watch's leader reads the parking and
	// delay queues for the gauges; default 15s (tests set less, to see a
	// change without sitting out the reading).
	QueuesEvery time.Duration
	// Reconnect is the backoff between sessions; default exponential from
	// 500ms to 30s with equal jitter.
	Reconnect policy.Policy
}

// Sidecar is the running sidecar. Build it with New, run it with Run.
type Sidecar struct {
	opt Options
	log *zap.Logger
	m   *Metrics

	ready     atomic.Bool
	blocked   atomic.Bool
	heartbeat atomic.Int64 // Unix nanoseconds of the last sign of life
	// connectedAt is when the current session's connection opened (Unix
	// nanoseconds, 0 while none is open); churn counts the sessions in a
	// row that ended within churnWindow of opening one (Healthy: a
	// reconnect loop is no sign of life).
	connectedAt atomic.Int64
	churn       atomic.Int32
	// The meter under the session's consume connection, nil between
	// sessions, and how long it may wait holding nothing before Healthy
	// calls it a stall: the connection's heartbeat interval.
	inboxMeter atomic.Pointer[meter]
	stallAfter atomic.Int64 // a time.Duration

	// The retry rate budget: the calendar of copies per origin and second
	// (the one piece of state rebound keeps, lost on restart), the
	// inbox's consumer count that divides each rate into this replica's
	// share, and its place among the replicas.
	calendar       *calendar.Calendar
	consumers      atomic.Int64 // the divisor of the share (setConsumers)
	consumerMu     sync.Mutex
	consumerLower  int          // a lower count read once, not yet confirmed; 0 for none
	place          atomic.Int64 // setPlace
	consumerWarned atomic.Bool
	watchWarned    atomic.Bool // the broker refused the watch queue (logged once)
	deferrals      deferralLog // used by the session's goroutine only

	// Origin queues that refused a copy, backed off (refusals.go); kept
	// across sessions, like the calendar.
	refusals *refusals
	attempts atomic.Uint64 // numbers the attempt ids (attemptID)

	received, retried, parked, failed atomic.Int64 // for the periodic summary
	peakInflightBytes                 atomic.Int64 // the most message bytes held (the meter's), for tests

	// replica names this process in its leases of delay queues: the
	// connections' name and a random id. leases counts the leases it
	// published, across sessions, so that readers know its newest.
	replica string
	leases  atomic.Uint64

	origins *originLabels // the origin label's values
}

// attemptID returns a new id for a copy sent straight to its origin
// (headers.Attempt): this replica's random id and a number.
func (s *Sidecar) attemptID() string {
	return s.replica[strings.LastIndexByte(s.replica, '#')+1:] + "." + strconv.FormatUint(s.attempts.Add(1), 36)
}

// defaultLeaseIdle is how long a replica leases a delay queue it no longer
// publishes to when REBOUND_DELAY_QUEUE_IDLE is 0.
const defaultLeaseIdle = 15 * time.Minute

// New returns a Sidecar with defaults filled in.
func New(opt Options) *Sidecar {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.NewRand == nil {
		opt.NewRand = func() policy.Rand { return rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())) }
	}
	if opt.SummaryEvery <= 0 {
		opt.SummaryEvery = time.Minute
	}
	if opt.WindowIdle <= 0 {
		opt.WindowIdle = 10 * time.Second
	}
	if opt.QueuesEvery <= 0 {
		opt.QueuesEvery = defaultQueuesEvery
	}
	if opt.Reconnect.MinDelay == 0 {
		opt.Reconnect = policy.Policy{
			Backoff: policy.Exponential, MinDelay: 500 * time.Millisecond, MaxDelay: 30 * time.Second,
			Multiplier: 2, Jitter: policy.EqualJitter, Deadline: policy.Lenient,
		}
	}
	name := "rebound"
	if opt.Dialer != nil {
		name = opt.Dialer.Name()
	}
	s := &Sidecar{opt: opt, log: opt.Logger, m: opt.Metrics, calendar: calendar.New(),
		refusals: newRefusals(), replica: fmt.Sprintf("%s #%08x", name, rand.Uint32()), origins: newOriginLabels(opt.MetricsOrigins, opt.MetricsOriginLimit)}
	s.consumers.Store(1)
	s.reportShares()
	s.beat()
	return s
}

// Ready reports whether rebound is connected, has declared its topology,
// is consuming and is not blocked by a resource alarm.
func (s *Sidecar) Ready() bool { return s.ready.Load() && !s.blocked.Load() }

// churnLimit sessions in a row, each ended within churnWindow of opening
// its connection, make Healthy fail: a session that dies on every connect
// (a message whose headers outgrow frame_max, a queue whose declaration
// the broker refuses, an origin whose confirms never come) reconnects
// forever, and each reconnect looked like a sign of life. A broker that
// cannot be reached opens no connection and counts for nothing: a restart
// would not bring it back.
const (
	churnLimit  = 5
	churnWindow = time.Minute
)

// wedgedAfter is how long without a sign of life Healthy tolerates. A
// broker outage is not a wedge: reconnect attempts are signs of life.
func (s *Sidecar) wedgedAfter() time.Duration { return 2*time.Minute + 2*s.opt.ConfirmTimeout }

// minStallAfter is the least time the meter may wait holding nothing
// before Healthy calls it a stall, whatever the heartbeat (none, or 1 s).
const minStallAfter = 10 * time.Second

// Healthy returns an error when the process looks wedged: no loop has
// shown a sign of life for a long time while not blocked by the broker,
// or the consume connection has gone unread for longer than a heartbeat
// interval while rebound holds no delivery (the meter waits on bytes only
// amqp091-go holds: nothing rebound does will free them, a restart will).
// A resource alarm and an origin's backoff are not wedges: the first is
// excepted, and during the second rebound holds the deliveries it waits
// on.
func (s *Sidecar) Healthy() error {
	if s.blocked.Load() {
		return nil
	}
	if m := s.inboxMeter.Load(); m != nil {
		if d, limit := m.stalled(s.opt.Now()), time.Duration(s.stallAfter.Load()); d > limit {
			return fmt.Errorf("inbox stalled: the consume connection unread for %s while rebound holds no delivery", d.Round(time.Second))
		}
	}
	if n := s.churn.Load(); n >= churnLimit && !s.connectedFor(churnWindow) {
		return fmt.Errorf("%d sessions in a row ended within %s of connecting (see the log's \"session ended; reconnecting\")", n, churnWindow)
	}
	since := s.opt.Now().Sub(time.Unix(0, s.heartbeat.Load()))
	if since > s.wedgedAfter() {
		return fmt.Errorf("no progress for %s", since.Round(time.Second))
	}
	return nil
}

// connectedFor reports whether the current session's connection has been
// open for at least d: a session that outlived the churn window ends the
// loop Healthy saw, though the count resets only when it ends.
func (s *Sidecar) connectedFor(d time.Duration) bool {
	at := s.connectedAt.Load()
	return at != 0 && s.opt.Now().Sub(time.Unix(0, at)) >= d
}

func (s *Sidecar) beat() { s.heartbeat.Store(s.opt.Now().UnixNano()) }

func (s *Sidecar) setReady(ready bool) {
	s.ready.Store(ready)
	s.refreshReadyGauge()
}

func (s *Sidecar) setBlocked(blocked bool) {
	if s.blocked.Swap(blocked) != blocked {
		if blocked {
			s.log.Warn("broker blocked publishing (resource alarm); taking no new work until it lifts")
			s.m.Blocked.Set(1)
		} else {
			s.log.Info("broker unblocked publishing; resuming")
			s.m.Blocked.Set(0)
		}
	}
	s.refreshReadyGauge()
}

func (s *Sidecar) refreshReadyGauge() {
	if s.Ready() {
		s.m.Ready.Set(1)
	} else {
		s.m.Ready.Set(0)
	}
}

// Run runs sessions until ctx is cancelled, reconnecting with capped,
// jittered backoff after each failure, forever. It returns nil after a
// clean shutdown.
func (s *Sidecar) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	summaryCtx, stopSummary := context.WithCancel(context.Background())
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.summarize(summaryCtx)
	}()
	defer func() {
		stopSummary()
		wg.Wait()
	}()
	if s.opt.Holder != nil {
		holderCtx, stopHolder := context.WithCancel(ctx)
		var holding sync.WaitGroup
		holding.Add(1)
		go func() {
			defer holding.Done()
			_ = s.opt.Holder.Run(holderCtx)
		}()
		defer func() {
			stopHolder()
			holding.Wait()
		}()
	}

	rng := s.opt.NewRand()
	attempt := 0
	for {
		started := s.opt.Now()
		err := s.session(ctx)
		s.setReady(false)
		s.setBlocked(false)
		if ctx.Err() != nil {
			if err != nil {
				s.log.Warn("stopped with an error during shutdown", zap.Error(err))
			}
			s.log.Info("stopped")
			return nil
		}
		lasted := s.opt.Now().Sub(started)
		if lasted > time.Minute {
			attempt = 0 // the session was healthy for a while: start backoff over
		}
		connectedAt := s.connectedAt.Swap(0)
		switch {
		case connectedAt == 0: // no connection: the broker's outage, not a churn
		case s.opt.Now().Sub(time.Unix(0, connectedAt)) < churnWindow:
			s.churn.Add(1)
		default:
			s.churn.Store(0)
		}
		d := s.opt.Reconnect.Decide(policy.State{Retries: attempt, StartedAt: started}, s.opt.Now(), rng).Delay
		attempt++
		s.log.Warn("session ended; reconnecting", zap.Error(err), zap.Int("attempt", attempt), zap.Duration("backoff", d))
		timer := time.NewTimer(d)
		select {
		case <-ctx.Done():
			timer.Stop()
			s.log.Info("stopped")
			return nil
		case <-timer.C:
		}
		s.beat()
		s.m.Reconnects.Inc()
	}
}

// summarize logs, once per SummaryEvery, what happened since the last line.
func (s *Sidecar) summarize(ctx context.Context) {
	t := time.NewTicker(s.opt.SummaryEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			received, retried, parked, failed := s.received.Swap(0), s.retried.Swap(0), s.parked.Swap(0), s.failed.Swap(0)
			s.log.Info("summary",
				zap.Duration("period", s.opt.SummaryEvery),
				zap.Int64("received", received), zap.Int64("retried", retried),
				zap.Int64("parked", parked), zap.Int64("publish_failures", failed),
				zap.Bool("ready", s.Ready()), zap.Bool("blocked", s.blocked.Load()))
		}
	}
}
