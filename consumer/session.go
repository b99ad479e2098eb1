package consumer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/delayqueue"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/internal/tracing"
	"github.com/rebound-mq/rebound/policy"
	"github.com/rebound-mq/rebound/republisher"
)

// session is one connection generation: open builds it, loop runs it,
// close ends it. Everything in it is discarded when it ends.
type session struct {
	s      *Sidecar
	router route.Router // as declared on this session's broker

	consConn, pubConn *amqp.Connection
	consCh            *amqp.Channel
	meter             *meter // beneath the consume connection
	inbox             *inbox
	closed            chan *amqp.Error // the consume channel's
	cancelled         chan string      // the broker cancelled the consumer

	pub      *republisher.Publisher
	events   *eventPublisher   // nil without REBOUND_EVENTS_EXCHANGE
	origins  *declarer.Origins // whether the origin queues exist
	watch    *watcher
	acks     *acker
	ackErr   chan error
	stopAcks chan struct{}
	ackers   sync.WaitGroup

	rng      policy.Rand
	problems []headers.Problem // reused between deliveries
}

// session runs one connection generation until ctx is cancelled (then it
// drains and returns nil) or something fails (then it returns why).
func (s *Sidecar) session(ctx context.Context) error {
	s.beat()
	ss := &session{s: s, rng: s.opt.NewRand()}
	defer ss.close()
	if err := ss.open(ctx); err != nil {
		return err
	}
	return ss.loop(ctx)
}

// open connects, declares the topology, starts the publisher and the
// acker, and consumes the inbox. What it opened before a failure, close
// closes.
func (ss *session) open(ctx context.Context) error {
	s := ss.s
	var err error
	var m *meter
	if ss.consConn, err = s.opt.Dialer.DialVia(ctx, "consume", func(conn net.Conn) net.Conn {
		m = newMeter(conn, s.opt.InflightBytes)
		m.now = s.opt.Now
		m.observe = func(bytes int64) { s.m.InflightBytes.Set(float64(bytes)) }
		return m
	}); err != nil {
		return err
	}
	s.connectedAt.Store(s.opt.Now().UnixNano())
	ss.meter = m
	s.inboxMeter.Store(m)
	s.stallAfter.Store(int64(max(ss.consConn.Config.Heartbeat, minStallAfter)))
	if ss.pubConn, err = s.opt.Dialer.Dial(ctx, "publish"); err != nil {
		return err
	}

	ss.router = s.opt.Router
	ss.router.Topology = ss.router.Topology.ForServer(ss.pubConn.Properties)
	topo := ss.router.Topology
	notice := func(msg string) { s.log.Warn("topology", zap.String("notice", msg)) }
	notices, err := declarer.Declare(ss.pubConn, topo)
	for _, n := range notices {
		notice(n)
	}
	if err != nil {
		return fmt.Errorf("declare topology: %w", err)
	}
	if ss.pub, err = republisher.New(ss.pubConn, topo, s.opt.Prefetch, s.opt.ConfirmTimeout, notice); err != nil {
		return err
	}
	ss.origins = declarer.NewOrigins(ss.pubConn, ss.pub.ReturnedSince, notice, time.Now)

	if s.opt.EventsExchange != "" {
		ss.events = startEvents(ss.pubConn, s.opt.EventsExchange, eventEncoder(s.opt.EventsFormat, s.opt.EventsSource), s.log, func(outcome string) {
			s.m.Events.WithLabelValues(outcome).Inc()
		})
	}

	if ss.consCh, err = ss.consConn.Channel(); err != nil {
		return fmt.Errorf("open consume channel: %w", err)
	}
	ss.closed = ss.consCh.NotifyClose(make(chan *amqp.Error, 1))
	ss.cancelled = ss.consCh.NotifyCancel(make(chan string, 1))
	ss.acks = newAcker(ss.consCh, func(settled, inflight int, bytes int64) {
		ss.meter.settle(bytes) // which sets rebound_inflight_bytes
		// Counted up as each delivery is registered, down as it is
		// settled, never set from a reading: a value set here would be
		// stale as soon as handle registered another, and read as
		// "nothing in flight" while a copy was still unsettled.
		s.m.InFlight.Sub(float64(settled))
		s.beat()
	})
	ss.inbox = &inbox{ch: ss.consCh, queue: topo.InboxQueue, win: newWindow(s.opt.Prefetch, s.opt.InflightBytes),
		idleReset: s.opt.WindowIdle, last: s.opt.Now(), settledThrough: ss.acks.settledThrough.Load,
		onPrefetch: func(n int) {
			s.m.Prefetch.Set(float64(n))
			if ce := s.log.Check(zap.DebugLevel, "inbox prefetch"); ce != nil {
				ce.Write(zap.Int("prefetch", n), zap.Int64("held_bytes", ss.meter.bytes()))
			}
		}}
	// One delivery at first: nothing is known yet of the messages' sizes.
	if err := ss.inbox.start(1); err != nil {
		return err
	}
	ss.stopAcks, ss.ackErr = make(chan struct{}), make(chan error, 1)
	ss.ackers.Add(1)
	go func() {
		defer ss.ackers.Done()
		ss.ackErr <- ss.acks.run(ss.stopAcks)
	}()

	ss.watch = ss.startWatcher(ss.consConn)
	s.setReady(true)
	s.log.Info("consuming", zap.String("inbox", topo.InboxQueue), zap.Int("prefetch_ceiling", s.opt.Prefetch),
		zap.Int64("inflight_bytes", s.opt.InflightBytes), zap.String("broker", s.opt.Dialer.Host()))
	return nil
}

