package parking

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/republisher"
)

// Listing is what List found.
type Listing struct {
	Scanned  int       // messages read from the queue
	Matched  int       // messages that matched the filter, limit aside
	Messages []Message // matches, at most the filter's limit
	// ByReason and ByOrigin count every match, limit aside, by parked
	// reason and by origin queue ("" when unknown).
	ByReason, ByOrigin map[string]int
}

// List reads every message once and returns the matching ones, leaving
// them all in the queue.
func (q Queue) List(ctx context.Context, f Filter, now time.Time) (l Listing, err error) {
	l.ByReason, l.ByOrigin = map[string]int{}, map[string]int{}
	r, err := q.open()
	if err != nil {
		return l, err
	}
	defer func() {
		if cerr := r.close(); err == nil {
			err = cerr
		}
	}()
	for {
		d, ok, err := r.next(ctx)
		if err != nil || !ok {
			return l, errors.Join(err, ctx.Err())
		}
		l.Scanned++
		m := q.Decode(d, now)
		if !f.Match(m, now) {
			continue
		}
		l.Matched++
		l.ByReason[m.Reason]++
		l.ByOrigin[m.Origin]++
		if f.Limit == 0 || len(l.Messages) < f.Limit {
			l.Messages = append(l.Messages, m)
		}
	}
}

// Purge removes the matching messages (at most the filter's limit) and
// returns how many it read and removed.
func (q Queue) Purge(ctx context.Context, f Filter, now time.Time) (scanned, removed int, err error) {
	r, err := q.open()
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		if cerr := r.close(); err == nil {
			err = cerr
		}
	}()
	for f.Limit == 0 || removed < f.Limit {
		d, ok, err := r.next(ctx)
		if err != nil || !ok {
			return scanned, removed, errors.Join(err, ctx.Err())
		}
		scanned++
		if !f.Match(q.Decode(d, now), now) {
			continue
		}
		if err := r.ack(d); err != nil {
			return scanned, removed, err
		}
		removed++
	}
	return scanned, removed, nil
}

// Kept is a matching message a replay left parked, and why.
type Kept struct {
	Message Message
	Why     string
}

// Why a matching message was not replayed, besides what
// republisher.Topology.CheckOrigin says of its origin.
const (
	WhyOriginMissing = "origin queue does not exist"
	WhyReturned      = "returned by the broker: origin queue not routable"
	WhyNacked        = "broker refused the copy (nack)"
	WhyUnconfirmed   = "copy not confirmed in time (it may have been delivered too)"
	WhyInterrupted   = "interrupted before the copy was confirmed (it may have been delivered too)"
)

// ReplayResult is what Replay did.
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
}

// replayBatch is how many copies are in flight before Replay waits for
// their confirms.
const replayBatch = 256

type inFlight struct {
	d  amqp.Delivery
	m  Message
	dc *amqp.DeferredConfirmation
}

