package holder

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	amqp10 "github.com/Azure/go-amqp"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/dialer"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
)

// Options configure a Holder. Dialer, Rules, Logger and Metrics are
// required.
type Options struct {
	Dialer  *dialer.Dialer
	Rules   Rules
	Logger  *zap.Logger
	Metrics *metrics
	// Drain says the hold queue is not this deployment's delay mode
	// (REBOUND_DELAY_MODE=queues): the holder consumes it only while it
	// exists, so that switching back from hold strands no copy.
	Drain bool
	// Credit is the most copies a holder is given at once; default 256.
	Credit int
	// ConfirmTimeout bounds the wait for the confirm of a parked copy.
	ConfirmTimeout time.Duration
	Now            func() time.Time // default time.Now
	// Retry is the wait between sessions, and between checks for a hold
	// queue to drain; default 1s to 30s.
	Retry policy.Policy
}

// Holder consumes the hold queue. Build it with New, run it with Run.
type Holder struct {
	opt   Options
	log   *zap.Logger
	m     *metrics
	homes *homes // the origins' ways home, kept across sessions
}

// New returns a Holder with defaults filled in.
func New(opt Options) *Holder {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Credit <= 0 {
		opt.Credit = 256
	}
	if opt.ConfirmTimeout <= 0 {
		opt.ConfirmTimeout = 30 * time.Second
	}
	if opt.Retry.MinDelay == 0 {
		opt.Retry = policy.Policy{Backoff: policy.Exponential, MinDelay: time.Second, MaxDelay: 30 * time.Second,
			Multiplier: 2, Jitter: policy.EqualJitter, Deadline: policy.Lenient}
	}
	return &Holder{opt: opt, log: opt.Logger, m: opt.Metrics, homes: newHomes()}
}

