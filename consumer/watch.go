package consumer

import (
	"errors"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/internal/topology"
)

// How often the watcher asks the broker. The inbox's consumer count sets
// this replica's share of the retry rate budget, so it is read twice a
// second: a replica that joins is counted within half a second, one that
// leaves within a second (setConsumers takes a lower count on the second
// reading). The other queues are for the gauges only, and read every
// 15 s by default (Options.QueuesEvery).
const (
	inboxEvery         = 500 * time.Millisecond
	defaultQueuesEvery = 15 * time.Second
	// sharePeers is how many replicas read the inbox every inboxEvery for
	// their share of a retry rate; with more, each reads it that much
	// less often, so that all of them together ask about as often as
	// sharePeers do. A replica that joins is then seen late by the
	// others, each of which overshoots its share by 1/N meanwhile: 2 %
	// at 50 replicas, where the same 1 replica missed among 2 would be
	// 100 %.
	sharePeers = 5
)

// The kinds of rebound_broker_calls_total.
const (
	callInbox      = "inbox"       // a passive declaration of the inbox
	callParked     = "parked"      // of the parking queue
	callDelayQueue = "delay-queue" // of a delay queue
	callWatch      = "watch"       // joining the watch (declare, publish the token, consume)
	callLease      = "lease"       // a lease of the delay queues this replica uses
	callPlace      = "place"       // a declaration of a place among the replicas, taken or probed (place.go)
)

var brokerCallKinds = []string{callInbox, callParked, callDelayQueue, callWatch, callLease, callPlace}

