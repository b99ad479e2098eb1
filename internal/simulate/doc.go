// Package simulate plays retry strategies against a struggling service, so
// that a team can see what a policy does to a dependency before an outage
// shows it.
//
// Two models are provided, each reproducing a published experiment:
//
//   - burst is the discrete-time experiment of "Exploring backoff": 800
//     clients, a spike of first requests, a service that holds 5 requests at
//     a time and is overwhelmed past 25 outstanding ones. It compares no
//     backoff, constant, uniform random, exponential and random exponential
//     backoff, and any rebound policy converted to ticks.
//   - outage is a queue consumer whose dependency behaves like the server of
//     "Exponential Backoff or how not to crash a server": latency grows
//     exponentially past a concurrency limit, and calls that time out keep
//     loading it. The dependency stops for a while and comes back; every
//     failed message goes through rebound's real policy.Decide.
//
// Each model is played through its command (New):
// the flags of "rebound simulate burst" and "outage", the strategies they
// play and the table, JSON or SVG they print; package cli keeps only what
// every command shares (help, usage errors, --format, --policy).
//
// The models are pure: no I/O except the SVG writers, which write to an
// io.Writer they are given, no clock, no globals. A run is a function of its
// configuration and seed: the same inputs give the same result, bit for bit.
// Functions are safe for concurrent use; each run owns its random sources
// (math/rand/v2 PCG, seeded from the configuration's Seed).
package simulate
