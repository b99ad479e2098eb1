package topology

import "time"

// Destination says where a copy goes.
type Destination struct {
	Exchange   string
	RoutingKey string // for a delayed copy, the origin queue it goes back to
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
// and then goes back to origin.
func (t Topology) Delayed(d time.Duration, origin string) Destination {
	return Destination{Exchange: t.DelayExchangeFor(d).Name, RoutingKey: origin, Delay: d}
}
