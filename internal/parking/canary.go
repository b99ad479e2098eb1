package parking

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"
)

// CanaryResult is what ReplayCanary did.
type CanaryResult struct {
	Canaries ReplayResult  // the replay of the first few
	Watched  time.Duration // how long it watched the parking queue
	// Back lists the canaries that came back parked while it watched:
	// then it replayed nothing more.
	Back []Message
	Rest ReplayResult // the replay of the rest, when none came back
}

// errNoCanary means no canary could be replayed, so there was nothing to
// watch; the rest stayed parked.
var errNoCanary = errors.New("no canary could be replayed")

// ReplayCanary tries a fix on a few messages before the many: it replays
// at most k of the messages f matches (ReplayWith), then watches the
// parking queue for wait, and if one of them comes back parked (the same
// message id and body, parked after the canaries went out), it stops
// there and reports it. Otherwise it replays the rest of the matching
// messages, within f's limit less the canaries, leaving those parked
// since the canaries went out (a canary that came back after the watch,
// or a failure no one has looked at yet). opt applies to both replays;
// announce, if not nil, is called once the canaries are out.
//
// It watches by reading the parking queue: every poll (or at least once a
// second) it asks the queue's length, and reads the queue whenever that
// changed since it last read it, and once more at the end.
func (q Queue) ReplayCanary(ctx context.Context, f Filter, k int, wait, poll time.Duration, now func() time.Time,
	opt ReplayOptions, announce func(ReplayResult)) (res CanaryResult, err error) {
	start := now()
	first := f
	first.Limit = k
	if f.Limit > 0 {
		first.Limit = min(k, f.Limit)
	}
	opt.Record = true
	if res.Canaries, err = q.ReplayWith(ctx, first, start, opt); err != nil {
		return res, err
	}
	if len(res.Canaries.Sent) == 0 {
		return res, errNoCanary
	}
	if announce != nil {
		announce(res.Canaries)
	}
	watching := now()
	res.Back, err = q.watch(ctx, res.Canaries.Sent, start, watching.Add(wait), poll, now)
	res.Watched = now().Sub(watching)
	if err != nil || len(res.Back) > 0 {
		return res, err
	}
	rest := f
	// Not the canaries coming back, nor anything parked after f's bound.
	rest.ParkedBefore = f.Bound(start)
	if f.Limit > 0 {
		if rest.Limit = f.Limit - res.Canaries.Matched; rest.Limit <= 0 {
			return res, nil
		}
	}
	opt.Record = false
	res.Rest, err = q.ReplayWith(ctx, rest, now(), opt)
	return res, err
}

// canaryKey identifies a replayed message when it comes back parked: its
// message id and a hash of its body, which the retries keep.
type canaryKey struct {
	id   string
	body [sha256.Size]byte
}

func keyOf(m Message) canaryKey {
	return canaryKey{id: m.ID(), body: sha256.Sum256(m.Delivery.Body)}
}

// watch returns the canaries that come back parked (after since) before
// until, reading the parking queue when its length changes and at the
// end.
func (q Queue) watch(ctx context.Context, canaries []Message, since, until time.Time, poll time.Duration, now func() time.Time) ([]Message, error) {
	keys := map[canaryKey]bool{}
	for _, m := range canaries {
		keys[keyOf(m)] = true
	}
	poll = min(max(poll, 10*time.Millisecond), time.Second)
	read := -1 // the queue's length when it was last read
	for {
		final := !now().Before(until)
		n, err := q.length()
		if err != nil {
			return nil, err
		}
		if n != read || final {
			back, err := q.cameBack(ctx, keys, since)
			if err != nil || len(back) > 0 {
				return back, err
			}
			read = n
		}
		if final {
			return nil, nil
		}
		t := time.NewTimer(min(poll, until.Sub(now())))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// cameBack reads the parking queue and returns the messages of keys
// parked after since.
func (q Queue) cameBack(ctx context.Context, keys map[canaryKey]bool, since time.Time) ([]Message, error) {
	l, err := q.List(ctx, Filter{}, time.Now())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", q.Name(), err)
	}
	var back []Message
	for _, m := range l.Messages {
		if keys[keyOf(m)] && !m.ParkedAt.Before(since.Truncate(time.Millisecond)) {
			back = append(back, m)
		}
	}
	return back, nil
}

// length is how many messages the parking queue holds, ready.
func (q Queue) length() (int, error) {
	ch, err := q.Conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	got, err := ch.QueueDeclarePassive(q.Name(), true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("inspect %s: %w", q.Name(), err)
	}
	return got.Messages, nil
}
