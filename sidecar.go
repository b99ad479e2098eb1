package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/consumer"
	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/republisher"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

// runSidecar runs the retry sidecar until ctx is cancelled.
func runSidecar(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	usage := "usage: rebound run\n\nRuns the retry sidecar. Configuration comes from REBOUND_* environment variables (see README.md)."
	if done, err := parseFlags(fs, args, usage, stderr); done || err != nil {
		return err
	}
	cfg, err := config.Load(environ)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	tlsConfig, err := loadTLS(cfg)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	sidecar := consumer.New(consumer.Options{
		URLs:           cfg.BrokerURLs(),
		TLS:            tlsConfig,
		Topology:       topology(cfg),
		Policy:         cfg.Policy(),
		Codec:          headers.NewCodec(cfg.HeaderNames()),
		Prefetch:       cfg.Prefetch,
		ConfirmTimeout: cfg.ConfirmTimeout,
		ShutdownGrace:  cfg.ShutdownGrace,
		DelayQueueIdle: cfg.DelayQueueIdle,
		Logger:         log,
		Metrics:        consumer.NewMetrics(reg, readHeaders(cfg.HeaderNames())...),
	})

	listener, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on REBOUND_HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
	}
	server := &http.Server{Handler: httpHandler(sidecar, reg), ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", zap.Error(err))
		}
	}()
	log.Info("starting", zap.String("version", version), zap.String("broker", config.Redact(cfg.AMQPURL)),
		zap.String("http", listener.Addr().String()), zap.String("inbox", cfg.InboxQueue))

	runErr := sidecar.Run(ctx)

	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = server.Shutdown(shutdownCtx)
	wg.Wait()
	return runErr
}

// readHeaders lists the headers whose problems the sidecar counts.
func readHeaders(n headers.Names) []string {
	return []string{n.RetryCount, n.TaskStartedAt, n.LastDelay, n.OriginQueue, n.NonRetryable, headers.XDeath, headers.XFirstDeathQueue}
}

func topology(cfg config.Config) republisher.Topology {
	return republisher.Topology{
		InboxQueue:         cfg.InboxQueue,
		DeadLetterExchange: cfg.DeadLetterExchange,
		DelayExchange:      cfg.DelayExchange,
		DelayQueuePrefix:   cfg.DelayQueuePrefix,
		ParkingQueue:       cfg.ParkingQueue,
		Quorum:             cfg.QueueType == config.Quorum,
	}
}

// httpHandler serves the probes and metrics.
func httpHandler(sidecar *consumer.Sidecar, gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := sidecar.Healthy(); err != nil {
			http.Error(w, "wedged: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !sidecar.Ready() {
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

// loadTLS builds the TLS configuration for amqps:// from the optional CA,
// certificate and key files. nil means the library's defaults.
func loadTLS(cfg config.Config) (*tls.Config, error) {
	if cfg.TLSCAFile == "" && cfg.TLSCertFile == "" {
		return nil, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.TLSCAFile != "" {
		pem, err := os.ReadFile(cfg.TLSCAFile)
		if err != nil {
			return nil, tlsError("TLS_CA_FILE", cfg.TLSCAFile, err.Error())
		}
		t.RootCAs = x509.NewCertPool()
		if !t.RootCAs.AppendCertsFromPEM(pem) {
			return nil, tlsError("TLS_CA_FILE", cfg.TLSCAFile, "no PEM certificate in the file")
		}
	}
	if cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, tlsError("TLS_CERT_FILE", cfg.TLSCertFile, "with REBOUND_TLS_KEY_FILE: "+err.Error())
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// tlsError reports an unusable TLS file as a configuration error, so that
// rebound exits with status 2 before connecting.
func tlsError(variable, path, problem string) error {
	return &config.Error{Problems: []config.FieldError{{
		Variable: config.Prefix + variable, Value: path, Allowed: "a readable PEM file (" + problem + ")",
	}}}
}
