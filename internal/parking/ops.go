package parking

import (
	"cmp"
	"context"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/republisher"
)

// listing is what List found.
type listing struct {
	Scanned  int       // messages read from the queue
	Matched  int       // messages read that matched the filter
	Messages []Message // the matches
	// ByReason and ByOrigin count the matches by parked reason and by
	// origin queue ("" when unknown).
	ByReason, ByOrigin map[string]int
	// Limited says List stopped reading at the filter's limit; Unread is
	// how many messages it left unread then.
	Limited bool
	Unread  int
}

// List reads the messages once, up to the filter's limit of matches, and
// returns the matching ones, leaving them all in the queue. Everything it
// counts covers what it read.
func (q Queue) List(ctx context.Context, f Filter, now time.Time) (l listing, err error) {
	l.ByReason, l.ByOrigin = map[string]int{}, map[string]int{}
	l.Scanned, l.Matched, l.Unread, l.Limited, err = q.scan(ctx, f, now, func(m Message) {
		l.ByReason[m.Reason]++
		l.ByOrigin[m.Origin]++
		l.Messages = append(l.Messages, m)
	})
	return l, err
}

// Visit reads the messages once, as List does, and hands each match to
// visit instead of keeping it: for a reader whose memory should grow with
// what it keeps, not with the queue (the console's groups page). It
// returns how many messages it read and matched.
func (q Queue) Visit(ctx context.Context, f Filter, now time.Time, visit func(Message)) (scanned, matched int, err error) {
	scanned, matched, _, _, err = q.scan(ctx, f, now, visit)
	return scanned, matched, err
}

// scan reads the messages once, up to the filter's limit of matches, and
// calls visit with each match, leaving them all in the queue. unread is
// how many of the messages the queue held it did not read; limited says it
// stopped at the limit.
func (q Queue) scan(ctx context.Context, f Filter, now time.Time, visit func(Message)) (scanned, matched, unread int, limited bool, err error) {
	scanned, unread, err = q.browse(ctx, func(d amqp.Delivery) bool {
		m := q.decode(d, now)
		if f.match(m, now) {
			matched++
			visit(m)
		}
		limited = f.Limit > 0 && matched >= f.Limit
		return !limited
	})
	return scanned, matched, unread, limited, errors.Join(err, ctx.Err())
}

// Purge removes the matching messages (at most the filter's limit) and
// returns how many it read and removed.
func (q Queue) Purge(ctx context.Context, f Filter, now time.Time) (scanned, removed int, err error) {
	r, err := q.open()
	if err != nil {
		return 0, 0, err
	}
	defer func() { err = errors.Join(err, r.Close()) }()
	var matched int
	err = q.eachMatch(ctx, r, f, now, &scanned, &matched, func(d amqp.Delivery, _ Message) (bool, error) {
		if err := r.Remove(d); err != nil {
			return false, err
		}
		removed++
		return true, nil
	})
	return scanned, removed, errors.Join(err, ctx.Err())
}

// eachMatch reads the queue once through r and hands each message f
// matches, with its delivery, to act, until the queue's end, f's limit of
// matches, or act says stop (false) or fails; scanned and matched count
// what it read and matched as it goes (act sees them up to date). It is
// the loop of every operation that moves messages (Purge, ReplayWith,
// Expire): each settles the deliveries act leaves through r.
func (q Queue) eachMatch(ctx context.Context, r *republisher.Mover, f Filter, now time.Time, scanned, matched *int,
	act func(amqp.Delivery, Message) (bool, error)) error {
	for f.Limit == 0 || *matched < f.Limit {
		d, ok, err := r.Next(ctx)
		if err != nil || !ok {
			return err
		}
		*scanned++
		m := q.decode(d, now)
		if !f.match(m, now) {
			continue
		}
		*matched++
		if more, err := act(d, m); err != nil || !more {
			return err
		}
	}
	return nil
}

// Kept is a matching message a replay left parked, and why.
type Kept struct {
	Message Message
	Why     string
}

// whyOriginMissing is why a matching message was not replayed when its
// origin queue does not exist; route.Router.CheckOrigin says why for the
// other origins refused, republisher.Outcome.Why for the copies the
// broker did not take.
const whyOriginMissing = "origin queue does not exist"

// ReplayOptions say how a replay runs.
type ReplayOptions struct {
	DryRun bool // report what would be replayed, change nothing
	// Rate is the most copies a second the replay sends, held over the
	// run; 0 sends them as fast as the broker confirms them.
	Rate float64
	// Record lists the replayed messages in ReplayResult.Sent.
	Record bool
	// To, if set, redirects: every match goes to this queue instead of
	// its origin, which the redirected-from header records. The queue
	// must pass the rules an origin passes (route.Router.CheckOrigin).
	To string
	// Progress, if not nil, is called with each matching message read,
	// before the replay acts on it, with what it has done so far
	// (Replayed and Kept as they stand then): the console follows a replay
	// with it.
	Progress func(ReplayResult)
}

