// Package delayqueue keeps rebound's delay queues over their life: it
// declares one on first use (Set.Ensure), through a neighbouring delay
// when the broker refuses it for good, declares it again after a copy came
// back from it, forgets and deletes idle ones (Set.SweepIdle), and runs
// the protocol that lets commands beside the sidecar move and delete
// delay queues safely: the replicas' leases and the lock (lease.go).
// `rebound topology prune` (internal/delayed) deletes them from outside
// under the same lock and leases.
package delayqueue

import (
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/topology"
)

// Set is the delay queues one connection has declared. Its methods may be
// called from any goroutine; all but Forget hold a lock across their
// round trips to the broker, so Forget is the one to call from a
// notification listener.
type Set struct {
	conn   *amqp.Connection
	topo   topology.Topology
	now    func() time.Time
	notice func(msg string)

	// mu guards ch, declared, detours and lockRefused. It is held across
	// declarations, which wait for the broker.
	mu          sync.Mutex
	ch          *amqp.Channel           // declarations and deletes; replaced when an error closes it
	declared    map[int64]time.Time     // delay queue (ms) -> last use
	detours     map[int64]time.Duration // unusable delay queue (ms) -> the delay used instead
	lockRefused bool                    // the broker refused the lock of the delay queues (noticed once)

	staleMu sync.Mutex     // guards stale; never held across I/O
	stale   map[int64]bool // delay queues (ms) a copy was returned from: declare them again
}

// New opens a Set on a channel of its own from conn. notice receives, for
// the log, what the Set worked around (a delay queue it could not use);
// nil drops it. now is the clock that says when a queue was last used.
func New(conn *amqp.Connection, topo topology.Topology, notice func(msg string), now func() time.Time) (*Set, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open declare channel: %w", err)
	}
	if notice == nil {
		notice = func(string) {}
	}
	return &Set{
		conn: conn, topo: topo, now: now, notice: notice, ch: ch,
		declared: map[int64]time.Time{}, detours: map[int64]time.Duration{}, stale: map[int64]bool{},
	}, nil
}

// Close closes the Set's channel.
func (s *Set) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.ch.Close()
}

// Forget says a copy came back from the delay queue of ms milliseconds
// (its exchange has no binding any more): the next Ensure of it declares
// it again. It never waits for the broker.
func (s *Set) Forget(ms int64) {
	s.staleMu.Lock()
	defer s.staleMu.Unlock()
	s.stale[ms] = true
}

// Ensure declares the delay queue for d once and notes that it is in
// use. It returns the delay whose queue a copy goes through: d, or a
// millisecond or a few more when d's queue is unusable (see declare).
func (s *Set) Ensure(d time.Duration) (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	asked := d.Milliseconds()
	if to, ok := s.detours[asked]; ok {
		d = to
	}
	ms := d.Milliseconds()
	s.staleMu.Lock()
	stale := s.stale[ms]
	delete(s.stale, ms)
	s.staleMu.Unlock()
	if stale {
		delete(s.declared, ms)
	}
	if _, ok := s.declared[ms]; !ok {
		used, err := s.declare(d)
		if err != nil {
			return 0, err
		}
		d, ms = used, used.Milliseconds()
		if ms != asked {
			// Keyed by the delay asked for, so that a detour's own
			// detour is found in one step.
			s.detours[asked] = used
		}
	}
	s.declared[ms] = s.now()
	return d, nil
}

// maxDetours is how many neighbouring delay queues declare tries after
// the one asked for.
const maxDetours = 3

// declare declares the delay queue for d, its exchange and their binding,
// and returns the delay whose queue it declared. A queue or exchange that
// exists with other arguments or of another type, or a queue left broken
// by a partition (see declareOrRepair), would otherwise end every session
// at the first copy that needs it, and that copy's inbox message would go
// round forever: instead the copy goes through the next millisecond's
// queue, a delay no policy can tell apart. Any other error, a refused
// permission or a connection error, is returned.
func (s *Set) declare(d time.Duration) (time.Duration, error) {
	var err error
	for range maxDetours + 1 {
		q, b := s.topo.DelayQueue(d)
		err = s.withChannel(func(ch *amqp.Channel) error { return declarer.Exchange(ch, s.topo.DelayExchangeFor(d)) })
		if err == nil {
			err = s.declareOrRepair(q)
		}
		if !unusable(err) {
			if err != nil {
				return 0, err
			}
			return d, s.withChannel(func(ch *amqp.Channel) error { return declarer.Binding(ch, b) })
		}
		s.notice(fmt.Sprintf("delay queue %s is unusable (%v): copies for it go through the next millisecond's delay queue", q.Name, err))
		d += time.Millisecond
	}
	return 0, fmt.Errorf("no usable delay queue in %d tries, up to %s: %w", maxDetours+1, d-time.Millisecond, err)
}