// Run holds copies until ctx is cancelled, reconnecting after each
// failure. It returns nil once ctx is cancelled and every settlement
// made has reached the broker.
func (h *Holder) Run(ctx context.Context) error {
	rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	attempt := 0
	warnedRefused := false
	for {
		started := h.opt.Now()
		err := h.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		// A replica in queues mode whose user has no permission on the hold
		// queue (granted before hold mode existed) cannot drain one: it
		// says so once and looks again as rarely as for an absent queue.
		if h.opt.Drain && refused(err) {
			if !warnedRefused {
				h.log.Warn("cannot check for a hold queue to drain: no permission on it; grant configure and read on it (deploy/rabbitmq/setup.sh) if this vhost ever ran REBOUND_DELAY_MODE=hold", zap.Error(err))
				warnedRefused = true
			}
			err = errNoHoldQueue
		}
		if errors.Is(err, errNoHoldQueue) {
			attempt = 0
		} else {
			if h.opt.Now().Sub(started) > time.Minute {
				attempt = 0
			}
			h.log.Warn("holder session ended; reconnecting", zap.Error(err), zap.Int("attempt", attempt+1))
		}
		d := h.opt.Retry.Decide(policy.State{Retries: attempt, StartedAt: started}, h.opt.Now(), rng).Delay
		if errors.Is(err, errNoHoldQueue) {
			d = time.Second // the sidecar declares it at once
			if h.opt.Drain {
				d = time.Minute
			}
		}
		attempt++
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// refused reports whether err is the broker refusing an operation for
// want of a permission.
func refused(err error) bool {
	var aerr *amqp.Error
	return errors.As(err, &aerr) && aerr.Code == amqp.AccessRefused
}

// errNoHoldQueue ends a holder's session before it starts: there is no
// hold queue (yet, in hold mode; to drain, in queues mode).
var errNoHoldQueue = errors.New("no hold queue to drain")

// session is one connection generation of the holder: an AMQP 1.0
// connection that consumes the hold queue, and an AMQP 0-9-1 one, opened
// when a copy is first parked.
type session struct {
	h    *Holder
	rcv  *amqp10.Receiver
	park *parker
	cmds commands
}

// session consumes the hold queue until ctx is cancelled or the link
// fails. Its shutdown detaches the link and ends the session, each a
// round trip the broker answers after the settlements sent before it.
func (h *Holder) session(ctx context.Context) error {
	queue := h.opt.Rules.Topology.HoldQueue().Name
	// In hold mode the sidecar's session declares the hold queue, and the
	// holder, started beside it, may look first.
	check, err := h.opt.Dialer.Dial(ctx, "hold check")
	if err != nil {
		return err
	}
	exists, err := declarer.QueueExists(check, queue)
	check.Close()
	if err != nil {
		return err
	}
	if !exists {
		return errNoHoldQueue
	}
	if h.opt.Drain {
		h.log.Info("draining the hold queue left by hold mode", zap.String("queue", queue))
	}
	ss := &session{h: h, park: &parker{h: h}}
	defer ss.park.close()
	following, err := ss.followCommands(ctx)
	if err != nil {
		return err
	}
	if following != nil {
		defer following()
	}
	conn, err := h.opt.Dialer.Dial10(ctx, "hold")
	if err != nil {
		return err
	}
	defer conn.Close()
	sess, err := conn.NewSession(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin AMQP 1.0 session: %w", err)
	}
	first := amqp10.ReceiverSettleModeFirst
	ss.rcv, err = sess.NewReceiver(ctx, queueAddress(queue), &amqp10.ReceiverOptions{Credit: int32(h.opt.Credit), SettlementMode: &first})
	if err != nil {
		return fmt.Errorf("consume %s over AMQP 1.0: %w", queue, err)
	}
	h.log.Info("holding", zap.String("queue", queue), zap.Int("credit", h.opt.Credit), zap.Duration("slice", h.opt.Rules.Slice))
	loopErr := ss.loop(ctx)
	closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Detach, then end, then close: each answered by the broker only once
	// it has read the dispositions written before it.
	if err := ss.rcv.Close(closeCtx); err != nil && loopErr == nil {
		loopErr = fmt.Errorf("detach from %s: %w", queue, err)
	}
	if err := sess.Close(closeCtx); err != nil && loopErr == nil {
		loopErr = fmt.Errorf("end AMQP 1.0 session: %w", err)
	}
	if ctx.Err() != nil {
		return nil
	}
	return loopErr
}

// followCommands reads the hold commands stream into ss.cmds, from the
// oldest command that may still last, when the stream exists. stop closes
// the connection and waits for the reader.
func (ss *session) followCommands(ctx context.Context) (stop func(), err error) {
	h := ss.h
	queue := h.opt.Rules.Topology.HoldCommandsQueue().Name
	conn, err := h.opt.Dialer.Dial(ctx, "hold commands")
	if err != nil {
		return nil, err
	}
	exists, err := declarer.QueueExists(conn, queue)
	if err != nil || !exists {
		conn.Close()
		return nil, err
	}
	from := h.opt.Now().Add(-lasts(h.opt.Rules.Slice))
	done, err := ss.cmds.follow(conn, queue, from, func(err error) { h.log.Warn("unreadable hold command, ignored", zap.Error(err)) })
	if err != nil {
		conn.Close()
		return nil, err
	}
	return func() {
		conn.Close()
		<-done
	}, nil
}

// loop settles each copy as it arrives, until ctx is cancelled or a
// settlement fails. It returns once every settler has ended: no
// settlement is in flight when the link is detached.
//
// There is a settler per unit of link credit, so every copy the broker
// has handed over can be in settlement at once, and a copy that waits on
// the broker (its home publish or park confirmed, or the answer to
// another copy's home publish, release.go) holds up its own settler, not
// the holding of the copies behind it; with eight settlers, eight due
// copies for an origin whose publish hung stopped all holding. The
// credit already bounds the copies in hand, so it bounds the settlers
// too. What it does not buy is speed: a go-amqp settlement returns once
// its frame is written, and on RabbitMQ 4.3.6 the holder waits on the
// broker, not on its writes (docs/delay-modes.md, measurement).
func (ss *session) loop(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	copies := make(chan *amqp10.Message)
	var settling sync.WaitGroup
	for range ss.h.opt.Credit {
		settling.Add(1)
		go func() {
			defer settling.Done()
			for msg := range copies {
				if err := ss.settle(ctx, msg); err != nil {
					cancel(err)
				}
			}
		}()
	}
	var err error
	for err == nil {
		var msg *amqp10.Message
		if msg, err = ss.rcv.Receive(ctx, nil); err != nil {
			break
		}
		select {
		case copies <- msg:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	close(copies)
	settling.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("receive from the hold queue: %w", err)
}

// settle judges msg and settles it. Its settlement is written before it
// returns; a copy whose settlement fails is returned by the broker when
// the link goes, and judged again.
func (ss *session) settle(ctx context.Context, msg *amqp10.Message) error {
	h := ss.h
	now := h.opt.Now()
	v := h.opt.Rules.judge(heldCopy{Annotations: msg.Annotations, Properties: msg.ApplicationProperties}, now, ss.cmds.active(now, h.opt.Rules.Slice))
	if v.Problem != "" {
		h.m.Invalid.Inc()
		h.log.Warn("held copy with untrusted headers", zap.Any("message_id", msg.Properties.MessageID),
			zap.String("origin", v.Origin), zap.String("problem", v.Problem), zap.Stringer("action", v.Action))
	}
	// Settlements are not abandoned at shutdown: the settlement of a copy
	// already judged is written, or its connection fails.
	settleCtx := context.WithoutCancel(ctx)
	var err error
	switch v.Action {
	case hold:
		annotations := amqp10.Annotations{headers.XOptDeliveryTime: v.Until.UnixMilli()}
		if _, annotated := msg.Annotations[h.opt.Rules.Codec.Names.DueAt]; annotated {
			// Rewritten clamped: a due time past the max delay would
			// otherwise be clamped again, from a later now, each slice.
			annotations[h.opt.Rules.Codec.Names.DueAt] = v.Due.UnixMilli()
		}
		err = ss.rcv.ModifyMessage(settleCtx, msg, &amqp10.ModifyMessageOptions{Annotations: annotations})
		if err == nil {
			h.m.held(now, h.opt.Rules.Slice)
		}
	case release:
		err = ss.release(ctx, settleCtx, msg, &v, now)
	case park:
		err = ss.parkCopy(ctx, settleCtx, msg, &v, now)
	}
	if err != nil {
		return fmt.Errorf("settle a held copy (%s): %w", v.Action, err)
	}
	h.m.Settled.WithLabelValues(v.Action.String()).Inc()
	return nil
}

// parkCopy parks msg as v says, then accepts it; a copy the parking
// queue did not take is held again (v.Action becomes hold). An error
// other than a settlement's leaves msg unsettled: the session ends, and
// the broker returns it to the hold queue with the link.
func (ss *session) parkCopy(ctx, settleCtx context.Context, msg *amqp10.Message, v *verdict, now time.Time) error {
	h := ss.h
	err := ss.park.publish(ctx, msg, *v, now)
	if errors.Is(err, errParkReturned) {
		// The parking queue is missing: the copy is held again, not
		// accepted, and parked when it comes back once the queue is.
		h.m.ParkReturned.Inc()
		until := now.Add(min(parkRetry, h.opt.Rules.Slice))
		h.log.Warn("the parking queue did not take a held copy; held again", zap.Any("message_id", msg.Properties.MessageID),
			zap.String("origin", v.Origin), zap.Time("until", until), zap.Error(err))
		v.Action = hold
		if err := ss.rcv.ModifyMessage(settleCtx, msg, &amqp10.ModifyMessageOptions{
			Annotations: amqp10.Annotations{headers.XOptDeliveryTime: until.UnixMilli()}}); err != nil {
			return err
		}
		h.m.held(now, h.opt.Rules.Slice)
		return nil
	}
	if err != nil {
		return err
	}
	return ss.rcv.AcceptMessage(settleCtx, msg)
}

// release sends msg, due, home the way the holder's homes choose
// (release.go): published, dead-lettered, or held while its origin
// refuses, and parked origin-refused once its policy's budget is spent.
// v.Action says what was done.
func (ss *session) release(ctx, settleCtx context.Context, msg *amqp10.Message, v *verdict, now time.Time) error {
	h := ss.h
	w, until, answered := h.homes.way(v.Origin, now)
	for w == wayAwait {
		select {
		case <-answered:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		now = h.opt.Now()
		w, until, answered = h.homes.way(v.Origin, now)
	}
	if _, whole := msg.Annotations[headers.HeldTables]; !whole && w == wayPublish {
		// Written by an earlier rebound: its AMQP 1.0 view may lack
		// headers, which dead-lettering keeps.
		h.homes.published(v.Origin)
		w = wayDeadLetter
	}
	if w == wayPublish {
		// The copies awaiting this publish are never left waiting: an
		// answer (accepted, refused, returned, forbidden) ends their wait
		// at once, no answer when this copy is done with.
		defer h.homes.published(v.Origin)
	}
	if w == wayPublish {
		out, err := ss.park.send(ctx, topology.Direct(v.Origin), rebuilt(msg))
		switch {
		case errors.Is(err, errNoWrite):
			if h.homes.forbidden() {
				// Hold mode's least privilege (deploy/README.md): not a fault.
				h.log.Info("no write access to the default exchange: due copies go home by dead-lettering, and an origin's refusals are not seen "+
					"(grant write on amq.default to see them)",
					zap.Error(err))
			}
			h.homes.published(v.Origin)
			w = wayDeadLetter
		case err != nil:
			return fmt.Errorf("send a held copy home to %s: %w", v.Origin, err)
		case out == sendAccepted:
			h.homes.accepted(v.Origin, now)
			h.m.Released.WithLabelValues("published").Inc()
			ss.observeLateness(*v, now)
			return ss.rcv.AcceptMessage(settleCtx, msg)
		case out == sendReturned:
			// No such queue: parked, as the sidecar parks a copy whose
			// origin does not exist.
			v.Action, v.Reason = park, policy.UnknownOrigin
			h.homes.published(v.Origin)
			h.log.Warn("the origin of a held copy does not exist; parked", zap.Any("message_id", msg.Properties.MessageID), zap.String("origin", v.Origin))
			return ss.parkCopy(ctx, settleCtx, msg, v, now)
		default: // nacked: the origin refuses
			h.m.OriginRefused.Inc()
			w, until = wayWait, now.Add(h.homes.refused(v.Origin, now))
		}
	}
	if w == wayDeadLetter {
		if err := ss.rcv.RejectMessage(settleCtx, msg, nil); err != nil {
			return err
		}
		h.m.Released.WithLabelValues("dead-lettered").Inc()
		ss.observeLateness(*v, now)
		return nil
	}
	return ss.waitForOrigin(ctx, settleCtx, msg, v, now, until)
}

// waitForOrigin holds msg, due, whose origin refuses copies until until,
// for that long, or parks it origin-refused once its policy's budget is
// spent (policy.Policy.Refused). Without a duration budget each wait
// counts as a retry: the copy's retry count is written up.
func (ss *session) waitForOrigin(ctx, settleCtx context.Context, msg *amqp10.Message, v *verdict, now, until time.Time) error {
	h := ss.h
	names := h.opt.Rules.Codec.Names
	s, _ := h.opt.Rules.Codec.Decode(rebuilt(msg).Headers, time.Time{}, now, nil)
	p := h.opt.Rules.Policies.For(v.Origin).Policy
	d := p.Refused(s.State, now, until.Sub(now))
	if !d.Retry {
		v.Action, v.Reason = park, policy.OriginRefused
		return ss.parkCopy(ctx, settleCtx, msg, v, now)
	}
	v.Action = hold
	back := now.Add(min(d.Delay, h.opt.Rules.Slice))
	annotations := amqp10.Annotations{headers.XOptDeliveryTime: back.UnixMilli()}
	if p.MaxDuration <= 0 {
		annotations[names.RetryCount] = int64(min(s.Retries+1, headers.MaxRetryCount))
	}
	if err := ss.rcv.ModifyMessage(settleCtx, msg, &amqp10.ModifyMessageOptions{Annotations: annotations}); err != nil {
		return err
	}
	h.m.held(now, h.opt.Rules.Slice)
	return nil
}

func (ss *session) observeLateness(v verdict, now time.Time) {
	if !v.Due.IsZero() {
		ss.h.m.Lateness.Observe(now.Sub(v.Due).Seconds())
	}
}

// parkRetry is how long a copy the parking queue did not take (returned
// unroutable: the queue is missing) is held before it is tried again; at
// most a slice.
const parkRetry = 10 * time.Second

// errParkReturned says the broker returned a parked copy unroutable: the
// parking queue is missing, and the copy was not parked.
var errParkReturned = errors.New("returned unroutable")

// parker publishes the copies a holder parks, and those it sends home
// itself (release.go), over AMQP 0-9-1, confirmed and mandatory, on a
// connection opened at the first. Publishes
// are one at a time, so a return received before a publish's ack is that
// publish's: the broker sends a publish's basic.return before its
// basic.ack, and amqp091-go's reader hands over the return before it
// completes the confirm.
type parker struct {
	h       *Holder
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  chan *amqp.Error
	mu      sync.Mutex
}

func (p *parker) publish(ctx context.Context, msg *amqp10.Message, v verdict, now time.Time) error {
	dest := p.h.opt.Rules.Topology.Parked()
	queue := dest.RoutingKey
	switch out, err := p.send(ctx, dest, parked(msg, p.h.opt.Rules.Codec.Names, v, now)); {
	case err != nil:
		return fmt.Errorf("park a held copy: %w", err)
	case out == sendReturned:
		return fmt.Errorf("park a held copy in %s: %w", queue, errParkReturned)
	case out == sendNacked:
		return fmt.Errorf("park a held copy in %s: nacked", queue)
	}
	return nil
}

// sendOutcome is what the broker made of a publish it answered.
type sendOutcome int

const (
	sendAccepted sendOutcome = iota // acked, not returned
	sendNacked                      // refused: the queue is full (reject-publish), or the like
	sendReturned                    // returned unroutable: no such queue
)

// errNoWrite says the broker refused rebound's user write access to the
// exchange of a publish.
var errNoWrite = errors.New("no write access to the exchange")

// send publishes pub to dest, mandatory, and waits for the broker's
// answer: a copy home goes through the default exchange (topology.Direct),
// a park through the topology's parking destination (topology.Parked,
// its own exchange in hold mode). An error says the publish has no
// answer (the channel or connection failed, or the wait timed out);
// errNoWrite is among them.
func (p *parker) send(ctx context.Context, dest topology.Destination, pub amqp.Publishing) (sendOutcome, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch != nil && p.ch.IsClosed() {
		p.reset()
	}
	if p.ch == nil {
		conn, err := p.h.opt.Dialer.Dial(ctx, "hold park")
		if err != nil {
			return 0, err
		}
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Confirm(false)
		}
		if err != nil {
			conn.Close()
			return 0, fmt.Errorf("open the publishing channel: %w", err)
		}
		// Buffered: the reader never waits on them, publishes being one
		// at a time and a channel closing once.
		p.conn, p.ch = conn, ch
		p.returns = ch.NotifyReturn(make(chan amqp.Return, 1))
		p.closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	}
	confirmCtx, cancel := context.WithTimeout(ctx, p.h.opt.ConfirmTimeout)
	defer cancel()
	confirm, err := p.ch.PublishWithDeferredConfirmWithContext(confirmCtx, dest.Exchange, dest.RoutingKey, true, false, pub)
	if err != nil {
		p.reset()
		return 0, err
	}
	ok, err := confirm.WaitContext(confirmCtx)
	if err == nil && !ok && p.ch.IsClosed() {
		// amqp091-go nacks what is pending when a channel closes: no answer.
		err = errors.New("channel closed")
		select {
		case cerr := <-p.closed:
			if cerr != nil && cerr.Code == amqp.AccessRefused {
				err = fmt.Errorf("%w: %v", errNoWrite, cerr)
			} else if cerr != nil {
				err = cerr
			}
		default:
		}
	}
	if err != nil {
		// A return that comes later would be taken for the next
		// publish's: the channel goes with this one.
		p.reset()
		return 0, fmt.Errorf("not confirmed: %w", err)
	}
	if !ok {
		return sendNacked, nil
	}
	select {
	case _, returned := <-p.returns:
		if returned {
			return sendReturned, nil
		}
		p.reset() // closed with the channel, after the ack
	default:
	}
	return sendAccepted, nil
}

// reset closes the parking connection; the next publish opens another.
func (p *parker) reset() {
	if p.conn != nil {
		p.conn.Close()
	}
	p.conn, p.ch, p.returns, p.closed = nil, nil, nil, nil
}

func (p *parker) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reset()
}
