package topology

import "time"

// Destination says where a copy goes.
type Destination struct {
	Exchange string
	// RoutingKey is the queue the default exchange routes the copy to: its
	// origin for a copy sent straight back, the inbox for a delayed copy
	// (see Delayed).
	RoutingKey string
	// Delay is the delay queue the copy goes through, 0 for none. The
	// queue is declared on first use.
	Delay time.Duration
}

// Direct is the destination of a copy sent straight to queue through the
// default exchange.
func Direct(queue string) Destination {
	return Destination{RoutingKey: queue}
}

// Delayed is the destination of a copy that waits d in its delay queue
// and then comes back to rebound: the delay queue dead-letters to the
// default exchange under the copy's routing key, the inbox, and rebound
// sends the copy on to its origin queue (the origin header) with
// confirms, so that an origin that refuses it (full, with overflow
// reject-publish) loses nothing. A classic delay queue dead-letters at
// most once: routed straight to a full origin, the copy was dropped. A
// copy an earlier rebound published with its origin as routing key still
// goes straight there.
func (t Topology) Delayed(d time.Duration) Destination {
	return Destination{Exchange: t.DelayExchangeFor(d).Name, RoutingKey: t.InboxQueue, Delay: d}
}

// Parked is the destination of a parked copy: the parking exchange in
// hold mode (parkingExchange), else straight to the parking queue.
func (t Topology) Parked() Destination {
	if t.Hold {
		return Destination{Exchange: t.parkingExchange().Name, RoutingKey: t.ParkingQueue}
	}
	return Direct(t.ParkingQueue)
}
