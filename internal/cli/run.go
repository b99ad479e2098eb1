package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/consumer"
	"github.com/rebound-mq/rebound/internal/buildinfo"
	"github.com/rebound-mq/rebound/internal/holder"
	"github.com/rebound-mq/rebound/internal/memlimit"
	"github.com/rebound-mq/rebound/internal/tracing"
)

const runUsage = `usage: rebound run

Runs the retry sidecar until SIGTERM or SIGINT: consumes the inbox,
republishes each message into a delay queue or the parking queue, and
serves /healthz, /readyz and /metrics on REBOUND_HTTP_ADDR.
Configuration comes from REBOUND_* environment variables (see README.md).`

// runSidecar runs the retry sidecar until ctx is cancelled.
func runSidecar(ctx context.Context, args []string, in invocation) error {
	cfg, done, err := parseConfigCommand("run", runUsage, args, in)
	if done || err != nil {
		return err
	}
	log, err := newLogger(cfg, in.stderr)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	applyMemoryLimit(log, in.environ)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d, err := newDialer(cfg, in.environ)
	if err != nil {
		return err
	}
	b := buildinfo.Read()
	// Traces are set up before anything connects: a bad OTEL_* setting
	// stops rebound like a bad REBOUND_* one.
	tracer, stopTracing, err := tracing.Setup(ctx, env.ToMap(in.environ), b.Version)
	if err != nil {
		return usageError{err.Error()}
	}
	defer func() {
		flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(flushCtx); err != nil {
			log.Warn("tracing: spans not exported at shutdown", zap.Error(err))
		}
	}()
	opt := consumer.OptionsFrom(cfg, d, log, nil)
	opt.Metrics = consumer.NewMetrics(reg, opt.Router)
	opt.Tracer = tracer
	if cfg.DelayMode == config.DelayHold {
		// Refused at start, never a silent fallback to delay queues.
		if err := holder.Probe(ctx, d, opt.Router.Topology); err != nil {
			return fmt.Errorf("REBOUND_DELAY_MODE=hold: %w", err)
		}
	}
	opt.Holder = holder.New(holder.Options{
		Dialer: d, Logger: log.Named("holder"), Metrics: holder.NewMetrics(reg, time.Now, cfg.HoldSlice),
		Rules: holder.Rules{Topology: opt.Router.Topology, Policies: opt.Router.Policies, Codec: opt.Router.Codec, Slice: cfg.HoldSlice},
		Drain: cfg.DelayMode != config.DelayHold, ConfirmTimeout: cfg.ConfirmTimeout,
	})
	sc := consumer.New(opt)

	listener, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on REBOUND_HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
	}
	server := &http.Server{Handler: httpHandler(sc, reg), ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", zap.Error(err))
		}
	}()
	log.Info("starting", zap.String("version", b.Version), zap.String("revision", b.Revision), zap.String("go", b.GoVersion),
		zap.String("broker", config.Redact(cfg.AMQPURL)),
		zap.String("http", listener.Addr().String()), zap.String("inbox", cfg.InboxQueue),
		zap.String("origin_queues", originQueues(cfg)), zap.Bool("tracing", tracer != nil))
	for _, p := range opt.Router.Policies.All() {
		log.Info("policy", zap.String("name", p.Name), zap.String("queues", policyQueues(p)),
			zap.String("fingerprint", p.Fingerprint), zap.String("schedule", p.Summary()))
	}
	for _, w := range cfg.Warnings {
		log.Warn("configuration", zap.String("warning", w))
	}

	runErr := sc.Run(ctx)

	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = server.Shutdown(shutdownCtx)
	wg.Wait()
	return runErr
}

// httpHandler serves the probes and metrics. Nothing it serves holds a
// secret or a message: the probes say only ready or not, the metrics carry
// counts whose labels come from fixed sets and configured header names.
func httpHandler(sc *consumer.Sidecar, gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := sc.Healthy(); err != nil {
			http.Error(w, "wedged: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !sc.Ready() {
			http.Error(w, "not ready: not connected, not consuming, or blocked by a resource alarm", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	return mux
}

func newLogger(cfg config.Config, stderr io.Writer) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(cfg.LogLevel)
	if err != nil {
		return nil, err // unreachable: config validated the level
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	if cfg.LogFormat == "console" {
		encCfg.EncodeLevel = zapcore.CapitalColorLevelEncoder
		enc = zapcore.NewConsoleEncoder(encCfg)
	} else {
		enc = zapcore.NewJSONEncoder(encCfg)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(stderr), level)), nil
}

// applyMemoryLimit gives the Go runtime three quarters of the container's
// memory limit unless GOMEMLIMIT is set (package memlimit), for the
// long-running commands, and logs what it did.
func applyMemoryLimit(log *zap.Logger, environ []string) {
	vars := env.ToMap(environ)
	set := memlimit.Apply(memlimit.Root(), func(k string) string { return vars[k] })
	if set.Limit == 0 {
		log.Info("go memory limit left as it is", zap.String("why", set.Reason))
		return
	}
	log.Info("go memory limit set from the container's", zap.Int64("go_memory_limit_bytes", set.Limit),
		zap.Int64("container_memory_limit_bytes", set.Container))
}

// commandTracer returns the tracer of a command that moves messages, and
// the function that exports its spans before the command ends: nil, with
// nothing to flush, unless the environment asks for traces (package
// tracing).
func commandTracer(ctx context.Context, in invocation) (trace.Tracer, func(), error) {
	tracer, stop, err := tracing.Setup(ctx, env.ToMap(in.environ), buildinfo.Read().Version)
	if err != nil {
		return nil, nil, usageError{err.Error()}
	}
	if tracer == nil {
		return nil, func() {}, nil
	}
	return tracer, func() {
		flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stop(flushCtx); err != nil {
			fmt.Fprintf(in.stderr, "tracing: spans not exported: %v\n", err)
		}
	}, nil
}
