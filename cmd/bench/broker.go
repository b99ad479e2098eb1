package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
)

// broker is bench's own connection to one RabbitMQ node of the test
// matrix, for declaring, filling, counting and deleting queues, and its
// command-line tools (brokertest's). It is separate from the connections
// of the contenders it measures.
type broker struct {
	bt        *brokertest.Broker
	url       string // in the virtual host of this invocation
	prefix    string // unique to this invocation
	dropVhost func()

	mu   sync.Mutex // guards conn and ch: the poller and the setup share them
	conn *amqp.Connection
	ch   *amqp.Channel

	pidMu   sync.Mutex
	pid     int    // the node's Erlang VM, as it last said
	pidSeen string // its start time in /proc/<pid>/stat, to notice a restart
}

func newBroker(ctx context.Context, bt *brokertest.Broker) (*broker, error) {
	buf := make([]byte, 3)
	_, _ = rand.Read(buf)
	suffix := hex.EncodeToString(buf)
	b := &broker{bt: bt, prefix: "bench." + suffix + "."}
	// A virtual host of its own, so that the probes can tell this run's
	// processes in the broker from those of other people's tests.
	vhost := "rebound-bench-" + suffix
	if _, err := b.ctl(ctx, "add_vhost", vhost); err != nil {
		return nil, fmt.Errorf("RabbitMQ %s (is it running? make brokers): %w", bt.Name, err)
	}
	b.dropVhost = func() { _, _ = b.ctl(context.Background(), "delete_vhost", vhost) }
	if _, err := b.ctl(ctx, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"); err != nil {
		b.dropVhost()
		return nil, err
	}
	b.url = bt.URLIn(vhost)
	conn, err := amqp.Dial(b.url)
	if err != nil {
		b.dropVhost()
		return nil, fmt.Errorf("connect to RabbitMQ %s: %w", bt.Name, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		b.dropVhost()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	b.conn, b.ch = conn, ch
	return b, nil
}

// close closes bench's connection and deletes its virtual host, with
// whatever a failed run left in it.
func (b *broker) close() {
	b.conn.Close()
	b.dropVhost()
}

// version is the server's version, as it announced itself.
func (b *broker) version() string {
	v, _ := b.conn.Properties["version"].(string)
	return v
}

// nodePID returns the pid of the node's Erlang VM, 0 when it cannot be
// told. It asks the node (rabbitmqctl, a second or so) only when the pid
// it knows is gone or belongs to a newer process: other people's tests
// restart the shared broker.
func (b *broker) nodePID(ctx context.Context) int {
	b.pidMu.Lock()
	defer b.pidMu.Unlock()
	if b.pid > 0 && b.pidSeen != "" && startTime(b.pid) == b.pidSeen {
		return b.pid
	}
	pid, err := b.bt.PID(ctx)
	if err != nil {
		b.pid, b.pidSeen = 0, ""
		return 0
	}
	b.pid, b.pidSeen = pid, startTime(pid)
	return pid
}

// ctl runs rabbitmqctl -q against the node.
func (b *broker) ctl(ctx context.Context, args ...string) (string, error) {
	return b.bt.Ctl(ctx, nil, append([]string{"-q"}, args...)...)
}

// channel returns the shared channel, reopening it when a failed command
// (a 404 from a passive declare, say) closed it, and reconnecting when the
// connection is gone: other people's tests restart the shared broker.
func (b *broker) channel() (*amqp.Channel, error) {
	if b.conn.IsClosed() {
		conn, err := amqp.Dial(b.url)
		if err != nil {
			return nil, fmt.Errorf("reconnect to the broker: %w", err)
		}
		b.conn = conn
	}
	if b.ch.IsClosed() {
		ch, err := b.conn.Channel()
		if err != nil {
			return nil, fmt.Errorf("reopen channel: %w", err)
		}
		b.ch = ch
	}
	return b.ch, nil
}

// pauseBeforeRetry waits 5 s, then until the broker accepts a connection
// again, for two minutes at most: other tests on this machine stop and
// restart the shared broker, which takes longer than a fixed pause.
func (b *broker) pauseBeforeRetry(ctx context.Context) error {
	deadline := time.Now().Add(5*time.Second + 2*time.Minute)
	wait := 5 * time.Second
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		b.mu.Lock()
		_, err := b.channel()
		b.mu.Unlock()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("broker still unreachable after 2m: %w", err)
		}
		wait = time.Second
	}
}

