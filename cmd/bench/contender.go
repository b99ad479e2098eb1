package main

import (
	"time"
)

// kind is what moves the messages.
type kind int

const (
	kindRebound    kind = iota // in-process sidecar: inbox -> a delay queue's exchange -> the delay queue
	kindRelay                  // the bare amqp091-go relay (relay.go), in this process
	kindShovel                 // a dynamic shovel, inside the broker, direct connection, ack-mode on-confirm, its default prefetch
	kindNaive                  // one consumer: publish a copy, wait for its confirm, ack, next
	kindShovelSame             // the shovel, moving rebound's copies into a queue like its delay queue
)

// source is what the source queue holds before a run.
type source int

const (
	deadLetteredSource source = iota // messages as the broker dead-letters them: with x-death
	plainSource                      // the same messages before dead-lettering: no x-death
	copySource                       // what rebound makes of them (route.Router.Plan): retry headers, no x-death
)

// contender is one way of moving N messages from a source queue to a
// destination on the broker, acking each source delivery only once its
// copy is confirmed.
type contender struct {
	Name string
	Kind kind
	// Relay configures a kindRelay contender.
	Relay relayConfig
	// Source is what the source queue holds; rebound always gets
	// dead-lettered messages.
	Source source
	// IntoDelayQueue declares the destination of a relay or shovel as
	// rebound declares a delay queue (message TTL, dead-lettering); the
	// relay then publishes through the queue's own fanout exchange with
	// the origin queue as routing key, as rebound does.
	IntoDelayQueue bool
	// Prefetch is REBOUND_PREFETCH for a rebound contender, the shovel's
	// src-prefetch-count for a shovel; 0 for each one's default (rebound's
	// ceiling of 1024, the Shovel's 1000).
	Prefetch int
	// Bound is how many delay queues are bound on rebound's delay
	// exchange, the one its copies go to included; 0 or 1 for just that
	// one.
	Bound int
	// Spread, if set, spreads rebound's copies over delay queues as the
	// default policy does (spread.go); nil for one delay queue.
	Spread *policySpread
	// Network connects a shovel to the broker over TCP, as an external
	// client would, instead of directly inside the node.
	Network bool
}

// The contenders of the throughput runs.
var (
	reboundC = contender{Name: "rebound", Kind: kindRebound}
	relayC   = contender{Name: "relay", Kind: kindRelay, Relay: baseRelay}
	shovelC  = contender{Name: "shovel", Kind: kindShovel}
	sameC    = contender{Name: "shovel-same", Kind: kindShovelSame, Source: copySource, IntoDelayQueue: true}
	naiveC   = contender{Name: "naive", Kind: kindNaive}
)

// retryDelay is long enough that copies sit in the delay queue for the
// whole run, where they are counted.
const retryDelay = 10 * time.Minute
