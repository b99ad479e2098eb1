package cli

import (
	"cmp"
	"context"
	"os"

	"github.com/caarlos0/env/v11"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/buildinfo"
	"github.com/rebound-mq/rebound/internal/dialer"
)

// newDialer returns the Dialer every command and the sidecar connect with:
// TLS from the configuration, every broker of a cluster list tried in
// turn, errors without passwords. The connections it opens are named
// after rebound, its version and the pod (podName), and carry rebound's
// version as the client's, so that operators find them in the
// management UI.
func newDialer(cfg config.Config, environ []string) (*dialer.Dialer, error) {
	tlsConfig, err := cfg.TLS()
	if err != nil {
		return nil, err
	}
	b := buildinfo.Read()
	return dialer.New(cfg.BrokerURLs(), tlsConfig, dialer.Client{
		Name: b.ConnectionName(podName(environ)), Version: b.Version, Platform: b.GoVersion,
	}), nil
}

// podName names where rebound runs: POD_NAME (the manifests set it from
// the downward API), else HOSTNAME (a pod's hostname is its name unless
// the pod sets another), else the machine's host name.
func podName(environ []string) string {
	vars := env.ToMap(environ)
	if name := cmp.Or(vars["POD_NAME"], vars["HOSTNAME"]); name != "" {
		return name
	}
	host, _ := os.Hostname()
	return host
}

// connect opens a connection for a one-shot command, which Ctrl-C (ctx)
// abandons at once. role names the connection on the broker.
func connect(ctx context.Context, in invocation, cfg config.Config, role string) (*amqp.Connection, error) {
	d, err := newDialer(cfg, in.environ)
	if err != nil {
		return nil, err
	}
	return d.Dial(ctx, role)
}

// loadAndConnect loads the configuration and opens a connection as
// connect does.
func loadAndConnect(ctx context.Context, in invocation, role string) (config.Config, *amqp.Connection, error) {
	cfg, err := loadConfig(in)
	if err != nil {
		return cfg, nil, err
	}
	conn, err := connect(ctx, in, cfg, role)
	return cfg, conn, err
}
