package cli

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/republisher"
)

// dialer returns the Dialer every command and the sidecar connect with:
// TLS from the configuration, every broker of a cluster list tried in
// turn, errors without passwords. The connections it opens are named
// after rebound and its version.
func dialer(cfg config.Config) (*republisher.Dialer, error) {
	tlsConfig, err := cfg.TLS()
	if err != nil {
		return nil, err
	}
	return republisher.NewDialer(cfg.BrokerURLs(), tlsConfig, "rebound "+Version), nil
}

// connect opens a connection for a one-shot command, which Ctrl-C (ctx)
// abandons at once. role names the connection on the broker.
func connect(ctx context.Context, cfg config.Config, role string) (*amqp.Connection, error) {
	d, err := dialer(cfg)
	if err != nil {
		return nil, err
	}
	return d.Dial(ctx, role)
}
