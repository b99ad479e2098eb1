package republisher

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrCheckRefused is QueueExists's answer when the broker refuses the
// check: RabbitMQ 4.2.6 and later want a permission on a queue for a
// passive declaration of it.
var ErrCheckRefused = errors.New("passive queue.declare refused: RabbitMQ 4.2.6 and later want a permission on the queue")

// QueueExists reports whether queue exists in conn's virtual host, with a
// passive declaration on a channel of its own (a miss closes it). Before
// RabbitMQ 4.2.6 a passive declaration needs no permission; 4.2.6 and
// 4.3.0 want configure on the queue, later releases any permission
// (rabbitmq-server#16272), and without it the answer is ErrCheckRefused.
// Any other answer but the queue or NOT_FOUND is an error, not a guess.
func QueueExists(conn *amqp.Connection, queue string) (bool, error) {
	err := withChannel(conn, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
	var amqpErr *amqp.Error
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound:
		return false, nil
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp.AccessRefused:
		return false, fmt.Errorf("check queue %s: %w: %w", queue, ErrCheckRefused, err)
	}
	return false, fmt.Errorf("check queue %s: %w", queue, err)
}

// OriginExists reports whether queue exists on the broker (QueueExists),
// checking at most once a minute per queue. A copy sent towards a queue
// that does not exist would be dropped by the broker when its delay ends.
//
// Where the broker refuses the check (ErrCheckRefused), the queue counts
// as existing unless a copy sent straight to it through the default
// exchange came back in the last minute: the default exchange routes to
// the queue its key names whenever that queue exists, so a return is the
// broker's own word that it does not. The notice says so once per queue.
func (p *Publisher) OriginExists(queue string) (bool, error) {
	p.declMu.Lock()
	defer p.declMu.Unlock()
	now := p.now()
	if seen, ok := p.origins[queue]; ok && now.Sub(seen) < originRecheck {
		return true, nil
	}
	if refused, ok := p.unchecked[queue]; ok && now.Sub(refused) < originRecheck {
		return !p.returnedSince(queue, now.Add(-originRecheck)), nil
	}
	exists, err := QueueExists(p.conn, queue)
	if errors.Is(err, ErrCheckRefused) {
		if _, ok := p.unchecked[queue]; !ok {
			p.notice("cannot check whether origin queue " + queue + " exists (" + ErrCheckRefused.Error() + "): copies towards it go on; " +
				"once one sent straight to it comes back, the next are parked unknown-origin. Grant rebound a permission on the application queues " +
				"to check them (deploy/README.md, Permissions)")
		}
		p.unchecked[queue] = now
		return !p.returnedSince(queue, now.Add(-originRecheck)), nil
	}
	if err != nil {
		return false, err
	}
	delete(p.unchecked, queue)
	if exists {
		p.origins[queue] = now
	} else {
		delete(p.origins, queue)
	}
	return exists, nil
}

// returnedSince reports whether a copy sent straight to queue was returned
// after since.
func (p *Publisher) returnedSince(queue string, since time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.returned[queue]
	return ok && at.After(since)
}