// vhost is the virtual host of the broker URL.
func (b *broker) vhost() string { return config.Config{AMQPURL: b.url}.Vhost() }

// sweep deletes the queues and exchanges whose names start with prefix
// and clears the shovels named so: what a run that failed because the
// broker went away could not delete itself. It lists them with rabbitmqctl.
func (b *broker) sweep(ctx context.Context, prefix string) error {
	// list returns the names in column of `rabbitmqctl list_<what>` that
	// start with prefix, in the rows whose first column is first (if set).
	list := func(what, vhost, first string, column int) ([]string, error) {
		out, err := b.ctl(ctx, "-p", vhost, "list_"+what, "--no-table-headers")
		if err != nil {
			return nil, err
		}
		var names []string
		for _, line := range strings.Split(out, "\n") {
			f := strings.Split(line, "\t")
			if len(f) > column && strings.HasPrefix(f[column], prefix) && (first == "" || f[0] == first) {
				names = append(names, f[column])
			}
		}
		return names, nil
	}
	shovels, err := list("parameters", b.vhost(), "shovel", 1)
	if err != nil {
		return err
	}
	for _, name := range shovels {
		if _, err := b.ctl(ctx, "clear_parameter", "-p", b.vhost(), "shovel", name); err != nil {
			return err
		}
	}
	queues, err := list("queues", b.vhost(), "", 0)
	if err != nil {
		return err
	}
	exchanges, err := list("exchanges", b.vhost(), "", 0)
	if err != nil {
		return err
	}
	b.deleteQueues(queues...)
	b.deleteExchanges(exchanges...)
	return nil
}

// declare declares a durable classic queue with args.
func (b *broker) declare(name string, args amqp.Table) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch, err := b.channel()
	if err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		return fmt.Errorf("declare queue %s: %w", name, err)
	}
	return nil
}

// inspect returns a queue's ready message count and consumer count.
func (b *broker) inspect(name string) (messages, consumers int, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch, err := b.channel()
	if err != nil {
		return 0, 0, err
	}
	q, err := brokertest.Inspect(ch, name)
	return q.Messages, q.Consumers, err
}

// declareExchange declares a durable exchange.
func (b *broker) declareExchange(name, kind string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch, err := b.channel()
	if err != nil {
		return err
	}
	if err := ch.ExchangeDeclare(name, kind, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", name, err)
	}
	return nil
}

// bind binds queue to exchange under key.
func (b *broker) bind(queue, key, exchange string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch, err := b.channel()
	if err != nil {
		return err
	}
	if err := ch.QueueBind(queue, key, exchange, false, nil); err != nil {
		return fmt.Errorf("bind %s to %s: %w", queue, exchange, err)
	}
	return nil
}

// count returns how many ready messages the queues hold together.
func (b *broker) count(queues []string) (int, error) {
	total := 0
	for _, q := range queues {
		n, _, err := b.inspect(q)
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// deleteQueues deletes queues, ignoring those already gone.
func (b *broker) deleteQueues(names ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, name := range names {
		if ch, err := b.channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
		}
	}
}

func (b *broker) deleteExchanges(names ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, name := range names {
		if ch, err := b.channel(); err == nil {
			_ = ch.ExchangeDelete(name, false, false)
		}
	}
}

// body is every message's payload: 512 bytes.
var body = []byte(strings.Repeat("rebound benchmark payload 0123456789abcdef.", 12)[:512])

// message returns message i as an application would publish it:
// persistent, with an id, a timestamp and a few application headers. With
// an origin it is that message as the broker dead-letters it the first
// time its consumer rejects it from queue origin: with one x-death entry,
// from which rebound learns where its copy goes back to.
func message(i int, origin string) amqp.Publishing {
	now := time.Now().Truncate(time.Second) // what an AMQP timestamp carries
	h := amqp.Table{"app": "orders", "tenant": "acme", "seq": int64(i), "x-retry-error": "timeout calling payments"}
	if origin != "" {
		h["x-death"] = []any{amqp.Table{
			"count": int64(1), "reason": "rejected", "queue": origin, "time": now,
			"exchange": "", "routing-keys": []any{origin},
		}}
		h["x-first-death-queue"], h["x-first-death-reason"], h["x-first-death-exchange"] = origin, "rejected", ""
	}
	return amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Timestamp: now,
		MessageId: strconv.Itoa(i), Headers: h, Body: body,
	}
}

