package republisher

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/topology"
)

// ensureDelayQueue declares the delay queue for d once per Publisher and
// notes that it is in use. It returns the delay whose queue the copy goes
// through: d, or a millisecond or a few more when d's queue is unusable
// (see declareDelayQueue).
func (p *Publisher) ensureDelayQueue(d time.Duration) (time.Duration, error) {
	p.declMu.Lock()
	defer p.declMu.Unlock()
	asked := d.Milliseconds()
	if to, ok := p.detours[asked]; ok {
		d = to
	}
	ms := d.Milliseconds()
	p.mu.Lock()
	stale := p.stale[ms]
	delete(p.stale, ms)
	p.mu.Unlock()
	if stale {
		delete(p.declared, ms)
	}
	if _, ok := p.declared[ms]; !ok {
		used, err := p.declareDelayQueue(d)
		if err != nil {
			return 0, err
		}
		d, ms = used, used.Milliseconds()
		if ms != asked {
			// Keyed by the delay asked for, so that a detour's own
			// detour is found in one step.
			p.detours[asked] = used
		}
	}
	p.declared[ms] = p.now()
	return d, nil
}

// maxDetours is how many neighbouring delay queues declareDelayQueue tries
// after the one asked for.
const maxDetours = 3

// declareDelayQueue declares the delay queue for d, its exchange and their
// binding, and returns the delay whose queue it declared. A queue or
// exchange that exists with other arguments or of another type, or a
// queue left broken by a partition (see declareOrRepair), would otherwise
// end every session at the first copy that needs it, and that copy's inbox
// message would go round forever: instead the copy goes through the next
// millisecond's queue, a delay no policy can tell apart. Any other error,
// a refused permission or a connection error, is returned.
func (p *Publisher) declareDelayQueue(d time.Duration) (time.Duration, error) {
	var err error
	for range maxDetours + 1 {
		q, b := p.topo.DelayQueue(d)
		err = p.withDeclareChannel(func(ch *amqp.Channel) error { return p.topo.DelayExchangeFor(d).Declare(ch) })
		if err == nil {
			err = p.declareOrRepair(q)
		}
		if !unusable(err) {
			if err != nil {
				return 0, err
			}
			return d, p.withDeclareChannel(func(ch *amqp.Channel) error { return b.Declare(ch) })
		}
		p.notice(fmt.Sprintf("delay queue %s is unusable (%v): copies for it go through the next millisecond's delay queue", q.Name, err))
		d += time.Millisecond
	}
	return 0, fmt.Errorf("no usable delay queue in %d tries, up to %s: %w", maxDetours+1, d-time.Millisecond, err)
}

// unusable reports whether err is the broker refusing a delay queue or
// its exchange for good: PRECONDITION_FAILED (it exists with other
// arguments, or of another type) or NOT_FOUND (a broken queue that could
// not be repaired; a declaration never answers it otherwise).
func unusable(err error) bool {
	var amqpErr *amqp.Error
	return errors.As(err, &amqpErr) && (amqpErr.Code == amqp.PreconditionFailed || amqpErr.Code == amqp.NotFound)
}

// declareOrRepair declares q, repairing it when broken. On RabbitMQ 4.2
// and later (Khepri), a queue whose declaration timed out while its node
// was cut off from the majority can be left broken once the majority is
// back: every declaration of it then fails, after a minute, with
// NOT_FOUND ("failed to perform operation on queue ... due to timeout").
// Deleting a classic one (if empty: the broker refuses to delete a queue
// that holds a message, so no waiting copy can be lost) and declaring it
// again repairs it (seen on 4.3.6). A quorum queue is left as it is: the
// broker answers an if-empty delete of one by closing the connection.
func (p *Publisher) declareOrRepair(q topology.Queue) error {
	declare := q.Declare
	err := p.withDeclareChannel(declare)
	var amqpErr *amqp.Error
	if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.NotFound || p.topo.Quorum {
		return err
	}
	if err := p.deleteIfEmpty(q.Name); err != nil {
		return fmt.Errorf("delete broken delay queue %s: %w", q.Name, err)
	}
	if err := p.withDeclareChannel(declare); err != nil {
		return err
	}
	p.notice("delay queue " + q.Name + " was broken (declared while its node had lost the cluster's majority): deleted it, empty, and declared it again")
	return nil
}

// deleteIfEmpty deletes the classic queue name unless it holds a message.
func (p *Publisher) deleteIfEmpty(name string) error {
	return p.withDeclareChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(name, false, true, false)
		return err
	})
}

// DelayQueues lists the delay queues this Publisher has declared and not
// deleted since: the ones it knows to exist.
func (p *Publisher) DelayQueues() []string {
	p.declMu.Lock()
	defer p.declMu.Unlock()
	names := make([]string, 0, len(p.declared))
	for ms := range p.declared {
		q, _ := p.topo.DelayQueue(time.Duration(ms) * time.Millisecond)
		names = append(names, q.Name)
	}
	return names
}
