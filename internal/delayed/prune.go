package delayed

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/delayqueue"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/republisher"
)

// leases is what the replicas' leases say (delayqueue.Lease).
type leases struct {
	Replicas map[string]bool // the replicas that published a lease still alive
	Queues   map[string]bool // the delay queues they lease
	// NoQueue says the in-use queue does not exist: no replica of a
	// rebound with leases has run since it was deleted.
	NoQueue bool
	Unread  int // leases that could not be read (not JSON)
}

// ReadLeases reads every lease waiting in the in-use queue once, leaving
// them there. Call it holding the lock: a reader holds the leases it has
// read, and another reading meanwhile would miss them.
func (dp Deployment) ReadLeases(ctx context.Context) (l leases, err error) {
	l.Replicas, l.Queues = map[string]bool{}, map[string]bool{}
	m, err := republisher.OpenMover(dp.Conn, dp.Router.Topology, dp.Router.Topology.InUseQueue(), 1, time.Second)
	if errors.Is(err, republisher.ErrNoQueue) {
		l.NoQueue = true
		return l, nil
	}
	if err != nil {
		return l, err
	}
	defer func() { err = errors.Join(err, m.Close()) }()
	// Each replica's newest lease names every queue it still uses: an
	// older one may name a queue it has since forgotten (and a sweep
	// deleted), and counting it would keep prune off that queue until the
	// old lease expires. A lease without a sequence is counted whole.
	newest := map[string]delayqueue.Lease{}
	for {
		d, ok, err := m.Next(ctx)
		if err != nil || !ok {
			for _, lease := range newest {
				for _, q := range lease.Queues {
					l.Queues[q] = true
				}
			}
			return l, errors.Join(err, ctx.Err())
		}
		lease, err := delayqueue.ReadLease(d.Body)
		if err != nil {
			l.Unread++
			continue
		}
		l.Replicas[lease.Replica] = true
		if lease.Sequence == 0 {
			for _, q := range lease.Queues {
				l.Queues[q] = true
			}
			continue
		}
		if seen, ok := newest[lease.Replica]; !ok || lease.Sequence > seen.Sequence {
			newest[lease.Replica] = lease
		}
	}
}

// pruned is a delay queue Prune found, and what it did with it.
type pruned struct {
	Queue
	Deleted bool   // deleted with its exchange (dry run: would be)
	Why     string // why it was kept; "" when deleted
}

// Why Prune keeps a delay queue.
const (
	whyLeased     = "a running replica uses it (its lease names it)"
	whyMessages   = "holds messages"
	whyConsumers  = "has consumers"
	whyRedeclared = "a replica declared it again while it was being deleted"
)

// pruneResult is what Prune did.
type pruneResult struct {
	Leases leases
	// InboxConsumers is the inbox's consumer count: rebound's running
	// replicas, each of which publishes a lease.
	InboxConsumers int
	Queues         []pruned // every delay queue found, shortest first
	// ExchangesTried counts the delay exchanges Prune deleted if unused
	// because their queue was gone (a replica's sweep deletes the queue
	// and leaves the exchange); a missing one costs nothing, and the
	// broker does not say which existed.
	ExchangesTried int
}

// ErrUnleased means more replicas consume the inbox than have published a
// lease: some replica's use of the delay queues cannot be seen (a rebound
// from before leases, or one started within the last second).
var ErrUnleased = errors.New("more replicas consume the inbox than have published a lease of the delay queues they use")

// Prune deletes, with their exchanges, the delay queues of delays that
// are empty, have no consumer and are leased by no running replica,
// holding the lock of the delay queues throughout; with dryRun it deletes
// nothing and says what it would delete. It refuses (ErrUnleased, before
// deleting anything) when the inbox has more consumers than replicas have
// published leases. It then deletes, if unused, the exchange of each delay
// whose queue is gone and that no lease names.
//
// Classic and quorum queues alike, a queue is deleted only when nothing
// can be in it: RabbitMQ refuses an if-empty (or if-unused) delete of a
// quorum queue, with a connection error, so Prune checks and closes the
// way in first (see deleteQueue).
func (dp Deployment) Prune(ctx context.Context, delays []time.Duration, dryRun bool) (res pruneResult, err error) {
	unlock, err := dp.lock(ctx)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, unlock()) }()
	if res.Leases, err = dp.ReadLeases(ctx); err != nil {
		return res, fmt.Errorf("read leases: %w", err)
	}
	if res.InboxConsumers, err = dp.consumers(dp.Router.Topology.InboxQueue); err != nil {
		return res, err
	}
	if res.InboxConsumers > len(res.Leases.Replicas) && !dryRun {
		return res, fmt.Errorf("%w (%d consumers, %d leases): run it again once every replica runs this version, or in a minute",
			ErrUnleased, res.InboxConsumers, len(res.Leases.Replicas))
	}
	found, err := dp.Find(ctx, delays)
	if err != nil {
		return res, err
	}
	present := map[time.Duration]bool{}
	for _, q := range found {
		present[q.Delay] = true
		pr := pruned{Queue: q}
		switch {
		case res.Leases.Queues[q.Name]:
			pr.Why = whyLeased
		case q.Messages > 0:
			pr.Why = whyMessages
		case q.Consumers > 0:
			pr.Why = whyConsumers
		case dryRun:
			pr.Deleted = true
		default:
			if err := ctx.Err(); err != nil {
				return res, err
			}
			if pr.Why, err = dp.deleteQueue(q); err != nil {
				return res, err
			}
			pr.Deleted = pr.Why == ""
		}
		res.Queues = append(res.Queues, pr)
	}
	if dryRun {
		return res, nil
	}
	ch, err := dp.Conn.Channel()
	if err != nil {
		return res, fmt.Errorf("open channel: %w", err)
	}
	defer func() { closeChannel(ch) }()
	for _, d := range delays {
		q, _ := dp.Router.Topology.DelayQueue(d)
		if present[d] || res.Leases.Queues[q.Name] {
			continue
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		if ch.IsClosed() {
			if ch, err = dp.Conn.Channel(); err != nil {
				return res, fmt.Errorf("open channel: %w", err)
			}
		}
		// If unused: a replica that has just declared it and bound its
		// queue keeps it (the broker refuses, closing the channel).
		err := ch.ExchangeDelete(dp.Router.Topology.DelayExchangeFor(d).Name, true, false)
		if err != nil && !isCode(err, amqp.PreconditionFailed) {
			return res, fmt.Errorf("delete delay exchange %s: %w", dp.Router.Topology.DelayExchangeFor(d).Name, err)
		}
		res.ExchangesTried++
	}
	return res, nil
}

