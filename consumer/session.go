package consumer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/policy"
	"github.com/rebound-mq/rebound/republisher"
)

// session is one connection generation. Everything in it is discarded
// when it ends.
type session struct {
	*Sidecar
	topo     republisher.Topology // as declared on this session's broker
	pub      *republisher.Publisher
	acks     *acker
	rng      policy.Rand
	problems []headers.Problem // reused between deliveries
}

// session connects, declares the topology, consumes the inbox and handles
// deliveries until ctx is cancelled (then it drains and returns nil) or
// something fails (then it returns why).
func (s *Sidecar) session(ctx context.Context) error {
	s.beat()
	consConn, err := s.dial(ctx, "consume")
	if err != nil {
		return err
	}
	defer consConn.Close()
	pubConn, err := s.dial(ctx, "publish")
	if err != nil {
		return err
	}

	topo := s.opt.Topology.ForServer(pubConn.Properties)
	notice := func(msg string) { s.log.Warn("topology", zap.String("notice", msg)) }
	notices, err := topo.Declare(pubConn)
	for _, n := range notices {
		notice(n)
	}
	if err != nil {
		pubConn.Close()
		return fmt.Errorf("declare topology: %w", err)
	}
	pub, err := republisher.New(pubConn, topo, s.opt.Prefetch, s.opt.ConfirmTimeout, notice)
	if err != nil {
		pubConn.Close()
		return err
	}
	defer func() {
		pubConn.Close()
		<-pub.Done() // the publisher's goroutine ends once its channel is closed
	}()

	consCh, err := consConn.Channel()
	if err != nil {
		return fmt.Errorf("open consume channel: %w", err)
	}
	if err := consCh.Qos(s.opt.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	closed := consCh.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := consCh.NotifyCancel(make(chan string, 1))
	consumerTag := fmt.Sprintf("rebound-%016x", rand.Uint64()) // unique per session, for basic.cancel
	deliveries, err := consCh.Consume(s.opt.Topology.InboxQueue, consumerTag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", s.opt.Topology.InboxQueue, err)
	}

	acks := newAcker(consCh, s.opt.Prefetch, func(settled, inflight int) {
		s.m.InFlight.Set(float64(inflight))
		s.beat()
	})
	stopAcks := make(chan struct{})
	ackErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ackErr <- acks.run(stopAcks)
	}()
	defer func() {
		close(stopAcks)
		wg.Wait()
		s.m.InFlight.Set(0)
	}()

	ss := &session{Sidecar: s, topo: topo, pub: pub, acks: acks, rng: s.opt.NewRand()}
	s.setReady(true)
	s.log.Info("consuming", zap.String("inbox", s.opt.Topology.InboxQueue), zap.Int("prefetch", s.opt.Prefetch),
		zap.String("broker", s.brokerHost()))

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastSweep := s.opt.Now()
	for {
		select {
		case <-ctx.Done():
			ss.drain(consCh, consumerTag)
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("inbox deliveries stopped")
			}
			if err := ss.waitWhileBlocked(ctx); err != nil {
				return err
			}
			if ctx.Err() != nil {
				// Shutting down: leave d unacked, the broker requeues it.
				ss.drain(consCh, consumerTag)
				return nil
			}
			if err := ss.handle(d); err != nil {
				return err
			}
		case tag := <-cancelled:
			return fmt.Errorf("broker cancelled consumer %s (inbox %s deleted?)", tag, s.opt.Topology.InboxQueue)
		case err := <-closed:
			if err == nil {
				return errors.New("consume channel closed")
			}
			return fmt.Errorf("consume channel closed: %w", err)
		case <-pub.Done():
			return pub.Err()
		case err := <-ackErr:
			return err
		case <-tick.C:
			s.beat()
			s.setBlocked(pub.Blocked())
			if idle := s.opt.DelayQueueIdle; idle > 0 && s.opt.Now().Sub(lastSweep) >= min(idle, time.Minute) {
				lastSweep = s.opt.Now()
				deleted, err := pub.SweepIdle(idle)
				if len(deleted) > 0 {
					s.log.Info("deleted idle empty delay queues", zap.Strings("queues", deleted))
				}
				if err != nil {
					return err
				}
			}
		}
	}
}

