// Package delayed operates on rebound's delay queues from outside the
// sidecar, for `rebound delayed` and `rebound topology prune`: it finds
// them, says what waits in each, sends waiting copies back to their
// origin queue now (flush) or parks them (cancel), and deletes the delay
// queues no replica uses.
//
// Finding them. The management API is not assumed, and AMQP cannot list
// queues, so Find declares passively every name a delay queue can have:
// delays are rounded to REBOUND_DELAY_DIGITS significant milliseconds, so
// between 1 ms and the longest delay the policies give there are at most
// 90 names a decade at two digits (486 up to an hour), each one round
// trip, spread over a few channels. Each name that does not exist costs
// the broker an error line in its log ("no queue ..."). A delay queue
// outside that range (an earlier configuration's longer delays, another
// precision) is found by widening it (the commands' --max-delay and
// --digits: the grid of three digits holds those of one and two). The
// queues of the rare detour (a delay whose queue the broker refused, sent
// through the one a millisecond longer) are off the grid and not found.
//
// Moving copies. Every copy is read once through a republisher.Mover, and
// removed only once the broker has confirmed where it went, so a command
// interrupted at any point loses nothing: at worst a copy is both moved
// and still waiting. Where a copy may go follows the sidecar's rules
// (package route).
//
// Whoever reads or deletes delay queues holds their lock
// (delayqueue.Lock): see delayqueue's lease.go for why.
//
// A Deployment is not safe for concurrent use; run one operation at a
// time.
package delayed

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/rebound-mq/rebound/internal/calendar"
	"github.com/rebound-mq/rebound/internal/delayqueue"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/policy"
)

// Deployment is the delay queues of one deployment, reached through one
// connection.
type Deployment struct {
	Conn *amqp.Connection
	// PubConn, if not nil, is where copies go out (Conn otherwise): a
	// connection that publishes is throttled by the broker, and reads on
	// it with it (see republisher.Mover.PublishThrough).
	PubConn *amqp.Connection
	// Router holds the deployment's topology (the allowlist of origins
	// among it), policies and header names.
	Router route.Router
	// ConfirmTimeout bounds the wait for the broker's confirm of a copy;
	// 0 means 30s.
	ConfirmTimeout time.Duration
	// Tracer, if not nil, gives each copy moved a span (package tracing).
	Tracer trace.Tracer
	// LockWait is how long an operation waits for the lock of the delay
	// queues while a replica holds it to sweep; 0 means 10s.
	LockWait time.Duration
}

// Queue is one delay queue found on the broker.
type Queue struct {
	Name      string
	Delay     time.Duration
	Messages  int // ready: a message a reader holds unacknowledged is not counted
	Consumers int
}

// Longest is the longest delay the policies of set can give a copy: the
// largest REBOUND_MAX_DELAY, or, for a policy with a retry rate budget,
// the furthest the budget defers a copy (calendar.Horizon and a second,
// rounded up), if longer.
func Longest(set policy.Set) time.Duration {
	var longest time.Duration
	for _, p := range set.All() {
		d := p.MaxDelay
		if p.RetryRate > 0 {
			d = max(d, p.RoundUp(calendar.Horizon+time.Second))
		}
		longest = max(longest, d)
	}
	return longest
}

// Delays is every delay a queue of the deployment can have: the grid of
// digits significant milliseconds up to longest (policy.Grid).
func Delays(digits int, longest time.Duration) []time.Duration {
	return policy.Grid(digits, longest)
}

// finders is how many channels Find declares on at once.
const finders = 8

// Find declares passively the delay queue of each delay of delays and
// returns those that exist, shortest first, with their counts. It stops
// early, with ctx's error, when ctx is done.
func (dp Deployment) Find(ctx context.Context, delays []time.Duration) ([]Queue, error) {
	work := make(chan time.Duration)
	var (
		mu    sync.Mutex
		found []Queue
		errs  []error
		wg    sync.WaitGroup
	)
	for range min(finders, max(len(delays), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ch *amqp.Channel
			defer func() {
				if ch != nil {
					ch.Close()
				}
			}()
			for d := range work {
				q, ok, err := dp.inspect(&ch, d)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else if ok {
					found = append(found, q)
				}
				mu.Unlock()
			}
		}()
	}
feed:
	for _, d := range delays {
		select {
		case work <- d:
		case <-ctx.Done():
			break feed
		}
		mu.Lock()
		failed := len(errs) > 0
		mu.Unlock()
		if failed {
			break
		}
	}
	close(work)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	slices.SortFunc(found, func(a, b Queue) int { return cmp.Compare(a.Delay, b.Delay) })
	return found, ctx.Err()
}

// inspect declares the delay queue of d passively on *ch, opening a
// channel when *ch is nil or closed (a miss closes it). ok is false when
// the queue does not exist.
func (dp Deployment) inspect(ch **amqp.Channel, d time.Duration) (Queue, bool, error) {
	if *ch == nil || (*ch).IsClosed() {
		c, err := dp.Conn.Channel()
		if err != nil {
			return Queue{}, false, fmt.Errorf("open channel: %w", err)
		}
		*ch = c
	}
	q, _ := dp.Router.Topology.DelayQueue(d)
	got, err := (*ch).QueueDeclarePassive(q.Name, true, false, false, false, nil)
	var aerr *amqp.Error
	switch {
	case err == nil:
		return Queue{Name: q.Name, Delay: d, Messages: got.Messages, Consumers: got.Consumers}, true, nil
	case errors.As(err, &aerr) && aerr.Code == amqp.NotFound:
		return Queue{}, false, nil
	}
	return Queue{}, false, fmt.Errorf("inspect delay queue %s: %w", q.Name, err)
}

// lock takes the lock of the delay queues on a channel of its own, and
// waits up to LockWait while another holds it (a replica sweeping holds
// it for a moment). unlock releases it.
func (dp Deployment) lock(ctx context.Context) (unlock func() error, err error) {
	wait := dp.LockWait
	if wait <= 0 {
		wait = 10 * time.Second
	}
	return delayqueue.Lock(ctx, dp.Conn, dp.Router.Topology, wait)
}