// deleteQueue deletes q, found empty and unleased, and its exchange, and
// returns why it did not when it did not. No copy can be lost, classic or
// quorum, and with no if-empty delete (quorum queues refuse it):
//
//  1. the exchange is deleted: no copy routes to q any more;
//  2. an exchange of the same name and another type (direct) is declared
//     in its place, so that a replica that would declare the pair again
//     now is refused (it sends that delay's copies through the next
//     millisecond's queue instead: its detour), and cannot bind q;
//  3. q is checked again: a copy routed before step 1 is there now, and
//     then the exchange and its binding are restored and q is kept;
//  4. q is deleted: nothing could have entered it since step 3;
//  5. the stand-in exchange is deleted: a replica declares the pair anew
//     on its next use.
//
// A message a reader holds unacknowledged is not counted in step 3; the
// lock keeps rebound's own readers away meanwhile.
func (dp Deployment) deleteQueue(q Queue) (why string, err error) {
	topo := dp.Router.Topology
	exchange := topo.DelayExchangeFor(q.Delay)
	queue, binding := topo.DelayQueue(q.Delay)
	ch, err := dp.Conn.Channel()
	if err != nil {
		return "", fmt.Errorf("open channel: %w", err)
	}
	defer func() { closeChannel(ch) }()
	if err := ch.ExchangeDelete(exchange.Name, false, false); err != nil {
		return "", fmt.Errorf("delete delay exchange %s: %w", exchange.Name, err)
	}
	standIn := topology.Exchange{Name: exchange.Name, Kind: amqp.ExchangeDirect}
	if err := declarer.Exchange(ch, standIn); err != nil {
		if isCode(err, amqp.PreconditionFailed) {
			return whyRedeclared, nil // a replica declared the fanout one since step 1: it is in use
		}
		return "", err
	}
	got, err := ch.QueueDeclarePassive(queue.Name, true, false, false, false, nil)
	if err != nil && !isCode(err, amqp.NotFound) {
		return "", fmt.Errorf("inspect delay queue %s: %w", queue.Name, err)
	}
	if ch.IsClosed() {
		if ch, err = dp.Conn.Channel(); err != nil {
			return "", fmt.Errorf("open channel: %w", err)
		}
	}
	if err == nil && (got.Messages > 0 || got.Consumers > 0) {
		// Put the way in back as it was.
		if err := ch.ExchangeDelete(exchange.Name, false, false); err != nil {
			return "", fmt.Errorf("delete stand-in exchange %s: %w", exchange.Name, err)
		}
		if err := declarer.Exchange(ch, exchange); err != nil {
			return "", err
		}
		if err := declarer.Binding(ch, binding); err != nil {
			return "", err
		}
		if got.Messages > 0 {
			return whyMessages, nil
		}
		return whyConsumers, nil
	}
	if _, err := ch.QueueDelete(queue.Name, false, false, false); err != nil {
		return "", fmt.Errorf("delete delay queue %s: %w", queue.Name, err)
	}
	if err := ch.ExchangeDelete(exchange.Name, false, false); err != nil {
		return "", fmt.Errorf("delete stand-in exchange %s: %w", exchange.Name, err)
	}
	return "", nil
}

// consumers is queue's consumer count, 0 when it does not exist.
func (dp Deployment) consumers(queue string) (int, error) {
	ch, err := dp.Conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("open channel: %w", err)
	}
	defer closeChannel(ch)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if isCode(err, amqp.NotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("inspect %s: %w", queue, err)
	}
	return q.Consumers, nil
}

func isCode(err error, code int) bool {
	var aerr *amqp.Error
	return errors.As(err, &aerr) && aerr.Code == code
}

// closeChannel closes ch unless the broker closed it already.
func closeChannel(ch *amqp.Channel) {
	if !ch.IsClosed() {
		_ = ch.Close()
	}
}
