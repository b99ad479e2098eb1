package republisher

import (
	"errors"
	"time"

	"github.com/rebound-mq/rebound/internal/topology"
)

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
	exists, err := topology.QueueExists(p.conn, queue)
	if errors.Is(err, topology.ErrCheckRefused) {
		if _, ok := p.unchecked[queue]; !ok {
			p.notice("cannot check whether origin queue " + queue + " exists (" + topology.ErrCheckRefused.Error() + "): copies towards it go on; " +
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
