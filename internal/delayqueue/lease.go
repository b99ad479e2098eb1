package delayqueue

// What lets commands run beside the sidecar move and delete delay queues
// safely: the leases in which running replicas name the delay queues they
// use, and the lock that keeps one reader or deleter of the delay queues
// at a time.
//
// A delay queue cannot tell who uses it: the broker keeps no time of last
// publish that AMQP can read, and a replica that believes a queue exists
// publishes to its exchange without declaring it again, so deleting that
// exchange under it would close its channel. Each replica therefore
// publishes, at least every minute, a lease naming the delay queues it
// has declared and not yet forgotten (it forgets one idle for
// REBOUND_DELAY_QUEUE_IDLE, and declares it again on next use), into the
// in-use queue, each lease expiring after three refreshes. `rebound
// topology prune` deletes no leased queue.
//
// A message read and not yet acknowledged (`rebound delayed` holds every
// message it reads until it has moved it, and a dry run holds them all
// until it ends) is invisible to a queue.delete if-empty and to a passive
// declaration's count: deleting its queue then would lose it when it is
// requeued. So whoever reads or deletes delay queues holds the lock, an
// exclusive queue, which the broker gives one connection at a time and
// deletes when that connection closes: `rebound delayed flush` and
// `cancel` for their whole run, `rebound topology prune`, and each
// replica while it sweeps its idle classic delay queues.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/topology"
)

// Lease names the delay queues one replica uses. Each lease names all of
// them, so a replica's newest lease supersedes its older ones, which wait
// in the in-use queue until they expire.
type Lease struct {
	Replica string   `json:"replica"` // the replica's host and a per-process id
	Queues  []string `json:"queues"`  // delay queues it may publish to without declaring them again
	// Sequence counts the replica's leases from 1, so that a reader takes
	// its newest whatever order it reads them in; 0 when unknown.
	Sequence uint64 `json:"sequence,omitempty"`
}

// publishing returns the lease as a message that the broker drops after
// ttl.
func (l Lease) publishing(ttl time.Duration) amqp.Publishing {
	body, _ := json.Marshal(l) // strings only: cannot fail
	return amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent,
		Expiration: strconv.FormatInt(max(ttl.Milliseconds(), 1), 10), Body: body,
	}
}

// ReadLease reads a lease a replica published.
func ReadLease(body []byte) (Lease, error) {
	var l Lease
	if err := json.Unmarshal(body, &l); err != nil {
		return Lease{}, fmt.Errorf("read lease: %w", err)
	}
	return l, nil
}

// errLocked means another connection holds the lock of the delay queues.
var errLocked = errors.New("another rebound holds the lock of the delay queues (`rebound delayed flush` or `cancel`, `rebound topology prune`, or a replica sweeping idle delay queues)")

// errLockRefused means the broker refuses the lock for want of a
// permission (configure on the lock queue): permissions from before it.
var errLockRefused = errors.New("no permission to take the lock of the delay queues: grant rebound's user configure on it (deploy/rabbitmq/setup.sh)")

// Lock takes the lock of t's delay queues for conn, waiting up to wait
// while another connection holds it (a replica sweeping holds it for a
// moment), then giving up with an error that says who may hold it.
// release releases it; so does closing conn.
func Lock(ctx context.Context, conn *amqp.Connection, t topology.Topology, wait time.Duration) (release func() error, err error) {
	deadline := time.Now().Add(wait)
	for {
		ch, err := conn.Channel()
		if err != nil {
			return nil, fmt.Errorf("open channel: %w", err)
		}
		err = tryLock(ch, t)
		if err == nil {
			return func() error {
				defer ch.Close()
				return unlock(ch, t)
			}, nil
		}
		if !errors.Is(err, errLocked) || time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tryLock takes the lock of t's delay queues for ch's connection: it
// declares the lock queue, exclusive. It returns errLocked when another
// connection holds it; the broker then closes ch. The lock is released by
// unlock, or when the connection closes.
func tryLock(ch *amqp.Channel, t topology.Topology) error {
	_, err := ch.QueueDeclare(t.LockQueue(), false, false, true, false, nil)
	if isCode(err, amqp.ResourceLocked) {
		return errLocked
	}
	if isCode(err, amqp.AccessRefused) {
		return fmt.Errorf("%w: %w", errLockRefused, err)
	}
	if err != nil {
		return fmt.Errorf("lock delay queues: %w", err)
	}
	return nil
}

// unlock releases the lock tryLock took on ch's connection.
func unlock(ch *amqp.Channel, t topology.Topology) error {
	if _, err := ch.QueueDelete(t.LockQueue(), false, false, false); err != nil {
		return fmt.Errorf("unlock delay queues: %w", err)
	}
	return nil
}

// PublishLease publishes l into the in-use queue, expiring after ttl. It
// is not confirmed: a lease lost is replaced at the next refresh.
func (s *Set) PublishLease(l Lease, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.withChannel(func(ch *amqp.Channel) error {
		if err := ch.PublishWithContext(context.Background(), "", s.topo.InUseQueue(), false, false, l.publishing(ttl)); err != nil {
			return fmt.Errorf("publish lease: %w", err)
		}
		return nil
	})
}
