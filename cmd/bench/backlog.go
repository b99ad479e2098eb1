package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"time"

	"github.com/rebound-mq/rebound/internal/topology"
)

// backlogResult is rebound's memory while it works through a large inbox
// backlog: in-flight work is bounded by the prefetch, so RSS should not
// grow with the backlog.
type backlogResult struct {
	N        int
	Elapsed  time.Duration
	Samples  []rssSample
	Peak     int64
	Baseline int64 // RSS before rebound started, after filling the inbox
}

type rssSample struct {
	at    time.Duration
	moved int
	rss   int64
}

// measureBacklog fills rebound's inbox with n messages, then starts rebound
// and samples this process's RSS once a second until all n are in the delay
// queue.
func measureBacklog(ctx context.Context, b *broker, n int, stdout io.Writer) (*backlogResult, error) {
	prefix := b.prefix + "backlog."
	topo := topology.Topology{
		InboxQueue: prefix + "inbox", DeadLetterExchange: prefix + "dlx", DelayExchange: prefix + "delay",
		DelayQueuePrefix: prefix + "delay.", ParkingQueue: prefix + "parked",
	}
	const delay = time.Hour // copies sit in the delay queue, where they are counted
	delayQueue, _ := topo.DelayQueue(delay)
	app := prefix + "app"
	defer b.deleteExchanges(topo.DeadLetterExchange, topo.DelayExchangeFor(delay).Name)
	defer b.deleteQueues(app, topo.InboxQueue, delayQueue.Name, topo.ParkingQueue)
	if err := b.declare(app, nil); err != nil {
		return nil, err
	}
	if err := b.declareTopology(topo, delay); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "backlog: filling the inbox with %d messages\n", n)
	if err := b.fill(ctx, topo.InboxQueue, n, deadLettered(app)); err != nil {
		return nil, err
	}
	debug.FreeOSMemory()
	resetPeakRSS()
	res := &backlogResult{N: n}
	res.Baseline, _ = memory()

	r, err := startRebound(ctx, b.url, topo, reboundSettings{Delay: delay})
	if err != nil {
		return nil, err
	}
	stop := r.stop
	start := time.Now()
	for {
		moved, _, err := b.inspect(delayQueue.Name)
		if err != nil {
			_ = stop()
			return nil, err
		}
		rss, _ := memory()
		res.Samples = append(res.Samples, rssSample{at: time.Since(start), moved: moved, rss: rss})
		if moved >= n {
			break
		}
		if time.Since(start) > 30*time.Minute {
			_ = stop()
			return nil, fmt.Errorf("backlog: %d of %d moved after 30m: %w", moved, n, errLost)
		}
		select {
		case <-ctx.Done():
			_ = stop()
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	res.Elapsed = time.Since(start)
	_, res.Peak = memory()
	if err := stop(); err != nil {
		return nil, err
	}
	fmt.Fprint(stdout, res.String())
	return res, nil
}

// String is the result as a markdown table of RSS at each tenth of the way.
func (r *backlogResult) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "backlog of %d messages moved in %s (%.0f msg/s); RSS before rebound %s, peak %s\n\n",
		r.N, r.Elapsed.Round(time.Second), float64(r.N)/r.Elapsed.Seconds(), mib(r.Baseline), mib(r.Peak))
	sb.WriteString("| moved | time | RSS |\n|---:|---:|---:|\n")
	next := 0
	for _, s := range r.Samples {
		if s.moved*10 >= next*r.N {
			fmt.Fprintf(&sb, "| %d %% (%d) | %s | %s |\n", s.moved*100/r.N, s.moved, s.at.Round(time.Second), mib(s.rss))
			next = s.moved*10/r.N + 1
		}
	}
	return sb.String()
}
