package main

import "fmt"

// The levers on the broker's work per copy that a client controls, each
// measured against its base in the same round, with the broker pinned to
// one core (when pinned runs are on): variants of the bare relay, and of
// rebound where the lever is configuration.

// Lever names the readings cite.
const (
	leverNoXDeath     = "relay, messages without x-death"
	leverReboundFetch = "rebound, prefetch 256"
	leverShovelFetch  = "shovel, prefetch 256"
)

// leverPrefetch is the prefetch of the prefetch levers: rebound's default
// before its byte budget, and the Shovel's src-prefetch-count in earlier
// benchmarks; the bases run at their defaults (rebound's ceiling 1024,
// the Shovel's 1000, the relay at rebound's ceiling).
const leverPrefetch = 256

// relayWith returns the base relay changed by f.
func relayWith(f func(*relayConfig)) relayConfig {
	c := baseRelay
	f(&c)
	return c
}

// leverContenders are the levers, each after its base: the relay for the
// relay's variants, rebound for rebound's, the shovel for the shovel's.
func leverContenders() []contender {
	return []contender{
		relayC,
		{Name: "relay, one ack per message", Kind: kindRelay, Relay: relayWith(func(c *relayConfig) { c.AckEach = true })},
		{Name: fmt.Sprintf("relay, prefetch %d", leverPrefetch), Kind: kindRelay, Relay: relayWith(func(c *relayConfig) { c.Prefetch = leverPrefetch })},
		{Name: "relay, 4 publish channels", Kind: kindRelay, Relay: relayWith(func(c *relayConfig) { c.Channels = 4 })},
		{Name: "relay, 4 publish connections", Kind: kindRelay, Relay: relayWith(func(c *relayConfig) { c.Channels, c.Conns = 4, 4 })},
		{Name: "relay, coalesced writes", Kind: kindRelay, Relay: relayWith(func(c *relayConfig) { c.Coalesce = true })},
		{Name: leverNoXDeath, Kind: kindRelay, Relay: baseRelay, Source: plainSource},
		{Name: "relay, rebound's copies and routing", Kind: kindRelay, Relay: baseRelay, Source: copySource, IntoDelayQueue: true},
		reboundC,
		{Name: leverReboundFetch, Kind: kindRebound, Prefetch: leverPrefetch},
		shovelC,
		{Name: leverShovelFetch, Kind: kindShovel, Prefetch: leverPrefetch},
		{Name: "shovel, network connections", Kind: kindShovel, Network: true},
	}
}

// leverBase is the contender a lever is measured against.
func leverBase(c contender) string {
	switch c.Kind {
	case kindRebound:
		return reboundC.Name
	case kindShovel:
		return shovelC.Name
	}
	return relayC.Name
}
