package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	envvars "github.com/caarlos0/env/v11"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/consumer"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/delayqueue"
	"github.com/rebound-mq/rebound/internal/dialer"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/internal/tracing"
)

// declareTopology declares rebound's fixed topology and the delay queues
// for delays, as rebound itself would on start, so that the inbox can be
// filled and the delay queues watched before it runs.
func (b *broker) declareTopology(topo topology.Topology, delays ...time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := b.channel(); err != nil { // reconnects if the broker went away
		return err
	}
	if _, err := declarer.Declare(b.conn, topo.ForServer(b.conn.Properties)); err != nil {
		return fmt.Errorf("declare rebound topology: %w", err)
	}
	set, err := delayqueue.New(b.conn, topo, nil, time.Now)
	if err != nil {
		return err
	}
	defer set.Close()
	for _, d := range delays {
		if _, err := set.Ensure(d); err != nil {
			return fmt.Errorf("declare delay queue: %w", err)
		}
	}
	return nil
}

// reboundSettings are what a run sets of rebound's configuration.
type reboundSettings struct {
	Delay time.Duration // REBOUND_MIN_DELAY, constant backoff, no jitter
	// Spread, if set, replaces Delay: copies go to the delay queues of
	// these delays in turn (spread.go).
	Spread []time.Duration
	// Env is more REBOUND_* settings, after the others (the last of a
	// name wins).
	Env []string
}

// reboundRun is a sidecar running in this process.
type reboundRun struct {
	stop func() error // cancels it and waits for its drain to finish; again, returns what it did
	reg  *prometheus.Registry
}

// confirmed is how many copies the broker has confirmed to rebound so
// far, from its metrics.
func (r *reboundRun) confirmed() int { return int(r.sum("rebound_messages_retried_total")) }

// sum is the counter name's value summed over its labels, 0 when absent.
func (r *reboundRun) sum(name string) float64 {
	families, err := r.reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// startRebound runs rebound in this process with a constant delay and no
// jitter, configured through config.Load as `rebound run` is, with a no-op
// logger and a registry of its own.
func startRebound(ctx context.Context, url string, topo topology.Topology, s reboundSettings) (*reboundRun, error) {
	env := []string{
		"REBOUND_AMQP_URL=" + url,
		"REBOUND_INBOX_QUEUE=" + topo.InboxQueue,
		"REBOUND_DEAD_LETTER_EXCHANGE=" + topo.DeadLetterExchange,
		"REBOUND_DELAY_EXCHANGE=" + topo.DelayExchange,
		"REBOUND_DELAY_QUEUE_PREFIX=" + topo.DelayQueuePrefix,
		"REBOUND_PARKING_QUEUE=" + topo.ParkingQueue,
		"REBOUND_BACKOFF=constant",
		"REBOUND_SHUTDOWN_GRACE=5s",
	}
	if len(s.Spread) > 0 {
		env = append(env, spreadEnv()...)
	} else {
		env = append(env, "REBOUND_MIN_DELAY="+s.Delay.String(), "REBOUND_JITTER=none")
	}
	env = append(env, s.Env...)
	cfg, err := config.Load(env)
	if err != nil {
		return nil, fmt.Errorf("configure rebound: %w", err)
	}
	reg := prometheus.NewRegistry()
	opt := consumer.OptionsFrom(cfg, dialer.New(cfg.BrokerURLs(), nil, dialer.Client{Name: "rebound bench"}), zap.NewNop(), nil)
	opt.Metrics = consumer.NewMetrics(reg, opt.Router)
	if len(s.Spread) > 0 {
		opt.NewRand = spreadRand(s.Spread)
	}
	tracer, stopTracing, err := tracing.Setup(ctx, envvars.ToMap(s.Env), "bench")
	if err != nil {
		return nil, err
	}
	opt.Tracer = tracer
	sc := consumer.New(opt)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sc.Run(runCtx) }()
	var once sync.Once
	var runErr error
	return &reboundRun{reg: reg, stop: func() error {
		once.Do(func() {
			cancel()
			runErr = errors.Join(<-done, stopTracing(context.Background()))
		})
		return runErr
	}}, nil
}
