package delayed

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
	"github.com/rebound-mq/rebound/republisher"
)

// Op is what Move does with the copies of the matching origin queues.
type Op int

// Ops.
const (
	// Flush sends them back to their origin queue now: what RabbitMQ 4.3's
	// quorum-queue delayed retry calls retry now.
	Flush Op = iota
	// Cancel parks them, reason cancelled.
	Cancel
)

// Options say what Move does.
type Options struct {
	Op Op
	// Origins selects the copies Op applies to by the queue they go back
	// to (their routing key, where the broker sends them when their delay
	// ends). Every other copy read goes back into a delay queue for the
	// time it still had to wait.
	Origins *regexp.Regexp
	DryRun  bool // report what would happen, change nothing
	// Progress, if not nil, is called after each copy read.
	Progress func(Progress)
}

// Progress is how far Move has come.
type Progress struct {
	Read, Total int // copies read, and how many the delay queues held when found
}

// What becomes of a copy Move reads.
type action int

const (
	toOrigin  action = iota // flush: straight back to its origin queue
	toParking               // cancel: parked, reason cancelled
	redelay                 // into the delay queue of the time it still had to wait
	leave                   // left where it is, to wait out its delay
	keep                    // matching, but left where it is: why says why
)

// step is what Move does with one copy: plan's answer.
type step struct {
	action action
	dest   topology.Destination
	msg    amqp.Publishing
	why    string // for leave and keep
	origin string // the copy's origin queue (route.Router.WaitingOrigin)
}

// Why a copy stays where it was, besides what route.Router.CheckOrigin
// says of its origin and republisher.Outcome.Why of a copy the broker
// did not take.
const (
	whyNoDueTime = "no due time (made by a rebound before x-retry-due-at): left to wait out its delay in place"
	whyDue       = "already due: left for the broker to send on as its delay ends"
)

// plan decides what becomes of d, a copy read from q, as of now. A copy
// goes back to its origin (route.Router.WaitingOrigin: the queue its
// routing key names, or its origin header for one that comes back
// through the inbox). One of a matching origin queue is sent there
// now (Flush), if the sidecar's rules let it (route.Router.CheckOrigin),
// or parked with reason cancelled (Cancel). Every other copy goes back
// into the delay queue of the time it still had to wait, from its due
// time (x-retry-due-at), rounded up and at most q's own delay: later,
// never earlier. One with no due time (a copy made by a rebound before
// the header) or already due is left where it is: requeued when the run
// lets go of it, it keeps its place in time.
func plan(r route.Router, q Queue, d amqp.Delivery, opt Options, now time.Time) step {
	s, _ := r.Codec.Decode(d.Headers, d.Timestamp, now, nil)
	origin := r.WaitingOrigin(d, s)
	claimed := ""
	if s.Origin != origin {
		claimed = s.Origin
	}
	o := r.CheckOrigin(origin, claimed)
	if opt.Origins.MatchString(origin) {
		if opt.Op == Cancel {
			rt := route.Route{Origin: o, Policy: r.Policies.For(o.Queue), Decision: policy.Decision{Reason: policy.Cancelled}}
			dest, msg := r.Plan(d, s, rt, now)
			return step{origin: origin, action: toParking, dest: dest, msg: msg}
		}
		if o.Refused != "" {
			return step{origin: origin, action: keep, why: o.Why}
		}
		dest, msg := r.Flush(d, o.Queue)
		return step{origin: origin, action: toOrigin, dest: dest, msg: msg}
	}
	if s.DueAt.IsZero() {
		return step{origin: origin, action: leave, why: whyNoDueTime}
	}
	wait := min(s.DueAt.Sub(now), q.Delay)
	if wait <= 0 {
		return step{origin: origin, action: leave, why: whyDue}
	}
	dest, msg := r.Redelay(d, origin, wait, s.DueAt)
	return step{origin: origin, action: redelay, dest: dest, msg: msg}
}

// Kept is a copy left where it was though Move would have moved it, and
// why.
type Kept struct {
	Queue  string // the delay queue it waits in
	ID     string // its message id
	Origin string
	Why    string
}

