// Package dialer opens rebound's AMQP connections: TLS, the nodes of a
// cluster tried in turn, connections named after the pod, errors without
// passwords. The sidecar and every command dial through it.
package dialer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Dialer connects to the broker: one URL, or the nodes of a cluster,
// tried in turn starting with the one that last accepted (a stopped node
// then costs one refused connection). The sidecar and every command dial
// through one. Safe for concurrent use.
type Dialer struct {
	urls   []string
	tls    *tls.Config // nil: the library's default for amqps://
	client Client
	next   atomic.Int64 // index of the URL to try first
}

// Client is how each connection introduces itself to the broker, in the
// client properties of connection.start-ok, which the management UI and
// `rabbitmqctl list_connections client_properties` show.
type Client struct {
	// Name starts each connection's connection_name, the role follows:
	// "rebound 1.4.0 on orders-worker-7d9f consume".
	Name string
	// Version is rebound's version; the product is "rebound".
	Version string
	// Platform is the Go version that built it: "go1.26.0".
	Platform string
}

// properties is the client properties table of a connection in role.
func (c Client) properties(role string) amqp.Table {
	return amqp.Table{
		"connection_name": strings.TrimSpace(c.Name + " " + role),
		"product":         "rebound",
		"version":         c.Version,
		"platform":        c.Platform + " (amqp091-go)",
	}
}

// New returns a Dialer for urls (at least one) with tlsConfig (nil
// for the library's defaults); client says who connects. With several
// URLs the first dial starts at a random one, so that replicas given the
// same list spread over the cluster.
func New(urls []string, tlsConfig *tls.Config, client Client) *Dialer {
	d := &Dialer{urls: urls, tls: tlsConfig, client: client}
	if len(urls) > 1 {
		d.next.Store(rand.Int64N(int64(len(urls))))
	}
	return d
}

// Dial connects to the first broker that accepts, trying each once,
// starting with the one that last worked, and names the connection
// after d's client and role. Cancelling ctx abandons the attempt, handshake
// included; each attempt is bounded anyway (15s to connect, 30s for the
// TLS and AMQP handshakes). Errors name a broker by its place in the
// list, never by its URL, which may hold a password.
func (d *Dialer) Dial(ctx context.Context, role string) (*amqp.Connection, error) {
	return d.DialVia(ctx, role, nil)
}

// DialVia is Dial with wrap, when not nil, laid over the connection's
// socket, TLS included, so that it sees AMQP frames: the sidecar meters
// what its consume connection reads with it.
func (d *Dialer) DialVia(ctx context.Context, role string, wrap func(net.Conn) net.Conn) (*amqp.Connection, error) {
	return d.dial(ctx, role, wrap, nil)
}

// DialAs is Dial as the broker user user with password, whatever user
// the URLs name: the console opens every connection of a person as that
// person, so that the broker's permissions decide what each one may do.
// The password goes to the broker in the SASL handshake only.
func (d *Dialer) DialAs(ctx context.Context, role, user, password string) (*amqp.Connection, error) {
	return d.dial(ctx, role, nil, []amqp.Authentication{&amqp.PlainAuth{Username: user, Password: password}})
}

// dial tries each broker in turn; sasl nil authenticates as the URL says.
func (d *Dialer) dial(ctx context.Context, role string, wrap func(net.Conn) net.Conn, sasl []amqp.Authentication) (*amqp.Connection, error) {
	conn, err := tryEach(ctx, d, func(url string) (*amqp.Connection, error) {
		return dialOne(ctx, url, d.tls, d.client.properties(role), wrap, sasl)
	})
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return conn, nil
}

// tryEach calls dial with each of d's URLs in turn, starting with the
// one that last worked, until one succeeds, and remembers it. The errors
// name a broker by its place in the list.
func tryEach[C any](ctx context.Context, d *Dialer, dial func(url string) (C, error)) (C, error) {
	var errs []error
	n := len(d.urls)
	first := int(d.next.Load())
	for i := range n {
		at := (first + i) % n
		conn, err := dial(d.urls[at])
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
	var none C
	return none, errors.Join(errs...)
}

// Name is what starts the name of every connection d opens.
func (d *Dialer) Name() string { return d.client.Name }

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

func dialOne(ctx context.Context, rawURL string, tlsConfig *tls.Config, properties amqp.Table, wrap func(net.Conn) net.Conn, sasl []amqp.Authentication) (*amqp.Connection, error) {
	var stopWatching func() bool
	defer func() {
		if stopWatching != nil {
			stopWatching()
		}
	}()
	// With a wrap over amqps://, the TLS handshake is done here, beneath
	// it, as amqp091-go would (its server name the URL's host), and the
	// library is handed a plain amqp:// URL to the same port.
	var serverName string
	if wrap != nil {
		u, err := url.Parse(rawURL)
		if err != nil {
			return nil, errors.New("not a broker URL") // never the URL: it may hold a password
		}
		if u.Scheme == "amqps" {
			serverName = u.Hostname()
			if u.Port() == "" {
				u.Host = net.JoinHostPort(u.Hostname(), "5671")
			}
			u.Scheme = "amqp"
			rawURL = u.String()
		}
	}
	return amqp.DialConfig(rawURL, amqp.Config{
		Heartbeat: 10 * time.Second,
		Locale:    "en_US",
		// A copy: amqp091-go writes the URL's host into the config's
		// ServerName, and the sidecar and its holder dial at once.
		TLSClientConfig: tlsConfig.Clone(),
		Properties:      properties,
		SASL:            sasl,
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
			// The socket itself, not conn: conn is reassigned below to the
			// TLS client and the wrap, while this may run on another goroutine.
			socket := conn
			stopWatching = context.AfterFunc(ctx, func() { _ = socket.SetDeadline(time.Now()) })
			if serverName != "" {
				cfg := &tls.Config{}
				if tlsConfig != nil {
					cfg = tlsConfig.Clone()
				}
				if cfg.ServerName == "" {
					cfg.ServerName = serverName
				}
				client := tls.Client(conn, cfg)
				if err := client.HandshakeContext(ctx); err != nil {
					conn.Close()
					return nil, err
				}
				conn = client
			}
			if wrap != nil {
				conn = wrap(conn)
			}
			return conn, nil
		},
	})
}