// ReplayResult is what ReplayWith did.
type ReplayResult struct {
	Scanned  int    // messages read from the queue
	Matched  int    // matches acted on (at most the limit)
	Replayed int    // confirmed back in their origin queue and removed from the parking queue (or, dry run, would be)
	Kept     []Kept // matches left parked
	// Unchecked counts, in a dry run, the messages of Replayed whose
	// origin queue the broker would not let rebound check (RabbitMQ 4.2.6
	// and later refuse a passive declaration without a permission on the
	// queue): a dry run cannot tell whether those queues exist, and a
	// replay keeps parked any copy the broker returns.
	Unchecked int
	// Sent lists the messages replayed, with ReplayOptions.Record.
	Sent []Message
	// Took is how long the copies took to go out, from the first to the
	// last one's confirm.
	Took time.Duration
}

// replayBatch is how many copies are in flight before ReplayWith waits for
// their confirms.
const replayBatch = 256

// ReplayWith sends each matching message back to its origin queue through
// the default exchange (mandatory, with publisher confirms), with the retry
// state reset as of now (route.Router.Replay), and removes the parked copy
// only once the broker has confirmed the new one and not returned it. A
// message whose origin is unknown, one of rebound's own queues, not
// allowed by the allowlist or missing stays parked and is reported in
// Kept: the sidecar's rules (route.Router.CheckOrigin). With opt.DryRun
// nothing is published or removed; Replayed counts what would be. It is
// paced and recorded as opt says.
func (q Queue) ReplayWith(ctx context.Context, f Filter, now time.Time, opt ReplayOptions) (res ReplayResult, err error) {
	dryRun := opt.DryRun
	pace := pacer{rate: opt.Rate}
	r, err := q.open()
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, r.Close()) }()
	// The sidecar's check: a copy sent straight to an origin the broker
	// will not let rebound check, and returned, says it does not exist.
	origins := declarer.NewOrigins(q.Conn, r.ReturnedSince, nil, time.Now)
	err = q.eachMatch(ctx, r, f, now, &res.Scanned, &res.Matched, func(d amqp.Delivery, m Message) (bool, error) {
		if opt.Progress != nil {
			opt.Progress(res)
		}
		target := cmp.Or(opt.To, m.Origin)
		if o := q.Router.CheckOrigin(target, ""); o.Refused != "" {
			res.Kept = append(res.Kept, Kept{m, o.Why})
			return true, nil
		}
		// Replayed copies are mandatory: one for a queue that does not
		// exist comes back, and its message is kept.
		found, checked, err := origins.Exists(target)
		if err != nil {
			return false, err
		}
		if !found {
			res.Kept = append(res.Kept, Kept{m, whyOriginMissing})
			return true, nil
		}
		if dryRun {
			res.Replayed++
			if !checked {
				res.Unchecked++
			}
			return true, nil
		}
		if err := pace.wait(ctx); err != nil {
			return false, nil // interrupted: m stays parked, and was not sent
		}
		dest, msg := q.Router.Replay(d, m.Origin, now)
		if opt.To != "" {
			dest, msg = q.Router.Redirect(d, m.Origin, opt.To, now)
		}
		if err := r.Move(d, dest, msg, res.outcome(m, opt.Record)); err != nil {
			res.Kept = append(res.Kept, Kept{m, republisher.WhyInterrupted})
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return res, err
	}
	// A cancelled ctx ends reading, but what was published is still
	// settled, so an interrupted replay leaves few duplicates behind.
	if err := r.Settle(); err != nil {
		return res, err
	}
	res.Took = pace.took()
	return res, ctx.Err()
}

// pacer holds a replay to a rate: the n-th copy (from 0) goes out no
// sooner than n/rate seconds after the first, so that over any run the
// rate is at most the one asked for, and close to it when the broker
// keeps up.
type pacer struct {
	rate  float64 // copies a second; 0: no pacing
	start time.Time
	sent  int
}

// wait waits for the next copy's turn, or for ctx.
func (p *pacer) wait(ctx context.Context) error {
	if p.sent == 0 {
		p.start = time.Now()
	}
	p.sent++
	if p.rate <= 0 {
		return ctx.Err()
	}
	at := p.start.Add(time.Duration(float64(p.sent-1) / p.rate * float64(time.Second)))
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-ctx.Done():
		p.sent--
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// took is the time since the first copy's turn; 0 before it.
func (p *pacer) took() time.Duration {
	if p.sent == 0 {
		return 0
	}
	return time.Since(p.start)
}

// outcome returns what records the outcome of m's copy in res, and lists
// m in res.Sent when confirmed with record.
func (res *ReplayResult) outcome(m Message, record bool) func(republisher.Outcome) {
	return func(o republisher.Outcome) {
		if o != republisher.Confirmed {
			res.Kept = append(res.Kept, Kept{m, o.Why()})
			return
		}
		res.Replayed++
		if record {
			res.Sent = append(res.Sent, m)
		}
	}
}
