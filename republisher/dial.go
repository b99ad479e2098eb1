package republisher

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Dialer connects to the broker: one URL, or the nodes of a cluster,
// tried in turn starting with the one that last accepted (a stopped node
// then costs one refused connection). The sidecar and every command dial
// through one. Safe for concurrent use.
type Dialer struct {
	urls []string
	tls  *tls.Config // nil: the library's default for amqps://
	// name starts every connection's name on the broker (the management
	// UI's connection_name): "rebound 1.4.0 pod-7f9c", then the role.
	name string
	next atomic.Int64 // index of the URL to try first
}

// NewDialer returns a Dialer for urls (at least one) with tlsConfig (nil
// for the library's defaults). name starts the name each connection
// shows on the broker. With several URLs the first dial starts at a
// random one, so that replicas given the same list spread over the
// cluster.
func NewDialer(urls []string, tlsConfig *tls.Config, name string) *Dialer {
	d := &Dialer{urls: urls, tls: tlsConfig, name: name}
	if len(urls) > 1 {
		d.next.Store(rand.Int64N(int64(len(urls))))
	}
	return d
}

// Dial connects to the first broker that accepts, trying each once,
// starting with the one that last worked, and names the connection
// d's name and role. Cancelling ctx abandons the attempt, handshake
// included; each attempt is bounded anyway (15s to connect, 30s for the
// TLS and AMQP handshakes). Errors name a broker by its place in the
// list, never by its URL, which may hold a password.
func (d *Dialer) Dial(ctx context.Context, role string) (*amqp.Connection, error) {
	var errs []error
	n := len(d.urls)
	first := int(d.next.Load())
	for i := range n {
		at := (first + i) % n
		conn, err := dialOne(ctx, d.urls[at], d.tls, d.name+" "+role)
		if err == nil {
			d.next.Store(int64(at))
			return conn, nil
		}
		if n > 1 {
			err = fmt.Errorf("broker %d of %d: %w", at+1, n, err)
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("connect: %w", errors.Join(errs...))
}

// Name is what starts the name of every connection d opens.
func (d *Dialer) Name() string { return d.name }

// Host names the broker that last accepted a connection (the first one
// before any did) by its host and port: never the whole URL, which may
// hold a password.
func (d *Dialer) Host() string {
	u, err := url.Parse(d.urls[d.next.Load()])
	if err != nil {
		return "?"
	}
	return u.Host
}

func dialOne(ctx context.Context, url string, tlsConfig *tls.Config, name string) (*amqp.Connection, error) {
	var stopWatching func() bool
	defer func() {
		if stopWatching != nil {
			stopWatching()
		}
	}()
	return amqp.DialConfig(url, amqp.Config{
		Heartbeat:       10 * time.Second,
		Locale:          "en_US",
		TLSClientConfig: tlsConfig,
		Properties:      amqp.Table{"connection_name": name},
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: 15 * time.Second}
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bound the TLS and AMQP handshakes; the library clears the
			// deadline once the connection is open and heartbeats run.
			// A cancelled ctx ends them at once.
			if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
				return nil, err
			}
			stopWatching = context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
			return conn, nil
		},
	})
}