// unusable reports whether err is the broker refusing a delay queue or
// its exchange for good: PRECONDITION_FAILED (it exists with other
// arguments, or of another type) or NOT_FOUND (a broken queue that could
// not be repaired; a declaration never answers it otherwise).
func unusable(err error) bool {
	return isCode(err, amqp.PreconditionFailed) || isCode(err, amqp.NotFound)
}

func isCode(err error, code int) bool {
	var aerr *amqp.Error
	return errors.As(err, &aerr) && aerr.Code == code
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
func (s *Set) declareOrRepair(q topology.Queue) error {
	declare := func(ch *amqp.Channel) error { return declarer.Queue(ch, q) }
	err := s.withChannel(declare)
	if !isCode(err, amqp.NotFound) || s.topo.Quorum {
		return err
	}
	if err := s.deleteIfEmpty(q.Name); err != nil {
		return fmt.Errorf("delete broken delay queue %s: %w", q.Name, err)
	}
	if err := s.withChannel(declare); err != nil {
		return err
	}
	s.notice("delay queue " + q.Name + " was broken (declared while its node had lost the cluster's majority): deleted it, empty, and declared it again")
	return nil
}

// deleteIfEmpty deletes the classic queue name unless it holds a message.
func (s *Set) deleteIfEmpty(name string) error {
	return s.withChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(name, false, true, false)
		return err
	})
}

// Names lists the delay queues the Set has declared and not deleted or
// forgotten since: the ones it knows to exist, which its lease names.
func (s *Set) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.declared))
	for ms := range s.declared {
		q, _ := s.topo.DelayQueue(time.Duration(ms) * time.Millisecond)
		names = append(names, q.Name)
	}
	return names
}

// SweepIdle forgets the delay queues the Set declared that have had no
// use for idle, or for twice their delay if that is longer: it declares
// one again on its next use, and its lease no longer names it (see
// Lease), so that `rebound topology prune` may delete it. With remove, it
// first deletes those that are classic and empty, and returns their
// names. The broker refuses to delete a queue that still holds a message
// (if-empty), so nothing waiting in one is lost; a copy published by
// another replica just as the queue goes is returned, requeued, and the
// queue is declared again. A message a `rebound delayed` command has read
// and not yet settled is invisible to if-empty, so the sweep holds the
// lock of the delay queues (Lock), and when another rebound holds it, it
// skips this round. When the broker refuses rebound's user the lock, it
// deletes nothing: someone else may hold it.
//
// Quorum queues are never deleted here: RabbitMQ refuses if-empty deletes
// on them with a connection error, and deleting without it could drop a
// copy published between a check and the delete (`rebound topology
// prune` closes that window first).
func (s *Set) SweepIdle(idle time.Duration, remove bool) (deleted []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var stale []int64
	for ms, last := range s.declared {
		if now.Sub(last) >= max(idle, 2*time.Duration(ms)*time.Millisecond) {
			stale = append(stale, ms)
		}
	}
	if len(stale) == 0 {
		return nil, nil
	}
	if !remove || s.topo.Quorum {
		for _, ms := range stale {
			delete(s.declared, ms)
		}
		return nil, nil
	}
	switch err := s.withChannel(func(ch *amqp.Channel) error { return tryLock(ch, s.topo) }); {
	case errors.Is(err, errLocked):
		return nil, nil
	case errors.Is(err, errLockRefused):
		// Permissions from before the lock. A command run as another
		// user (the console runs as whoever signed in) may still hold
		// the lock and messages of these queues unacked, which if-empty
		// does not see: forget the idle queues, delete none.
		if !s.lockRefused {
			s.lockRefused = true
			s.notice(err.Error() + "; idle delay queues are forgotten, not deleted (`rebound topology prune` deletes them)")
		}
		for _, ms := range stale {
			delete(s.declared, ms)
		}
		return nil, nil
	case err != nil:
		return nil, err
	default:
		defer func() {
			if uerr := s.withChannel(func(ch *amqp.Channel) error { return unlock(ch, s.topo) }); uerr != nil {
				err = errors.Join(err, uerr)
			}
		}()
	}
	for _, ms := range stale {
		q, _ := s.topo.DelayQueue(time.Duration(ms) * time.Millisecond)
		err := s.deleteIfEmpty(q.Name)
		switch {
		case err == nil:
			delete(s.declared, ms)
			deleted = append(deleted, q.Name)
		case isCode(err, amqp.NotFound):
			delete(s.declared, ms) // gone already: declare it again on next use
		case isCode(err, amqp.PreconditionFailed):
			s.declared[ms] = now // not empty: look again after another idle period
		default:
			return deleted, fmt.Errorf("delete idle delay queue %s: %w", q.Name, err)
		}
	}
	return deleted, nil
}

// withChannel runs f on the Set's channel, replacing the channel when f's
// error closed it (a 404 or 406 does).
func (s *Set) withChannel(f func(*amqp.Channel) error) error {
	if s.ch.IsClosed() {
		ch, err := s.conn.Channel()
		if err != nil {
			return fmt.Errorf("reopen declare channel: %w", err)
		}
		s.ch = ch
	}
	return f(s.ch)
}