// close stops the acker and closes the connections; the broker requeues
// every delivery not acked. It waits for the watcher, and for the
// publisher's goroutine, which end once their connections are closed.
func (ss *session) close() {
	if ss.stopAcks != nil {
		close(ss.stopAcks)
		ss.ackers.Wait()
		ss.s.m.InFlight.Set(0)
		ss.s.m.InflightBytes.Set(0)
	}
	if ss.meter != nil {
		ss.s.inboxMeter.CompareAndSwap(ss.meter, nil)
		ss.s.m.InboxStalled.Set(0)
		ss.meter.release() // the close handshake must be read
	}
	if ss.consConn != nil {
		ss.consConn.Close()
	}
	if ss.events != nil {
		ss.events.close() // before its connection: the events queued are counted dropped
	}
	if ss.pubConn != nil {
		ss.pubConn.Close()
	}
	if ss.watch != nil {
		ss.watch.close()
	}
	if ss.inbox != nil {
		ss.inbox.wait()
	}
	if ss.pub != nil {
		<-ss.pub.Done()
	}
}

// loop handles deliveries until ctx is cancelled (then it drains and
// returns nil) or something fails (then it returns why).
func (ss *session) loop(ctx context.Context) error {
	s := ss.s
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lease := leaseState{swept: s.opt.Now()}
	for {
		select {
		case <-ctx.Done():
			ss.drain()
			return nil
		case d, ok := <-ss.inbox.deliveries():
			if !ok {
				cancelled, err := ss.inbox.ended()
				if err != nil {
					return err
				}
				ss.meter.end(cancelled)
				ss.requeueOrphans()
				continue
			}
			ss.take(d)
			if err := ss.waitWhileBlocked(ctx); err != nil {
				return err
			}
			if ctx.Err() != nil {
				// Shutting down: leave d unacked, the broker requeues it.
				ss.drain()
				return nil
			}
			if err := ss.handle(d); err != nil {
				return err
			}
			ss.inbox.refit(s.opt.Now())
		case <-ss.meter.orphaned:
			ss.requeueOrphans()
		case r := <-ss.inbox.replaced:
			if err := ss.inbox.install(r); err != nil {
				return err
			}
		case tag := <-ss.cancelled:
			return fmt.Errorf("broker cancelled consumer %s (inbox %s deleted?)", tag, ss.router.Topology.InboxQueue)
		case err := <-ss.closed:
			if err == nil {
				return errors.New("consume channel closed")
			}
			return fmt.Errorf("consume channel closed: %w", err)
		case <-ss.pub.Done():
			return ss.pub.Err()
		case err := <-ss.ackErr:
			return err
		case <-tick.C:
			s.beat()
			s.setBlocked(ss.pub.Blocked())
			s.m.InboxStalled.Set(ss.meter.stalled(s.opt.Now()).Seconds())
			s.m.OriginsRefusing.Set(float64(s.refusals.refusing(s.opt.Now())))
			ss.inbox.refit(s.opt.Now())
			if err := ss.tendDelayQueues(&lease); err != nil {
				return err
			}
		}
	}
}