// waitWhileBlocked holds new work while a resource alarm blocks publishing.
func (ss *session) waitWhileBlocked(ctx context.Context) error {
	for ss.pub.Blocked() {
		ss.setBlocked(true)
		select {
		case <-ctx.Done():
			return nil
		case <-ss.pub.Done():
			return ss.pub.Err()
		case <-time.After(100 * time.Millisecond):
			ss.beat()
		}
	}
	ss.setBlocked(false)
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
func (ss *session) drain(consCh *amqp.Channel, consumerTag string) {
	ss.setReady(false)
	if err := consCh.Cancel(consumerTag, false); err != nil {
		ss.log.Warn("cancel consumer", zap.Error(err))
	}
	deadline := time.NewTimer(ss.opt.ShutdownGrace)
	defer deadline.Stop()
	for {
		n := ss.acks.inflight.Load()
		if n == 0 {
			ss.log.Info("drained: every published copy confirmed and acked")
			return
		}
		select {
		case <-deadline.C:
			ss.log.Warn("shutdown grace over; leaving deliveries unacked for the broker to requeue",
				zap.Int64("unacked", n), zap.Duration("grace", ss.opt.ShutdownGrace))
			return
		case <-ss.pub.Done():
			ss.log.Warn("publisher stopped while draining; leaving deliveries unacked", zap.Error(ss.pub.Err()))
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// handle decides what to do with one delivery and publishes its copy.
// The delivery is settled by the acker once the copy's outcome is known.
func (ss *session) handle(d amqp.Delivery) error {
	ss.m.Received.Inc()
	ss.received.Add(1)
	if d.Redelivered {
		ss.m.Redelivered.Inc()
	}
	now := ss.opt.Now()
	var state headers.State
	state, ss.problems = ss.opt.Codec.Decode(d.Headers, d.Timestamp, now, ss.problems[:0])
	if len(ss.problems) > 0 {
		ss.reportProblems(d, ss.problems)
	}

	decision, err := ss.decide(d, &state, now)
	if err != nil {
		return err
	}
	dest, msg := Plan(ss.topo, ss.opt.Codec, d, state, decision, now)

	if ce := ss.log.Check(zap.DebugLevel, "decision"); ce != nil {
		ce.Write(zap.String("message_id", d.MessageId), zap.String("origin", state.Origin),
			zap.Int("retries", state.Retries), zap.Bool("retry", decision.Retry),
			zap.Duration("delay", decision.Delay), zap.String("reason", string(decision.Reason)))
	}

	tag := d.DeliveryTag
	ss.acks.add(tag)
	err = ss.pub.Publish(context.Background(), dest, msg, func(o republisher.Outcome, latency time.Duration) {
		ss.record(decision, o, latency)
		ss.acks.resolve(tag, o == republisher.Confirmed)
	})
	if err != nil {
		ss.acks.resolve(tag, false)
		return err
	}
	return nil
}

// decide applies the policy to a message that may go back to its origin
// (republisher.Topology.CheckOrigin), and parks it before asking the
// policy when it may not: unknown-origin or origin-not-allowed, and
// unknown-origin when the queue does not exist (the broker would drop the
// copy when its delay ends). It sets state.Origin to the origin checked.
func (ss *session) decide(d amqp.Delivery, state *headers.State, now time.Time) (policy.Decision, error) {
	check := ss.topo.CheckOrigin(*state, ss.opt.OriginAllowed)
	state.Origin, state.ClaimedOrigin = check.Origin, check.Disputed
	// Once per message: a redelivery (after a refused copy, a crash) may
	// have been counted already.
	if check.Disputed != "" && !d.Redelivered {
		ss.m.OriginMismatch.Inc()
		ss.log.Warn("origin header disagrees with the broker's x-death record; using the record",
			zap.String("message_id", d.MessageId), zap.String("header", quoteShort(check.Disputed)),
			zap.String("origin", check.Origin))
	}
	park := func(reason policy.Reason, why string) (policy.Decision, error) {
		ss.log.Warn(why+"; parking", zap.String("message_id", d.MessageId), zap.String("origin", quoteShort(state.Origin)),
			zap.String("reason", string(reason)))
		return policy.Decision{Reason: reason}, nil
	}
	if check.Refused != "" {
		return park(check.Refused, check.Why)
	}
	exists, err := ss.pub.OriginExists(state.Origin)
	if err != nil {
		return policy.Decision{}, fmt.Errorf("check origin queue %s: %w", state.Origin, err)
	}
	if !exists {
		return park(policy.UnknownOrigin, "origin queue does not exist")
	}
	return ss.opt.Policy.Decide(state.State, now, ss.rng), nil
}

// quoteShort quotes a name from a message for a log line, cut short: a
// header may hold anything a producer wrote.
func quoteShort(s string) string {
	const limit = 100
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "..."
	}
	return strconv.Quote(s)
}

// record counts a copy's outcome. It runs on the publisher's goroutine.
func (ss *session) record(decision policy.Decision, o republisher.Outcome, latency time.Duration) {
	if o != republisher.Confirmed {
		ss.m.PublishFailures.WithLabelValues(o.String()).Inc()
		ss.failed.Add(1)
		return
	}
	ss.m.ConfirmLatency.Observe(latency.Seconds())
	switch {
	case !decision.Retry:
		ss.m.Parked.WithLabelValues(string(decision.Reason)).Inc()
		ss.parked.Add(1)
	case decision.Delay == 0:
		ss.m.Retried.WithLabelValues("immediate").Inc()
		ss.retried.Add(1)
	default:
		ss.m.Retried.WithLabelValues("delayed").Inc()
		ss.m.RetryDelay.Observe(decision.Delay.Seconds())
		ss.retried.Add(1)
	}
}

// reportProblems logs a delivery's unreadable headers once, with its
// message id, and counts each. Labels are header names rebound reads, a
// bounded set.
func (ss *session) reportProblems(d amqp.Delivery, problems []headers.Problem) {
	fields := make([]string, len(problems))
	for i, p := range problems {
		fields[i] = p.String()
		ss.m.InvalidHeaders.WithLabelValues(p.Header).Inc()
	}
	ss.log.Warn("unreadable headers treated as absent",
		zap.String("message_id", d.MessageId), zap.Strings("problems", fields))
}
