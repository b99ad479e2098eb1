package declarer

import (
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// errCheckRefused is queueExists's answer when the broker refuses the
// check: RabbitMQ 4.2.6 and later want a permission on a queue for a
// passive declaration of it.
var errCheckRefused = errors.New("passive queue.declare refused: RabbitMQ 4.2.6 and later want a permission on the queue")

// QueueExists reports whether queue exists in conn's virtual host, with a
// passive declaration on a channel of its own (a miss closes it). Before
// RabbitMQ 4.2.6 a passive declaration needs no permission; 4.2.6 and
// 4.3.0 want configure on the queue, later releases any permission
// (rabbitmq-server#16272), and without it the answer is errCheckRefused.
// Any other answer but the queue or NOT_FOUND is an error, not a guess.
func QueueExists(conn *amqp.Connection, queue string) (bool, error) {
	err := withChannel(conn, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
	switch {
	case err == nil:
		return true, nil
	case isCode(err, amqp.NotFound):
		return false, nil
	case isAccessRefused(err):
		return false, fmt.Errorf("check queue %s: %w: %w", queue, errCheckRefused, err)
	}
	return false, fmt.Errorf("check queue %s: %w", queue, err)
}

// originRecheck is how long a queue seen to exist is trusted to still
// exist, and how long a copy returned from one says it does not.
const originRecheck = time.Minute

// Origins answers whether origin queues exist: the one check that the
// consumer makes before it sends a copy back towards a queue, and
// `rebound parked replay` before it replays a message. A copy sent
// towards a queue that does not exist would be dropped by the broker when
// its delay ends. It is safe for concurrent use.
type Origins struct {
	conn *amqp.Connection
	// returned reports whether a copy sent straight to queue through the
	// default exchange came back after since; nil when none is sent.
	returned func(queue string, since time.Time) bool
	notice   func(msg string)
	now      func() time.Time

	mu        sync.Mutex           // held across the check: one at a time per connection
	seen      map[string]time.Time // origin queue -> when it was last seen to exist
	unchecked map[string]time.Time // origin queues the broker refused to check, and when
	// uncheckedLimit bounds unchecked: origin names come from headers, and
	// a producer that forges a new one on every message must not grow it.
	uncheckedLimit int
}

// maxUnchecked is far more origin queues than a vhost has.
const maxUnchecked = 4096

// rememberUnchecked notes that the broker refused to check queue. When the
// bound is reached it forgets the refusals that no longer count; if that
// frees nothing, queue is not remembered and its next copy asks the broker
// again, which costs a round trip, never a wrong answer.
func (o *Origins) rememberUnchecked(queue string, now time.Time) {
	if _, ok := o.unchecked[queue]; !ok && len(o.unchecked) >= o.uncheckedLimit {
		for q, refused := range o.unchecked {
			if now.Sub(refused) >= originRecheck {
				delete(o.unchecked, q)
			}
		}
		if len(o.unchecked) >= o.uncheckedLimit {
			return
		}
	}
	o.unchecked[queue] = now
}

// NewOrigins checks origin queues on conn. returned (may be nil) is the
// publisher's word on the copies it sent straight to a queue
// (republisher.Publisher.ReturnedSince); notice (may be nil) receives, for
// the log, the queues the broker will not let rebound check; now is the
// clock.
func NewOrigins(conn *amqp.Connection, returned func(queue string, since time.Time) bool, notice func(msg string), now func() time.Time) *Origins {
	if returned == nil {
		returned = func(string, time.Time) bool { return false }
	}
	if notice == nil {
		notice = func(string) {}
	}
	return &Origins{conn: conn, returned: returned, notice: notice, now: now, seen: map[string]time.Time{}, unchecked: map[string]time.Time{}, uncheckedLimit: maxUnchecked}
}

// Exists reports whether queue exists, checking at most once every
// originRecheck per queue a queue seen to exist. checked is false when the
// broker refused the check (RabbitMQ 4.2.6 and later want a permission on
// the queue): the queue then counts as existing unless a copy sent
// straight to it came back within originRecheck, since the default
// exchange routes to the queue its key names whenever that queue exists:
// a return is the broker's own word that it does not. The notice says so
// once per queue.
func (o *Origins) Exists(queue string) (exists, checked bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	if seen, ok := o.seen[queue]; ok && now.Sub(seen) < originRecheck {
		return true, true, nil
	}
	if refused, ok := o.unchecked[queue]; ok && now.Sub(refused) < originRecheck {
		return !o.returned(queue, now.Add(-originRecheck)), false, nil
	}
	exists, err = QueueExists(o.conn, queue)
	if errors.Is(err, errCheckRefused) {
		if _, ok := o.unchecked[queue]; !ok {
			o.notice("cannot check whether origin queue " + queue + " exists (" + errCheckRefused.Error() + "): copies towards it go on; " +
				"once one sent straight to it comes back, the next are parked unknown-origin. Grant rebound a permission on the application queues " +
				"to check them (deploy/README.md, Permissions)")
		}
		o.rememberUnchecked(queue, now)
		return !o.returned(queue, now.Add(-originRecheck)), false, nil
	}
	if err != nil {
		return false, false, err
	}
	delete(o.unchecked, queue)
	if exists {
		o.seen[queue] = now
	} else {
		delete(o.seen, queue)
	}
	return exists, true, nil
}