// leaseState is what tendDelayQueues keeps between ticks.
type leaseState struct {
	swept  time.Time // last sweep, and full lease
	sent   bool      // a lease went out in this session
	queues []string  // what the last lease named, sorted
	failed bool      // the last lease could not be published (logged once)
}

// tendDelayQueues runs on the loop's one-second tick. Every
// REBOUND_DELAY_QUEUE_IDLE (at most every minute) it sweeps the idle
// delay queues (delayqueue.Set.SweepIdle) and publishes this replica's lease of
// the delay queues it still uses (delayqueue.Lease), expiring after three
// such rounds; between sweeps it publishes one at once when it starts
// using a new delay queue, so that `rebound topology prune` sees it within
// a second, and one when the session starts. It does nothing while the
// broker blocks the publishing connection: a declaration or publish would
// wait on it. Only an error that ends the session is returned.
func (ss *session) tendDelayQueues(st *leaseState) error {
	s := ss.s
	if ss.pub.Blocked() {
		return nil
	}
	idle := s.opt.DelayQueueIdle
	window := idle
	if window <= 0 {
		window = defaultLeaseIdle
	}
	every := min(window, time.Minute)
	now := s.opt.Now()
	sweep := now.Sub(st.swept) >= every
	if sweep {
		st.swept = now
		deleted, err := ss.pub.Delays().SweepIdle(window, idle > 0)
		if len(deleted) > 0 {
			s.log.Info("deleted idle empty delay queues", zap.Strings("queues", deleted))
		}
		if err != nil {
			return err
		}
	}
	queues := ss.pub.Delays().Names()
	slices.Sort(queues)
	if !sweep && st.sent && (st.failed || slices.Equal(queues, st.queues)) {
		return nil
	}
	if ss.router.Topology.Hold && len(queues) == 0 && len(st.queues) == 0 {
		// Hold mode uses no delay queue: no lease to give, and none to
		// supersede. Leases go through the default exchange, which
		// rebound's user need not write to in hold mode.
		return nil
	}
	err := ss.pub.Delays().PublishLease(delayqueue.Lease{Replica: s.replica, Queues: queues, Sequence: s.leases.Add(1)}, 3*every)
	s.m.BrokerCalls.WithLabelValues(callLease).Inc()
	if err != nil {
		if !st.failed {
			s.log.Warn("cannot publish this replica's lease of the delay queues it uses; `rebound topology prune` may delete one of them under it",
				zap.Error(err))
		}
		st.sent, st.failed = true, true
		return nil
	}
	st.queues, st.sent, st.failed = queues, true, false
	return nil
}

// waitWhileBlocked holds new work while a resource alarm blocks publishing.
func (ss *session) waitWhileBlocked(ctx context.Context) error {
	s := ss.s
	for ss.pub.Blocked() {
		s.setBlocked(true)
		select {
		case <-ctx.Done():
			return nil
		case <-ss.pub.Done():
			return ss.pub.Err()
		case <-time.After(100 * time.Millisecond):
			s.beat()
		}
	}
	s.setBlocked(false)
	// After a run of failed publishes (nacks, returns), slow down instead
	// of spinning on requeued deliveries.
	if n := ss.acks.failStreak.Load(); n > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(min(time.Duration(n)*50*time.Millisecond, 2*time.Second)):
		}
	}
	return nil
}

