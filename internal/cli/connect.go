package cli

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/consumer"
)

// connect opens a connection for a one-shot command with the sidecar's
// dial: TLS from the configuration, every broker of a cluster list tried
// in turn, errors without passwords, and Ctrl-C (ctx) abandoning the
// attempt at once. role names the connection on the broker.
func connect(ctx context.Context, cfg config.Config, role string) (*amqp.Connection, error) {
	tlsConfig, err := cfg.TLS()
	if err != nil {
		return nil, err
	}
	conn, _, err := consumer.Dial(ctx, cfg.BrokerURLs(), tlsConfig, "rebound "+role, 0)
	return conn, err
}
