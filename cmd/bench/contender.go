package main

import (
	"fmt"
	"time"
)

// kind is what moves the messages.
type kind int

const (
	kindRebound kind = iota // the sidecar in this process: inbox -> a delay queue's exchange -> the delay queue
	kindRelay               // the bare amqp091-go relay (relay.go), in this process
	kindShovel              // a dynamic shovel inside the broker, direct connection, ack-mode on-confirm, its default prefetch
)

// contender is one way of moving N messages from a source queue to a
// destination on the broker, acking each source delivery only once its
// copy is confirmed.
type contender struct {
	Name string
	Kind kind
	// Env is more REBOUND_* settings of a rebound contender, laid over
	// the run's own (startRebound): another delay mode is one more
	// contender with its settings here.
	Env []string
	// Bound is how many delay queues are bound, each to its exchange, the
	// one rebound's copies go to included; 0 or 1 for just that one.
	Bound int
	// Spread, if set, spreads rebound's copies over delay queues as the
	// default policy does (spread.go); nil for one delay queue.
	Spread *policySpread
}

// The contenders of the throughput runs. The first of a suite is its
// baseline: the tables give every other one's rate over its rate in the
// same round. tracedC exports a process and a publish span per message
// over OTLP/HTTP to a sink in this process that discards them (traceSink).
var (
	reboundC = contender{Name: "rebound", Kind: kindRebound}
	tracedC  = contender{Name: "rebound, traced", Kind: kindRebound, Env: []string{"OTEL_TRACES_EXPORTER=otlp"}}
	relayC   = contender{Name: "relay", Kind: kindRelay}
	shovelC  = contender{Name: "shovel", Kind: kindShovel}
)

// throughputContenders are the contenders of the throughput runs, in
// every mode.
func throughputContenders() []contender { return []contender{reboundC, tracedC, relayC, shovelC} }

// spreadContenders are rebound with one delay queue, with k bound, and
// with its n copies spread as the default policy spreads them at each of
// digits; where the broker can hold (4.3), spread again over quorum delay
// queues and into the one hold queue (copies stay there: no holder runs).
func spreadContenders(k, n int, digits []int, canHold bool) ([]contender, error) {
	cs := []contender{reboundC}
	if k > 1 {
		cs = append(cs, contender{Name: fmt.Sprintf("rebound, %d delay queues bound", k), Kind: kindRebound, Bound: k})
	}
	for _, d := range digits {
		sp, err := defaultPolicySpread(n, d)
		if err != nil {
			return nil, err
		}
		cs = append(cs, contender{Name: spreadName(d), Kind: kindRebound, Spread: sp})
		if canHold {
			cs = append(cs, contender{Name: spreadName(d) + ", quorum", Kind: kindRebound, Spread: sp, Env: []string{"REBOUND_QUEUE_TYPE=quorum"}},
				contender{Name: spreadName(d) + ", hold", Kind: kindRebound, Spread: sp, Env: []string{"REBOUND_QUEUE_TYPE=quorum", "REBOUND_DELAY_MODE=hold"}})
		}
	}
	return cs, nil
}

// spreadName names a run whose copies are spread as at digits.
func spreadName(digits int) string {
	return fmt.Sprintf("rebound, default policy's delays, %d digit%s", digits, map[bool]string{true: "s"}[digits > 1])
}

// retryDelay is long enough that copies sit in the delay queue for the
// whole run, where they are counted.
const retryDelay = 10 * time.Minute
