package dialer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	amqp10 "github.com/Azure/go-amqp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Dial10 opens an AMQP 1.0 connection to the first broker that accepts,
// as Dial does for AMQP 0-9-1: the same URLs (RabbitMQ 4.x serves AMQP
// 1.0 on its AMQP port), the same user, virtual host and TLS. The holder
// of hold mode consumes the hold queue through it.
func (d *Dialer) Dial10(ctx context.Context, role string) (*amqp10.Conn, error) {
	conn, err := tryEach(ctx, d, func(url string) (*amqp10.Conn, error) {
		return dialOne10(ctx, url, d.tls, d.client, role)
	})
	if err != nil {
		return nil, fmt.Errorf("connect over AMQP 1.0: %w", err)
	}
	return conn, nil
}

func dialOne10(ctx context.Context, rawURL string, tlsConfig *tls.Config, client Client, role string) (*amqp10.Conn, error) {
	u, err := amqp.ParseURI(rawURL)
	if err != nil {
		return nil, errors.New("not a broker URL") // never the URL: it may hold a password
	}
	opts := &amqp10.ConnOptions{
		SASLType:     amqp10.SASLTypePlain(u.Username, u.Password),
		HostName:     "vhost:" + u.Vhost,
		ContainerID:  client.properties(role)["connection_name"].(string),
		IdleTimeout:  30 * time.Second,
		Properties:   map[string]any{"product": "rebound", "version": client.Version, "platform": client.Platform + " (go-amqp)"},
		WriteTimeout: 30 * time.Second,
	}
	scheme := "amqp"
	if u.Scheme == "amqps" {
		scheme = "amqps"
		cfg := &tls.Config{}
		if tlsConfig != nil {
			cfg = tlsConfig.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Host
		}
		opts.TLSConfig = cfg
	}
	dialCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	address := (&url.URL{Scheme: scheme, Host: net.JoinHostPort(u.Host, fmt.Sprint(u.Port))}).String()
	conn, err := amqp10.Dial(dialCtx, address, opts)
	if err != nil {
		return nil, err
	}
	return conn, nil
}