// deadLettered returns the messages from origin as rebound receives them.
func deadLettered(origin string) func(i int) amqp.Publishing {
	return func(i int) amqp.Publishing { return message(i, origin) }
}

// retried returns the messages from origin as rebound republishes them
// into the delay queue for retryDelay: what the sidecar's plan step makes
// of them (route.Router.Plan), retry headers and routing header included.
func retried(topo topology.Topology, origin string) func(i int) amqp.Publishing {
	codec := headers.NewCodec(headers.DefaultNames())
	return func(i int) amqp.Publishing {
		m := message(i, origin)
		d := amqp.Delivery{Headers: m.Headers, ContentType: m.ContentType, DeliveryMode: m.DeliveryMode,
			Timestamp: m.Timestamp, MessageId: m.MessageId, Body: m.Body}
		now := time.Now()
		state, _ := codec.Decode(d.Headers, d.Timestamp, now, nil)
		r := route.Router{Topology: topo, Policies: policy.NewSet(policy.Policy{}), Codec: codec}
		rt := route.Route{Origin: route.Origin{Queue: origin}, Policy: r.Policies.Default(), Decision: policy.Decision{Retry: true, Delay: retryDelay, Drawn: retryDelay}}
		_, copy := r.Plan(d, state, rt, now)
		return copy
	}
}

// fill publishes messages msg(0)..msg(n-1) to queue through the default
// exchange and waits for every confirm, on a connection of its own.
func (b *broker) fill(ctx context.Context, queue string, n int, msg func(i int) amqp.Publishing) error {
	conn, err := amqp.Dial(b.url)
	if err != nil {
		return fmt.Errorf("connect to fill %s: %w", queue, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel to fill %s: %w", queue, err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("enable confirms to fill %s: %w", queue, err)
	}
	// Keep a bounded window of unconfirmed publishes, as a well-behaved
	// producer does, so the broker's flow control does not kick in: 1000
	// messages, and no more than fillBytes of bodies.
	const window, fillBytes = 1000, 64 << 20
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	var pendingBytes int
	wait := func() error {
		pendingBytes = 0
		for _, dc := range pending {
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("fill %s: %w", queue, err)
			}
			if !ok {
				return fmt.Errorf("fill %s: broker nacked a publish", queue)
			}
		}
		pending = pending[:0]
		return nil
	}
	for i := range n {
		m := msg(i)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, m)
		if err != nil {
			return fmt.Errorf("fill %s: %w", queue, err)
		}
		pendingBytes += len(m.Body)
		if pending = append(pending, dc); len(pending) == window || pendingBytes >= fillBytes {
			if err := wait(); err != nil {
				return err
			}
		}
	}
	return wait()
}

// consumeOn consumes queue, with prefetch, on a connection of its own,
// which the caller closes; who names the consumer in errors.
func consumeOn(url, queue string, prefetch int, who string) (*amqp.Connection, *amqp.Channel, <-chan amqp.Delivery, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: connect: %w", who, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, nil, nil, fmt.Errorf("%s: open channel: %w", who, err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		conn.Close()
		return nil, nil, nil, fmt.Errorf("%s: set prefetch: %w", who, err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		conn.Close()
		return nil, nil, nil, fmt.Errorf("%s: consume %s: %w", who, queue, err)
	}
	return conn, ch, deliveries, nil
}