// drain stops consuming and waits, up to the shutdown grace, for the
// copies already published to be confirmed and their deliveries acked.
// Deliveries not acked by then are requeued by the broker when the
// connection closes.
func (ss *session) drain() {
	s := ss.s
	s.setReady(false)
	ss.inbox.stop()
	deadline := time.NewTimer(s.opt.ShutdownGrace)
	defer deadline.Stop()
	for {
		n := ss.acks.inflight.Load()
		if n == 0 {
			s.log.Info("drained: every published copy confirmed and acked")
			return
		}
		select {
		case <-deadline.C:
			s.log.Warn("shutdown grace over; leaving deliveries unacked for the broker to requeue",
				zap.Int64("unacked", n), zap.Duration("grace", s.opt.ShutdownGrace))
			return
		case <-ss.pub.Done():
			s.log.Warn("publisher stopped while draining; leaving deliveries unacked", zap.Error(ss.pub.Err()))
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// take records a delivery the session took from the inbox: the window
// learns its size, and the meter holds its bytes until it is settled. The
// deliveries the meter read before it that never reached the session are
// requeued.
func (ss *session) take(d amqp.Delivery) {
	size := int64(len(d.Body))
	// Deliveries amqp091-go read and dropped (their consumer was
	// cancelled already) go back to the queue before this one is
	// registered: the acker's multiple acks must not cover them.
	for _, tag := range ss.meter.take(d.DeliveryTag, size) {
		ss.requeueDropped(tag)
	}
	ss.inbox.took(d.DeliveryTag, size, ss.s.opt.Now())
	if peak := ss.meter.peakBytes(); peak > ss.s.peakInflightBytes.Load() {
		ss.s.peakInflightBytes.Store(peak) // only this goroutine stores it
	}
}

// requeueOrphans requeues the deliveries the broker sent consumers the
// inbox had cancelled already, which amqp091-go dropped (meter.end).
func (ss *session) requeueOrphans() {
	for _, tag := range ss.meter.takeOrphans() {
		ss.requeueDropped(tag)
	}
}

// requeueDropped has the acker requeue a delivery that never reached the
// session, in its turn.
func (ss *session) requeueDropped(tag uint64) {
	ss.s.m.InFlight.Inc() // before the acker can settle it: never below the truth
	ss.acks.requeue(tag)
	ss.s.log.Debug("requeueing a delivery to a cancelled consumer", zap.Uint64("delivery_tag", tag))
}

// handle routes one delivery and publishes its copy. The delivery is
// settled by the acker once the copy's outcome is known.
func (ss *session) handle(d amqp.Delivery) error {
	s := ss.s
	s.m.Received.Inc()
	s.received.Add(1)
	if d.Redelivered {
		s.m.Redelivered.Inc()
	}
	span := tracing.Start(s.opt.Tracer, ss.router.Topology.InboxQueue, d)
	now := s.opt.Now()
	var state headers.State
	state, ss.problems = ss.router.Codec.Decode(d.Headers, d.Timestamp, now, ss.problems[:0])
	if len(ss.problems) > 0 {
		ss.reportProblems(d, ss.problems)
	}

	origin := ss.router.CheckOrigin(state.Origin, state.ClaimedOrigin)
	exists := true
	if origin.Refused == "" {
		var err error
		if exists, _, err = ss.origins.Exists(origin.Queue); err != nil {
			span.End(false, "origin check failed")
			return fmt.Errorf("check origin queue %s: %w", origin.Queue, err)
		}
	}
	if id := ss.router.Twin(d); id != "" {
		if done := ss.settleTwin(d, id); done {
			span.End(true, "twin of a copy its origin refused")
			return nil
		}
	}
	var rt route.Route
	if ss.router.Returning(d) {
		rt = ss.router.Return(state, origin, exists)
	} else {
		rt = ss.budget(ss.router.Decide(state, origin, exists, now, ss.rng), state, now)
	}
	// A copy sent straight to its origin waits while the origin refuses
	// copies (refusals.go).
	straight := rt.Decision.Retry && rt.Decision.Delay == 0
	if straight {
		if wait := s.refusals.admit(rt.Origin.Queue, now); wait > 0 {
			rt = ss.router.Refuse(rt, state, now, wait)
			straight = false
		} else {
			rt.Attempt = s.attemptID()
			s.refusals.sent(rt.Attempt, now)
		}
	}
	ss.report(d, rt)
	dest, msg := ss.router.Plan(d, state, rt, now)
	span.Decided(tracing.Decision{Origin: rt.Origin.Queue, Retry: rt.Decision.Retry, Returning: rt.Returning, Delay: rt.Decision.Delay,
		RetryCount: state.Retries, Policy: rt.Policy.Name, ParkedReason: string(rt.Decision.Reason),
		Group: headers.Text(msg.Headers[ss.router.Codec.Names.Group])})
	span.Publishing(s.opt.Tracer, dest.Exchange, dest.RoutingKey)

	tag := d.DeliveryTag
	s.m.InFlight.Inc()
	ss.acks.add(tag, int64(len(d.Body)))
	after := route.RetryAfter(state, rt.Decision)
	err := ss.pub.Publish(context.Background(), dest, msg, func(o republisher.Outcome, latency time.Duration) {
		if straight {
			s.refusals.settled(rt.Attempt, o == republisher.Nacked, s.opt.Now())
			switch o {
			case republisher.Confirmed:
				s.refusals.accepted(rt.Origin.Queue)
			case republisher.Nacked:
				// Requeued, the delivery comes back at once and waits
				// in a delay queue then: the origin is backed off now.
				s.refusals.refused(rt.Origin.Queue, now, s.opt.Now())
				s.m.OriginRefused.WithLabelValues(rt.Policy.Name).Inc()
				span.End(false, "refused by its origin queue")
				ss.acks.refused(tag)
				return
			}
		}
		ss.record(rt, o, latency)
		span.End(o == republisher.Confirmed, o.String())
		if o == republisher.Confirmed && !rt.Decision.Retry && ss.events != nil {
			ss.events.send(newParkedEvent(d.MessageId, rt.Origin.Queue, string(rt.Decision.Reason), rt.Policy.Name, headers.Text(msg.Headers[ss.router.Codec.Names.Group]),
				headers.Text(msg.Headers[ss.router.Codec.Names.Error]), state.Retries, now))
		}
		if after != "" && o == republisher.Confirmed {
			s.m.RetryAfter.WithLabelValues(rt.Policy.Name, after).Inc()
		}
		ss.acks.resolve(tag, o == republisher.Confirmed)
	})
	if err != nil {
		span.End(false, err.Error())
		ss.acks.resolve(tag, false)
		return err
	}
	return nil
}

// settleTwin settles d, a message that may be the twin of attempt id
// (route.Router.Twin), and says whether it did: the twin of a copy the
// broker refused is acked without a copy (the refused copy is still
// rebound's, waiting for its origin); one whose attempt's outcome is not
// known yet is requeued, to be looked at again once it is. Any other is
// left to be handled as a message of its own.
func (ss *session) settleTwin(d amqp.Delivery, id string) bool {
	s := ss.s
	switch s.refusals.twin(id) {
	case twinRefused:
		s.m.InFlight.Inc()
		ss.acks.add(d.DeliveryTag, int64(len(d.Body)))
		ss.acks.resolve(d.DeliveryTag, true)
		s.m.OriginTwins.Inc()
		if ce := s.log.Check(zap.DebugLevel, "dropped the twin of a refused copy"); ce != nil {
			ce.Write(zap.String("message_id", d.MessageId), zap.String("attempt", id))
		}
		return true
	case twinPending:
		s.m.InFlight.Inc()
		ss.acks.add(d.DeliveryTag, int64(len(d.Body)))
		ss.acks.refused(d.DeliveryTag)
		return true
	}
	return false
}

// report logs and counts what a route says of a message besides its
// decision: a disputed origin, a disagreeing policy header (each once per
// message: a redelivery, after a refused copy or a crash, may have been
// counted already), a park decided before the policy was asked, and the
// decision itself at debug.
func (ss *session) report(d amqp.Delivery, rt route.Route) {
	s := ss.s
	if rt.Origin.Disputed != "" && !d.Redelivered {
		s.m.OriginMismatch.Inc()
		s.log.Warn("origin header disagrees with the broker's x-death record; using the record",
			zap.String("message_id", d.MessageId), zap.String("header", quoteShort(rt.Origin.Disputed)),
			zap.String("origin", rt.Origin.Queue))
	}
	if rt.Conflict != "" && !d.Redelivered {
		s.m.PolicyConflicts.WithLabelValues(rt.Policy.Name).Inc()
		s.log.Warn("policy header disagrees with this replica's policies; deciding with this replica's",
			zap.String("message_id", d.MessageId), zap.String("header", quoteShort(d.Headers[ss.router.Codec.Names.Policy])),
			zap.String("conflict", rt.Conflict), zap.String("policy", rt.Policy.Label()), zap.String("origin", quoteShort(rt.Origin.Queue)))
	}
	if rt.Why != "" {
		s.log.Warn(rt.Why+"; parking", zap.String("message_id", d.MessageId), zap.String("origin", quoteShort(rt.Origin.Queue)),
			zap.String("reason", string(rt.Decision.Reason)))
	}
	if ce := s.log.Check(zap.DebugLevel, "decision"); ce != nil {
		ce.Write(zap.String("message_id", d.MessageId), zap.String("origin", rt.Origin.Queue), zap.String("policy", rt.Policy.Name),
			zap.Bool("retry", rt.Decision.Retry), zap.Duration("delay", rt.Decision.Delay), zap.String("reason", string(rt.Decision.Reason)))
	}
}

// quoteShort quotes a value from a message for a log line, cut short: a
// header may hold anything a producer wrote.
func quoteShort(v any) string {
	const limit = 100
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		s = fmt.Sprintf("%T", v)
	}
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "..."
	}
	return strconv.Quote(s)
}

// record counts a copy's outcome. It runs on the publisher's goroutine.
func (ss *session) record(rt route.Route, o republisher.Outcome, latency time.Duration) {
	s := ss.s
	if o != republisher.Confirmed {
		s.m.PublishFailures.WithLabelValues(o.String()).Inc()
		s.failed.Add(1)
		return
	}
	s.m.ConfirmLatency.Observe(latency.Seconds())
	origin := s.origins.value(rt.Origin.Queue)
	switch decision := rt.Decision; {
	case rt.Refused && decision.Retry:
		s.m.OriginWaits.WithLabelValues(rt.Policy.Name).Inc()
	case rt.Returning && decision.Retry:
		s.m.Returned.WithLabelValues(rt.Policy.Name).Inc()
	case !decision.Retry:
		s.m.Parked.WithLabelValues(string(decision.Reason), rt.Policy.Name, origin).Inc()
		s.parked.Add(1)
	case decision.Delay == 0:
		s.m.Retried.WithLabelValues("immediate", rt.Policy.Name, origin).Inc()
		s.retried.Add(1)
	default:
		s.m.Retried.WithLabelValues("delayed", rt.Policy.Name, origin).Inc()
		s.m.RetryDelay.Observe(decision.Delay.Seconds())
		s.retried.Add(1)
	}
}

// reportProblems logs a delivery's unreadable headers once, with its
// message id, and counts each. Labels are header names rebound reads, a
// bounded set.
func (ss *session) reportProblems(d amqp.Delivery, problems []headers.Problem) {
	fields := make([]string, len(problems))
	for i, p := range problems {
		fields[i] = p.String()
		ss.s.m.InvalidHeaders.WithLabelValues(p.Header).Inc()
	}
	ss.s.log.Warn("unreadable headers treated as absent",
		zap.String("message_id", d.MessageId), zap.Strings("problems", fields))
}
