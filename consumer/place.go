package consumer

import (
	"errors"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// maxPlaces bounds the places a replica tries at its start: more
// replicas than this on one inbox share the places above it at place 0's
// seconds (their fractional copies may then coincide).
const maxPlaces = 1024

// takePlace gives this replica its place among the n replicas on the
// inbox (calendar.Share.Index): the lowest free PlaceQueue, an exclusive
// queue the broker gives one connection at a time and deletes when it
// closes. At the start it takes the lowest one free; later, holding a
// place at or past n (a replica below it left), it moves to a free one
// below n. With every replica below n, the places are 0 to n−1, and the
// replicas' fractional copies fall in different seconds.
//
// A place the broker refuses for want of a permission (permissions from
// before places: deploy/rabbitmq/setup.sh) is warned of once, and the
// replica stays at place 0, as every replica was before places.
func (w *watcher) takePlace(n int) {
	if w.placeOff || (w.place >= 0 && w.place < n) {
		return
	}
	limit := n
	if w.place < 0 {
		limit = maxPlaces
	}
	topo := w.ss.router.Topology
	for i := range limit {
		select {
		case <-w.stop:
			return
		default:
		}
		ch, err := w.channel()
		if err != nil {
			return // the connection is going: the session ends
		}
		w.ss.s.m.BrokerCalls.WithLabelValues(callPlace).Inc()
		_, err = ch.QueueDeclare(topo.PlaceQueue(i), false, false, true, false, nil)
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.ResourceLocked {
			continue // another replica's
		}
		if err != nil {
			w.placeOff = true
			w.ss.s.log.Warn("cannot take a place among the replicas; this replica's share of the retry rate budget may fall in the same seconds as another's (grant configure on the place queues: deploy/rabbitmq/setup.sh)",
				zap.String("queue", topo.PlaceQueue(i)), zap.Error(err))
			return
		}
		if w.place >= 0 {
			// Give up the old place; it is this connection's, and goes with it anyway.
			if _, err := ch.QueueDelete(topo.PlaceQueue(w.place), false, false, false); err != nil {
				w.ss.s.log.Debug("give up a place among the replicas", zap.Error(err))
			}
		}
		w.place = i
		w.ss.s.setPlace(i)
		return
	}
}

// placesHeld counts the places below limit that a replica holds, this one
// included, by declaring each passively: the broker refuses one another
// connection holds (405) and knows none that is free (404). It reports
// false when it cannot tell (this replica holds no place, or another
// error): then the inbox's count stands.
func (w *watcher) placesHeld(limit int) (int, bool) {
	if w.placeOff || w.place < 0 {
		return 0, false
	}
	topo := w.ss.router.Topology
	held := 0
	for i := range limit {
		if i == w.place {
			held++
			continue
		}
		ch, err := w.channel()
		if err != nil {
			return 0, false
		}
		w.ss.s.m.BrokerCalls.WithLabelValues(callPlace).Inc()
		_, err = ch.QueueDeclarePassive(topo.PlaceQueue(i), false, false, true, false, nil)
		var aerr *amqp.Error
		switch {
		case errors.As(err, &aerr) && aerr.Code == amqp.ResourceLocked:
			held++
		case errors.As(err, &aerr) && aerr.Code == amqp.NotFound:
		default:
			return 0, false // a place that exists and is not exclusive, or the broker would not say
		}
	}
	return held, true
}