// Result is what Move did (in a dry run, would do).
type Result struct {
	Queues    int // delay queues read
	Read      int // copies read
	Matched   int // copies of the matching origin queues
	Sent      int // Flush: confirmed in their origin queue, and removed from their delay queue
	Parked    int // Cancel: confirmed in the parking queue, and removed
	Redelayed int // other copies confirmed back in a delay queue for their remaining time, and removed
	// Left counts, by why, the copies left where they were: no due time,
	// or already due.
	Left map[string]int
	Kept []Kept // copies left where they were though they were to move
}

// moveWindow is how many copies are in flight before Move waits for their
// confirms.
const moveWindow = 256

// Move reads every copy waiting in queues (as Find returned them) once and
// does with it what opt says (see plan), holding the lock of the delay
// queues throughout. A copy is removed only once the broker has confirmed
// the copy that replaces it and not returned it; every other one is
// requeued in place when its queue is done, or when the command ends,
// however it ends. Cancelling ctx stops the reading: the copies already
// sent are settled, and Move returns ctx's error with what it did.
func (dp Deployment) Move(ctx context.Context, queues []Queue, opt Options, now func() time.Time) (res Result, err error) {
	res.Left = map[string]int{}
	unlock, err := dp.lock(ctx)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, unlock()) }()
	var p Progress
	for _, q := range queues {
		p.Total += q.Messages
	}
	for _, q := range queues {
		if ctx.Err() != nil {
			break
		}
		if err := dp.moveQueue(ctx, q, opt, now, &res, &p); err != nil {
			return res, err
		}
		res.Queues++
	}
	return res, ctx.Err()
}

// moveQueue is Move on one delay queue.
func (dp Deployment) moveQueue(ctx context.Context, q Queue, opt Options, now func() time.Time, res *Result, p *Progress) (err error) {
	timeout := dp.ConfirmTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	m, err := republisher.OpenMover(dp.Conn, dp.Router.Topology, q.Name, moveWindow, timeout)
	if errors.Is(err, republisher.ErrNoQueue) {
		return nil // deleted since it was found (a replica swept it): nothing waited in it
	}
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, m.Close()) }()
	if dp.PubConn != nil {
		m.PublishThrough(dp.PubConn)
	}
	operation := "flush"
	if opt.Op == Cancel {
		operation = "cancel"
	}
	m.Trace(dp.Tracer, operation)
	for {
		d, ok, err := m.Next(ctx)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		res.Read++
		if p.Read++; p.Read > p.Total {
			p.Total = p.Read
		}
		st := plan(dp.Router, q, d, opt, now())
		if st.action == toOrigin || st.action == toParking {
			res.Matched++
		}
		kept := func(why string) {
			res.Kept = append(res.Kept, Kept{Queue: q.Name, ID: d.MessageId, Origin: st.origin, Why: why})
		}
		switch {
		case st.action == keep:
			res.Matched++
			kept(st.why)
		case st.action == leave:
			res.Left[st.why]++
		case opt.DryRun:
			res.count(st.action)
		default:
			if err := m.Move(d, st.dest, st.msg, res.outcome(st.action, kept)); err != nil {
				kept(republisher.WhyInterrupted)
				return fmt.Errorf("move a copy out of %s: %w", q.Name, err)
			}
		}
		if opt.Progress != nil {
			opt.Progress(*p)
		}
	}
	// A cancelled ctx ends reading, but what was sent is still settled, so
	// an interrupted run leaves few duplicates behind.
	return m.Settle()
}

// count counts one copy moved with action.
func (res *Result) count(a action) {
	switch a {
	case toOrigin:
		res.Sent++
	case toParking:
		res.Parked++
	case redelay:
		res.Redelayed++
	}
}

// outcome returns what records the outcome of a copy moved with action.
func (res *Result) outcome(a action, kept func(why string)) func(republisher.Outcome) {
	return func(o republisher.Outcome) {
		if o == republisher.Confirmed {
			res.count(a)
			return
		}
		kept(o.Why())
	}
}
