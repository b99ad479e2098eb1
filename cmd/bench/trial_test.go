package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/topology"
)

// testBroker is bench's view of the test matrix's broker, in a virtual
// host of its own that goes with the test.
func testBroker(t *testing.T) *broker {
	t.Helper()
	b, err := newBroker(context.Background(), brokertest.Require(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	return b
}

// Every contender of the throughput and spread runs moves every message
// once, as a run of bench does, unpinned (pinning the shared broker would
// slow everyone's tests) and with few messages: what the runs time is
// then this, so a contender added to a suite is checked here.
func TestEveryContenderMovesEveryMessage(t *testing.T) {
	// 100 moves through every contender; 400 made this the slowest test of
	// the suite beside the rest of make test (270 s on 3.10).
	const n = 100
	ctx := context.Background()
	b := testBroker(t)
	if err := b.ensureShovel(ctx, io.Discard); err != nil {
		t.Fatal(err)
	}
	spread, err := spreadContenders(5, n, []int{1}, topology.VersionAtLeast(b.version(), 4, 3))
	if err != nil {
		t.Fatal(err)
	}
	// The spread runs begin with plain rebound, which the throughput runs
	// have already moved.
	if spread[0].Name != reboundC.Name {
		t.Fatalf("spread runs begin with %q, not %q", spread[0].Name, reboundC.Name)
	}
	for i, c := range append(throughputContenders(), spread[1:]...) {
		tm := atDestination
		if c.Spread != nil || c.Bound > 0 {
			tm = afterWarmUp
		}
		tr, err := runTrial(ctx, b, c, unpinned, tm, fmt.Sprintf("%st%d.", b.prefix, i), 0, n)
		// So few messages, on a busy machine, a contender may move most
		// of them before the poll sees it consume: every one moved, but
		// not timed, which bench runs again.
		if errors.Is(err, errUntimed) {
			t.Logf("%s: %v", c.Name, err)
		} else if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		} else if tr.N <= 0 || tr.N > n || tr.Elapsed <= 0 || tr.CPU.self <= 0 {
			t.Errorf("%s: timed %+v", c.Name, tr)
		}
		if tr.Leftover != 0 || tr.Extra != 0 {
			t.Errorf("%s: %d left in the source, %d extra copies", c.Name, tr.Leftover, tr.Extra)
		}
	}
}

// Every message rejected once comes back and is timed.
func TestDelayAccuracyTimesEveryMessage(t *testing.T) {
	b := testBroker(t)
	o := options{delayMsgs: 20, bgRate: 50}
	r, err := measureDelay(context.Background(), b, 300*time.Millisecond, false, o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if r.Samples != o.delayMsgs || r.Min > r.P50 || r.P50 > r.P99 || r.P99 > r.Max || r.BgAchieved <= 0 {
		t.Errorf("%+v", r)
	}
}