// watcher reads, with passive declarations, what waits in rebound's
// queues: the inbox (messages and consumers), the parking queue and the
// delay queues this replica has used. It runs on the consume connection,
// which never publishes and so is never blocked by a resource alarm. A
// declaration that fails (a queue gone closes the channel) is retried on
// a new channel at the next round; it never ends the session.
//
// The numbers are the vhost's, the same whichever replica reads them, so
// only the replica that holds the watch token (topology.JoinWatch) reads
// them for the gauges: N replicas cost the broker what one does, and
// export one set of series. The others read only the inbox's consumer
// count (their share of a retry rate and their place among the replicas
// need it), less often the more replicas there are (shareEvery).
// A replica the broker refuses the watch queue (permissions from before
// it) reads everything, as every replica did before the watch.
type watcher struct {
	ss   *session
	conn *amqp.Connection
	ch   *amqp.Channel
	stop chan struct{}
	done sync.WaitGroup

	// watchCh carries the watch queue's consumer; tokens its deliveries,
	// nil while this replica is not a candidate (to join again at the
	// next round).
	watchCh *amqp.Channel
	tokens  <-chan amqp.Delivery
	leader  bool // holds the token, or leads alone (refused the watch)
	refused bool // the broker refused the watch queue: lead alone

	nextShare time.Time // when a follower next reads the inbox for its share
	lower     lowerReadings

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

// close stops the watcher and removes the series it reported: the next
// session, or another replica, reports them.
func (w *watcher) close() {
	close(w.stop)
	w.done.Wait()
	w.setLeader(false)
}

func (w *watcher) run() {
	inbox := time.NewTicker(inboxEvery)
	defer inbox.Stop()
	queues := time.NewTicker(w.ss.s.opt.QueuesEvery)
	defer queues.Stop()
	w.join()
	w.inbox()
	w.queues()
	for {
		select {
		case <-w.stop:
			return
		case _, ok := <-w.tokens:
			if !ok {
				// The channel closed under the consumer: no longer a
				// candidate, let alone the leader, until it joins again.
				w.tokens = nil
				w.setLeader(false)
				continue
			}
			// Held unacknowledged until the connection closes: the
			// broker then gives the token to the next candidate.
			w.setLeader(true)
			w.inbox()
			w.queues()
		case <-inbox.C:
			w.inbox()
		case <-queues.C:
			if w.tokens == nil && !w.refused {
				w.join()
			}
			w.queues()
		}
	}
}

// join makes this replica a candidate for the watch token. Refused a
// permission, it leads alone from then on (one warning per process).
//
// The token is consumed on the publishing connection, not on the consume
// connection the rest of the watcher uses: the meter beneath the consume
// connection takes every delivery on it for an inbox delivery. The one
// publish (the token, at joining) waits out a resource alarm like any
// other.
func (w *watcher) join() {
	s := w.ss.s
	ch, err := w.ss.pubConn.Channel()
	if err != nil {
		return // the connection is going: the session ends
	}
	s.m.BrokerCalls.WithLabelValues(callWatch).Add(3)
	tokens, err := w.ss.router.Topology.JoinWatch(ch, s.replica+" watch")
	switch {
	case errors.Is(err, topology.ErrWatchRefused):
		w.refused = true
		w.setLeader(true)
		if s.watchWarned.CompareAndSwap(false, true) {
			s.log.Warn(topology.ErrWatchRefused.Error(), zap.Error(err))
		}
		return
	case err != nil:
		_ = ch.Close()
		return
	}
	w.watchCh, w.tokens = ch, tokens
}

// setLeader records whether this replica reports the queue gauges; one
// that stops removes its series, which the new leader reports.
func (w *watcher) setLeader(leader bool) {
	m := w.ss.s.m
	w.leader = leader
	if leader {
		m.WatchLeader.Set(1)
		return
	}
	m.WatchLeader.Set(0)
	m.InboxMessages.Reset()
	m.ParkedMessages.Reset()
	for name := range w.reported {
		m.DelayQueueMessages.DeleteLabelValues(name)
		delete(w.reported, name)
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

// inspect declares queue passively on the watcher's channel, and counts
// the call as kind.
func (w *watcher) inspect(queue, kind string) (amqp.Queue, error) {
	ch, err := w.channel()
	if err != nil {
		return amqp.Queue{}, err
	}
	w.ss.s.m.BrokerCalls.WithLabelValues(kind).Inc()
	return ch.QueueDeclarePassive(queue, true, false, false, false, nil)
}

// inbox reads the inbox's messages and consumers: on the leader every
// time, for the gauges; on the others every shareEvery, for the count.
// When the count cannot be read, the share goes on from the last one
// known (1 before any), with one warning per process.
func (w *watcher) inbox() {
	s := w.ss.s
	if !w.leader && s.opt.Now().Before(w.nextShare) {
		return
	}
	inbox := w.ss.router.Topology.InboxQueue
	q, err := w.inspect(inbox, callInbox)
	if err != nil {
		if s.consumerWarned.CompareAndSwap(false, true) {
			s.log.Warn("cannot read the inbox's consumer count; the retry rate budget's share goes on from the last one known",
				zap.Error(err), zap.Int64("consumers", s.consumers.Load()))
		}
		return
	}
	if w.leader {
		s.m.InboxMessages.WithLabelValues(inbox).Set(float64(q.Messages))
	}
	s.m.InboxConsumers.Set(float64(q.Consumers))
	n := q.Consumers
	if counted := int(s.consumers.Load()); w.lower.probe(n, counted) {
		if held, ok := w.placesHeld(counted); ok {
			n = max(n, held)
		}
	}
	s.setConsumers(n)
	w.takePlace(int(s.consumers.Load()))
	w.nextShare = s.opt.Now().Add(shareEvery(q.Consumers) - inboxEvery/2)
}

// lowerReadings decides when a reading of the inbox's consumers below the
// count calls for probing the places (placesHeld), which tell a replica
// that left from one between two consumers (inbox.refit).
//
// Only the second lower reading in a row is probed: after the first,
// setConsumers holds the count until the next reading anyway. Most lower
// readings are a replica between two consumers for a moment, as every
// replica is after each burst (its inbox window changes); probing each
// would cost every replica that reads it up to N declarations, and a
// channel for each place held, per dip: N × N across the fleet. A leave is
// still counted at the second reading, as setConsumers takes it.
type lowerReadings struct {
	once bool // the last reading was lower, and not probed
}

// probe reports whether a reading of n consumers, with counted in use,
// should probe the places.
func (l *lowerReadings) probe(n, counted int) bool {
	switch {
	case max(n, 1) >= counted: // this replica consumes: at least 1
		l.once = false
		return false
	case !l.once:
		l.once = true
		return false
	default:
		l.once = false // the next probe waits for two lower readings again
		return true
	}
}

// shareEvery is how often a follower reads the inbox for its share when
// there are consumers replicas: every inboxEvery up to sharePeers, less
// often beyond, in proportion.
func shareEvery(consumers int) time.Duration {
	return inboxEvery * time.Duration(max(1, (consumers+sharePeers-1)/sharePeers))
}

// queues reads, on the leader, the parking queue and the delay queues
// this replica uses (those it has declared and not forgotten since: see
// delayqueue.Set.SweepIdle). The series of a delay queue it no longer uses, or
// that is gone, is removed, so that it does not report a stale count.
func (w *watcher) queues() {
	if !w.leader {
		return
	}
	s := w.ss.s
	topo := w.ss.router.Topology
	if q, err := w.inspect(topo.ParkingQueue, callParked); err == nil {
		s.m.ParkedMessages.WithLabelValues(topo.ParkingQueue).Set(float64(q.Messages))
	}
	using := map[string]bool{}
	for _, name := range w.ss.pub.Delays().Names() {
		select {
		case <-w.stop:
			return
		default:
		}
		using[name] = true
		if q, err := w.inspect(name, callDelayQueue); err == nil {
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