// Replay sends each matching message back to its origin queue through the
// default exchange (mandatory, with publisher confirms), with the retry
// state reset by Codec.Replay as of now, and removes the parked copy only
// once the broker has confirmed the new one and not returned it. A message
// whose origin is unknown, one of rebound's own queues, not allowed by
// OriginAllowed or missing stays parked and is reported in Kept: the
// sidecar's rules. With dryRun nothing is published or removed; Replayed
// counts what would be.
func (q Queue) Replay(ctx context.Context, f Filter, now time.Time, dryRun bool) (res ReplayResult, err error) {
	r, err := q.open()
	if err != nil {
		return res, err
	}
	defer func() {
		if cerr := r.close(); err == nil {
			err = cerr
		}
	}()
	exists := map[string]bool{}    // origin queue -> whether it exists
	unchecked := map[string]bool{} // origin queues the broker refused to check

	var pub *amqp.Channel
	var returns chan amqp.Return
	if !dryRun {
		if pub, err = q.Conn.Channel(); err != nil {
			return res, fmt.Errorf("open publishing channel: %w", err)
		}
		defer pub.Close()
		if err := pub.Confirm(false); err != nil {
			return res, fmt.Errorf("enable publisher confirms: %w", err)
		}
		// Every copy in a batch can come back: room for all, so the
		// library's reader never blocks on this channel.
		returns = pub.NotifyReturn(make(chan amqp.Return, replayBatch))
	}
	var batch []inFlight
	for f.Limit == 0 || res.Matched < f.Limit {
		d, ok, err := r.next(ctx)
		if err != nil {
			return res, err
		}
		if !ok {
			break
		}
		res.Scanned++
		m := q.Decode(d, now)
		if !f.Match(m, now) {
			continue
		}
		res.Matched++
		if check := q.Topology.CheckOrigin(headers.State{Origin: m.Origin}, q.OriginAllowed); check.Refused != "" {
			res.Kept = append(res.Kept, Kept{m, check.Why})
			continue
		}
		found, checked := exists[m.Origin]
		if !checked {
			found, err = republisher.QueueExists(q.Conn, m.Origin)
			if errors.Is(err, republisher.ErrCheckRefused) {
				// Replayed copies are mandatory: one for a queue that
				// does not exist comes back, and its message is kept.
				found, err = true, nil
				unchecked[m.Origin] = true
			}
			if err != nil {
				return res, err
			}
			exists[m.Origin] = found
		}
		if !found {
			res.Kept = append(res.Kept, Kept{m, WhyOriginMissing})
			continue
		}
		if dryRun {
			res.Replayed++
			if unchecked[m.Origin] {
				res.Unchecked++
			}
			continue
		}
		dc, err := pub.PublishWithDeferredConfirmWithContext(ctx, "", m.Origin, true, false, q.replayCopy(d, m.Origin, now))
		if err != nil {
			res.Kept = append(res.Kept, Kept{m, WhyInterrupted})
			break
		}
		batch = append(batch, inFlight{d: d, m: m, dc: dc})
		if len(batch) == replayBatch {
			if err := q.settle(r, batch, returns, &res); err != nil {
				return res, err
			}
			batch = batch[:0]
		}
	}
	// A cancelled ctx ends reading, but what was published is still
	// settled, so an interrupted replay leaves few duplicates behind.
	if len(batch) > 0 {
		if err := q.settle(r, batch, returns, &res); err != nil {
			return res, err
		}
	}
	return res, ctx.Err()
}

// settle waits for the batch's confirms and acks each parked delivery
// whose copy was confirmed and not returned.
func (q Queue) settle(r *reader, batch []inFlight, returns <-chan amqp.Return, res *ReplayResult) error {
	timeout := q.ConfirmTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	// Not the caller's context: on interrupt, copies already sent are
	// still confirmed and their parked originals removed.
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	acked := make([]bool, len(batch))
	unknownFrom := len(batch) // copies from here on have an unknown fate
	var waitErr error
	for i, p := range batch {
		ok, err := p.dc.WaitContext(ctx)
		if err != nil {
			waitErr, unknownFrom = err, i
			break
		}
		acked[i] = ok
	}
	// amqp091-go hands a basic.return to the NotifyReturn channel before
	// it reads the confirm that follows it, so once the batch is confirmed
	// every return for it is waiting here. A return carries no publish
	// sequence number: every copy of the batch to a returned routing key
	// stays parked (a copy that got through is then a duplicate, never a
	// loss).
	returned := map[string]bool{}
	for drained := false; !drained; {
		select {
		case ret, ok := <-returns:
			if !ok {
				// The channel died: the library closes its return
				// listeners, and a closed channel is always ready. The
				// confirms above failed with it, so nothing is acked.
				drained = true
				break
			}
			returned[ret.RoutingKey] = true
		default:
			drained = true
		}
	}
	for i, p := range batch {
		switch {
		case i >= unknownFrom:
			res.Kept = append(res.Kept, Kept{p.m, WhyUnconfirmed})
		case !acked[i]:
			res.Kept = append(res.Kept, Kept{p.m, WhyNacked})
		case returned[p.m.Origin]:
			res.Kept = append(res.Kept, Kept{p.m, WhyReturned})
		default:
			if err := r.ack(p.d); err != nil {
				return err
			}
			res.Replayed++
		}
	}
	if waitErr != nil {
		return fmt.Errorf("wait for confirms: %w", waitErr)
	}
	return nil
}

// replayCopy is the publishing sent back to origin: body and properties
// kept, retry state reset, except the user id (the broker refuses one that
// is not the connection's own user) and expiration (rebound never parks a
// message with one).
func (q Queue) replayCopy(d amqp.Delivery, origin string, now time.Time) amqp.Publishing {
	return republisher.Copy(d, q.Codec.Replay(d.Headers, origin, now))
}
