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

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// broker is bench's own connection to one RabbitMQ node of the test
// matrix, for declaring, filling, counting and deleting queues, and its
// command-line tools (brokertest's). It is separate from the connections
// of the contenders it measures.
type broker struct {
	bt        *brokertest.Broker
	vhost     string // of this invocation
	url       string // in that virtual host
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
	// A virtual host of its own, deleted at the end with whatever a
	// failed run left in it.
	vhost := "rebound-bench-" + suffix
	b.vhost = vhost
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

// fill publishes messages 0 to n-1 dead-lettered from origin to queue
// through the default exchange and waits for every confirm, on a
// connection of its own.
func (b *broker) fill(ctx context.Context, queue, origin string, n int) error {
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
	// producer does, so the broker's flow control does not kick in.
	const window = 1000
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	wait := func() error {
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
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, message(i, origin))
		if err != nil {
			return fmt.Errorf("fill %s: %w", queue, err)
		}
		if pending = append(pending, dc); len(pending) == window {
			if err := wait(); err != nil {
				return err
			}
		}
	}
	return wait()
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

// shovelURI is the broker URL in the form the shovel expects, naming no
// host: the shovel then uses a direct connection inside the node (Erlang
// messages, no socket, no frames), as a shovel between queues of one
// broker is meant to be configured.
func shovelURI(vhost string) string { return "amqp:///" + url.PathEscape(vhost) }

// setPolicy sets a policy in bench's virtual host with rabbitmqctl, and
// returns what clears it.
func (b *broker) setPolicy(ctx context.Context, name, pattern, applyTo string, priority int, definition amqp.Table) (clear func(), err error) {
	def, err := json.Marshal(definition)
	if err != nil {
		return nil, fmt.Errorf("encode policy %s: %w", name, err)
	}
	if _, err := b.ctl(ctx, "set_policy", "-p", b.vhost, "--apply-to", applyTo, "--priority", strconv.Itoa(priority),
		name, pattern, string(def)); err != nil {
		return nil, err
	}
	// Not ctx: the policy must go even when bench is interrupted.
	return func() { _, _ = b.ctl(context.Background(), "clear_policy", "-p", b.vhost, name) }, nil
}

var (
	// errLost marks a run that did not deliver every message.
	errLost = errors.New("messages lost")
	// errUntimed marks a run that moved every message, most of them
	// before its clock started: one to run again.
	errUntimed = errors.New("too fast to time")
	// errTimeout is waitFor giving up, as opposed to failing to ask.
	errTimeout = errors.New("timed out")
)

// startShovel creates a dynamic shovel from src to dst with rabbitmqctl on
// the broker, in bench's virtual host, connected directly inside the node
// (shovelURI), at its default prefetch (1000); stop deletes it.
func (b *broker) startShovel(ctx context.Context, name, src, dst string) (stop func() error, err error) {
	uri := shovelURI(b.vhost)
	def, err := json.Marshal(map[string]any{
		"src-protocol": "amqp091", "src-uri": uri, "src-queue": src,
		"dest-protocol": "amqp091", "dest-uri": uri, "dest-queue": dst,
		"ack-mode": "on-confirm",
	})
	if err != nil {
		return nil, fmt.Errorf("encode shovel definition: %w", err)
	}
	if _, err := b.ctl(ctx, "set_parameter", "-p", b.vhost, "shovel", name, string(def)); err != nil {
		return nil, err
	}
	return func() error {
		// Not ctx: the shovel must go even when bench is interrupted.
		_, err := b.ctl(context.Background(), "clear_parameter", "-p", b.vhost, "shovel", name)
		return err
	}, nil
}