// waitFor polls a queue until cond holds for its counts, or the timeout.
func (b *broker) waitFor(ctx context.Context, queue string, every, timeout time.Duration, cond func(messages, consumers int) bool) (messages int, err error) {
	deadline := time.Now().Add(timeout)
	for {
		m, c, err := b.inspect(queue)
		if err != nil {
			return m, err
		}
		if cond(m, c) {
			return m, nil
		}
		if time.Now().After(deadline) {
			return m, fmt.Errorf("queue %s: %w after %s with %d messages, %d consumers", queue, errTimeout, timeout, m, c)
		}
		select {
		case <-ctx.Done():
			return m, ctx.Err()
		case <-time.After(every):
		}
	}
}

// waitForAll polls queues every 10 ms until they hold n messages
// together, or the timeout. One sweep over many queues takes longer than
// that, and the sweeps follow each other.
func (b *broker) waitForAll(ctx context.Context, queues []string, timeout time.Duration, n int) (int, error) {
	if len(queues) == 1 {
		return b.waitFor(ctx, queues[0], 10*time.Millisecond, timeout, func(messages, _ int) bool { return messages >= n })
	}
	deadline := time.Now().Add(timeout)
	for {
		got, err := b.count(queues)
		if err != nil || got >= n {
			return got, err
		}
		if time.Now().After(deadline) {
			return got, fmt.Errorf("%d queues: %w after %s with %d messages", len(queues), errTimeout, timeout, got)
		}
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// ensureShovel enables the shovel plugin on the node if it is not yet
// enabled: on 4.3 the node starts with no plugins.
func (b *broker) ensureShovel(ctx context.Context, stdout io.Writer) error {
	out, err := b.bt.Plugins(ctx, "list", "-e", "-m")
	if err != nil {
		return err
	}
	for _, name := range strings.Fields(out) {
		if name == "rabbitmq_shovel" {
			return nil
		}
	}
	fmt.Fprintf(stdout, "enabling rabbitmq_shovel on RabbitMQ %s\n", b.bt.Name)
	_, err = b.bt.Plugins(ctx, "enable", "rabbitmq_shovel")
	return err
}

// shovelURI is the broker URL in the form the shovel expects: the vhost
// always spelled out, "/" as %2f. With direct, it names no host: the
// shovel then uses a direct connection inside the node (Erlang messages,
// no socket, no frames), as a shovel between queues of one broker is
// meant to be configured; without, a network connection to the URL's
// host, as an external client's.
func shovelURI(raw string, direct bool) (string, error) {
	u, err := amqp.ParseURI(raw)
	if err != nil {
		return "", fmt.Errorf("parse broker URL: %w", err)
	}
	vhost := url.PathEscape(config.Config{AMQPURL: raw}.Vhost())
	if direct {
		return "amqp:///" + vhost, nil
	}
	return fmt.Sprintf("%s://%s:%s@%s:%d/%s", u.Scheme, url.PathEscape(u.Username), url.PathEscape(u.Password),
		u.Host, u.Port, vhost), nil
}

// setPolicy sets policy p in the broker URL's vhost (p.VHost is ignored)
// with rabbitmqctl, and returns what clears it.
func (b *broker) setPolicy(ctx context.Context, p topology.PolicyDefinition) (clear func(), err error) {
	def, err := json.Marshal(p.Definition)
	if err != nil {
		return nil, fmt.Errorf("encode policy %s: %w", p.Name, err)
	}
	if _, err := b.ctl(ctx, "set_policy", "-p", b.vhost(), "--apply-to", p.ApplyTo, "--priority", strconv.Itoa(p.Priority),
		p.Name, p.Pattern, string(def)); err != nil {
		return nil, err
	}
	// Not ctx: the policy must go even when bench is interrupted.
	return func() { _, _ = b.ctl(context.Background(), "clear_policy", "-p", b.vhost(), p.Name) }, nil
}

var (
	// errLost marks a run that did not deliver every message.
	errLost = errors.New("messages lost")
	// errTimeout is waitFor giving up, as opposed to failing to ask.
	errTimeout = errors.New("timed out")
)
