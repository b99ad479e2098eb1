package consumer

import (
	"errors"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// How often the watcher asks the broker. The inbox's consumer count sets
// this replica's share of the retry rate budget, so it is read twice a
// second: a replica that joins is counted within half a second, one that
// leaves within a second (setConsumers takes a lower count on the second
// reading). The other queues are for the gauges only, and read every
// 15 s.
const (
	inboxEvery  = 500 * time.Millisecond
	queuesEvery = 15 * time.Second
)

// watcher reads, with passive declarations, what waits in rebound's
// queues: the inbox (messages and consumers), the parking queue and the
// delay queues this replica has used. It runs on the consume connection,
// which never publishes and so is never blocked by a resource alarm. A
// declaration that fails (a queue gone closes the channel) is retried on
// a new channel at the next round; it never ends the session.
type watcher struct {
	ss   *session
	conn *amqp.Connection
	ch   *amqp.Channel
	stop chan struct{}
	done sync.WaitGroup

	reported map[string]bool // delay queues with a series in the gauge
	place    int             // the place this session's connection holds (PlaceQueue); -1 for none
	placeOff bool            // the broker refused a place: none is asked for again
}

// startWatcher starts the watcher of ss on conn; stopWatcher ends it.
func (ss *session) startWatcher(conn *amqp.Connection) *watcher {
	w := &watcher{ss: ss, conn: conn, stop: make(chan struct{}), reported: map[string]bool{}, place: -1}
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		w.run()
	}()
	return w
}

// close stops the watcher and removes the series of the delay queues it
// reported: the next session reports those it uses.
func (w *watcher) close() {
	close(w.stop)
	w.done.Wait()
	for name := range w.reported {
		w.ss.s.m.DelayQueueMessages.DeleteLabelValues(name)
	}
}

func (w *watcher) run() {
	inbox := time.NewTicker(inboxEvery)
	defer inbox.Stop()
	queues := time.NewTicker(queuesEvery)
	defer queues.Stop()
	w.inbox()
	w.queues()
	for {
		select {
		case <-w.stop:
			return
		case <-inbox.C:
			w.inbox()
		case <-queues.C:
			w.queues()
		}
	}
}

// channel returns the watcher's channel, opening a new one when the last
// was closed (a failed declaration closes it).
func (w *watcher) channel() (*amqp.Channel, error) {
	if w.ch == nil || w.ch.IsClosed() {
		ch, err := w.conn.Channel()
		if err != nil {
			return nil, err
		}
		w.ch = ch
	}
	return w.ch, nil
}

// inspect declares queue passively on the watcher's channel.
func (w *watcher) inspect(queue string) (amqp.Queue, error) {
	ch, err := w.channel()
	if err != nil {
		return amqp.Queue{}, err
	}
	return ch.QueueDeclarePassive(queue, true, false, false, false, nil)
}

// inbox reads the inbox's messages and consumers. When the consumer count
// cannot be read, the share goes on from the last one known (1 before
// any), with one warning per process.
func (w *watcher) inbox() {
	s := w.ss.s
	q, err := w.inspect(w.ss.router.Topology.InboxQueue)
	if err != nil {
		if s.consumerWarned.CompareAndSwap(false, true) {
			s.log.Warn("cannot read the inbox's consumer count; the retry rate budget's share goes on from the last one known",
				zap.Error(err), zap.Int64("consumers", s.consumers.Load()))
		}
		return
	}
	s.m.InboxMessages.Set(float64(q.Messages))
	s.m.InboxConsumers.Set(float64(q.Consumers))
	n := q.Consumers
	if counted := int(s.consumers.Load()); n < counted {
		// Fewer consumers than counted: a replica left, or one is
		// between two consumers (inbox.refit), which on a busy broker
		// can outlast two readings. The places tell them apart.
		if held, ok := w.placesHeld(counted); ok {
			n = max(n, held)
		}
	}
	s.setConsumers(n)
	w.takePlace(int(s.consumers.Load()))
}

// queues reads the parking queue and the delay queues this replica uses
// (those it has declared and not forgotten since: see
// delayqueue.Set.SweepIdle). The series of a delay queue it no longer uses, or
// that is gone, is removed, so that it does not report a stale count.
func (w *watcher) queues() {
	s := w.ss.s
	topo := w.ss.router.Topology
	if q, err := w.inspect(topo.ParkingQueue); err == nil {
		s.m.ParkedMessages.Set(float64(q.Messages))
	}
	using := map[string]bool{}
	for _, name := range w.ss.pub.Delays().Names() {
		select {
		case <-w.stop:
			return
		default:
		}
		using[name] = true
		if q, err := w.inspect(name); err == nil {
			s.m.DelayQueueMessages.WithLabelValues(name).Set(float64(q.Messages))
			w.reported[name] = true
		} else if isNotFound(err) {
			delete(using, name)
		}
	}
	for name := range w.reported {
		if !using[name] {
			s.m.DelayQueueMessages.DeleteLabelValues(name)
			delete(w.reported, name)
		}
	}
}

func isNotFound(err error) bool {
	var aerr *amqp.Error
	return errors.As(err, &aerr) && aerr.Code == amqp.NotFound
}
