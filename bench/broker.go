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
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/consumer"
	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/policy"
	"github.com/rebound-mq/rebound/republisher"
)

// broker is bench's own connection to RabbitMQ, for declaring, filling,
// counting and deleting queues. It is separate from the connections of the
// contenders it measures.
type broker struct {
	url    string
	prefix string // unique to this invocation

	mu   sync.Mutex // guards conn and ch: the poller and the setup share them
	conn *amqp.Connection
	ch   *amqp.Channel
}

func newBroker(rawURL string) (*broker, error) {
	conn, err := amqp.Dial(rawURL)
	if err != nil {
		return nil, fmt.Errorf("connect to the broker (is RabbitMQ running? scripts/ensure-rabbitmq.sh): %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	buf := make([]byte, 3)
	_, _ = rand.Read(buf)
	return &broker{url: rawURL, prefix: "bench." + hex.EncodeToString(buf) + ".", conn: conn, ch: ch}, nil
}

func (b *broker) close() { b.conn.Close() }

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
func (b *broker) vhost() (string, error) {
	u, err := amqp.ParseURI(b.url)
	if err != nil {
		return "", fmt.Errorf("parse broker URL: %w", err)
	}
	if u.Vhost == "" {
		return "/", nil
	}
	return u.Vhost, nil
}

// sweep deletes the queues and exchanges whose names start with prefix
// and clears the shovels named so: what a run that failed because the
// broker went away could not delete itself. It lists them with rabbitmqctl.
func (b *broker) sweep(ctx context.Context, prefix string) error {
	vhost, err := b.vhost()
	if err != nil {
		return err
	}
	// list returns the names in column of `rabbitmqctl list_<what>` that
	// start with prefix, in the rows whose first column is first (if set).
	list := func(what, vhost, first string, column int) ([]string, error) {
		out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "-p", vhost, "list_"+what, "--no-table-headers").Output()
		if err != nil {
			return nil, fmt.Errorf("rabbitmqctl list_%s: %w", what, err)
		}
		var names []string
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Split(line, "\t")
			if len(f) > column && strings.HasPrefix(f[column], prefix) && (first == "" || f[0] == first) {
				names = append(names, f[column])
			}
		}
		return names, nil
	}
	// startShovel creates shovels in the default vhost, whatever the URL's.
	shovels, err := list("parameters", "/", "shovel", 1)
	if err != nil {
		return err
	}
	for _, name := range shovels {
		if err := rabbitmqctl(ctx, "clear_parameter", "shovel", name); err != nil {
			return err
		}
	}
	queues, err := list("queues", vhost, "", 0)
	if err != nil {
		return err
	}
	exchanges, err := list("exchanges", vhost, "", 0)
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
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("inspect queue %s: %w", name, err)
	}
	return q.Messages, q.Consumers, nil
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
// of them (consumer.Plan), retry headers and routing header included.
func retried(topo republisher.Topology, origin string) func(i int) amqp.Publishing {
	codec := headers.NewCodec(headers.DefaultNames())
	return func(i int) amqp.Publishing {
		m := message(i, origin)
		d := amqp.Delivery{Headers: m.Headers, ContentType: m.ContentType, DeliveryMode: m.DeliveryMode,
			Timestamp: m.Timestamp, MessageId: m.MessageId, Body: m.Body}
		now := time.Now()
		state, _ := codec.Decode(d.Headers, d.Timestamp, now, nil)
		_, copy := consumer.Plan(topo, codec, d, state, policy.Decision{Retry: true, Delay: retryDelay, Drawn: retryDelay}, now)
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
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg(i))
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

// ensureShovel enables the shovel plugin if it is not yet enabled.
func ensureShovel(ctx context.Context, stdout io.Writer) error {
	out, err := exec.CommandContext(ctx, "rabbitmq-plugins", "list", "-e", "-m").Output()
	if err != nil {
		return fmt.Errorf("rabbitmq-plugins list: %w", err)
	}
	for _, name := range strings.Fields(string(out)) {
		if name == "rabbitmq_shovel" {
			return nil
		}
	}
	fmt.Fprintln(stdout, "enabling rabbitmq_shovel")
	if out, err := exec.CommandContext(ctx, "rabbitmq-plugins", "enable", "rabbitmq_shovel").CombinedOutput(); err != nil {
		return fmt.Errorf("rabbitmq-plugins enable rabbitmq_shovel: %w\n%s", err, out)
	}
	return nil
}

// shovelURI is the broker URL in the form the shovel expects: the vhost
// always spelled out, "/" as %2f.
func shovelURI(raw string) (string, error) {
	u, err := amqp.ParseURI(raw)
	if err != nil {
		return "", fmt.Errorf("parse broker URL: %w", err)
	}
	vhost := u.Vhost
	if vhost == "" {
		vhost = "/"
	}
	return fmt.Sprintf("%s://%s:%s@%s:%d/%s", u.Scheme, url.PathEscape(u.Username), url.PathEscape(u.Password),
		u.Host, u.Port, url.PathEscape(vhost)), nil
}

// setPolicy sets policy p in the broker URL's vhost (p.VHost is ignored)
// with rabbitmqctl, and returns what clears it.
func (b *broker) setPolicy(ctx context.Context, p republisher.PolicyDefinition) (clear func(), err error) {
	vhost, err := b.vhost()
	if err != nil {
		return nil, err
	}
	def, err := json.Marshal(p.Definition)
	if err != nil {
		return nil, fmt.Errorf("encode policy %s: %w", p.Name, err)
	}
	if err := rabbitmqctl(ctx, "set_policy", "-p", vhost, "--apply-to", p.ApplyTo, "--priority", strconv.Itoa(p.Priority),
		p.Name, p.Pattern, string(def)); err != nil {
		return nil, err
	}
	// Not ctx: the policy must go even when bench is interrupted.
	return func() { _ = rabbitmqctl(context.Background(), "clear_policy", "-p", vhost, p.Name) }, nil
}

// rabbitmqctl runs one rabbitmqctl command.
func rabbitmqctl(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl %s: %w\n%s", args[0], err, out)
	}
	return nil
}

var (
	// errLost marks a run that did not deliver every message.
	errLost = errors.New("messages lost")
	// errTimeout is waitFor giving up, as opposed to failing to ask.
	errTimeout = errors.New("timed out")
)
