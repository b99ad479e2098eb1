package cli

// `rebound console`: the web console for failures (package console).
// This file loads the configuration, listens and shuts down.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/buildinfo"
	"github.com/rebound-mq/rebound/internal/console"
	"github.com/rebound-mq/rebound/internal/delayed"
)

const consoleUsage = `usage: rebound console

Serves the web console for failures on REBOUND_CONSOLE_ADDR (default
127.0.0.1:9465), over HTTPS when REBOUND_CONSOLE_TLS_CERT_FILE and
_KEY_FILE are set. Plain HTTP on any other address than loopback is
refused unless REBOUND_CONSOLE_BEHIND_TLS_PROXY=true says a
TLS-terminating proxy sits in front: sign-in carries broker passwords.
It shows failure groups, their messages, the copies waiting in the delay
queues, and replay, redirect, purge, flush and cancel, each previewed and
confirmed. People sign in with their RabbitMQ user and password, and
every broker connection the console opens for them is opened as that
user: the broker's permissions decide what each one sees and moves. The
broker comes from REBOUND_AMQP_URL; its user and password are not used.
See docs/console.md.`

func runConsole(ctx context.Context, args []string, in invocation) error {
	cfg, done, err := parseConfigCommand("console", consoleUsage, args, in)
	if done || err != nil {
		return err
	}
	tlsConfig, err := cfg.ConsoleTLS()
	if err != nil {
		return err
	}
	log, err := newLogger(cfg, in.stderr)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	applyMemoryLimit(log, in.environ)
	srv, err := newConsole(cfg, in, log, cfg.ConsoleSecure())
	if err != nil {
		return err
	}
	defer srv.Close()
	listener, err := net.Listen("tcp", cfg.ConsoleAddr)
	if err != nil {
		return fmt.Errorf("listen on REBOUND_CONSOLE_ADDR %s: %w", cfg.ConsoleAddr, err)
	}
	server := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second, TLSConfig: tlsConfig}
	b := buildinfo.Read()
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
	}
	log.Info("console starting", zap.String("version", b.Version), zap.String("broker", config.Redact(cfg.AMQPURL)),
		zap.String("listen", scheme+"://"+listener.Addr().String()), zap.String("parking_queue", cfg.ParkingQueue))
	served := make(chan error, 1)
	go func() {
		if tlsConfig != nil {
			served <- server.ServeTLS(listener, "", "")
		} else {
			served <- server.Serve(listener)
		}
	}()
	select {
	case err = <-served:
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(shutdown)
		err = <-served
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// newConsole builds the console of cfg: every connection it opens is
// opened as the person signed in, through the dialer every command uses.
func newConsole(cfg config.Config, in invocation, log *zap.Logger, secure bool) (*console.Server, error) {
	d, err := newDialer(cfg, in.environ)
	if err != nil {
		return nil, err
	}
	return console.New(console.Options{
		Router: cfg.Router(),
		Dial: func(ctx context.Context, role, user, password string) (*amqp.Connection, error) {
			return d.DialAs(ctx, role, user, password)
		},
		Delays:         delayed.Delays(cfg.DelayDigits, delayed.Longest(cfg.PolicySet())),
		ConfirmTimeout: cfg.ConfirmTimeout,
		Secure:         secure,
		TrustedProxies: cfg.ConsoleProxies(),
		Logger:         log,
	})
}
