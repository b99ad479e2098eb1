package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The bare relay is the floor any amqp091-go client can reach: it consumes
// the source, publishes each delivery unchanged (same properties, headers
// and body), acks the source once the broker confirmed the copy, and does
// nothing else: no decoding, no decision, no mandatory flag, no returns.
// rebound does everything it does, and more; what the relay cannot beat
// on a broker, no amqp091-go client can. Its variants (relayConfig) are
// the levers on the broker's work per copy that a client controls.

// relayConfig is one way of relaying.
type relayConfig struct {
	Prefetch int  // consumer prefetch, and so the most copies unconfirmed
	AckEach  bool // ack every delivery on its own instead of one multiple ack per run of confirms
	Channels int  // publish channels, deliveries spread over them round robin
	Conns    int  // publish connections the channels are spread over
	// Coalesce holds the publishes of a burst of deliveries and writes
	// them in one write(2) once no delivery is waiting, as the Erlang
	// client (the Shovel's) does, instead of one write per publish.
	Coalesce bool
	// Exchange and Key route the copies; Key "" is the destination
	// queue's name. A delay queue's exchange and the origin queue as key
	// route them as rebound routes a delayed copy.
	Exchange, Key string
}

// baseRelay is the relay of the throughput runs: its prefetch is
// rebound's default ceiling (REBOUND_PREFETCH), which rebound's window
// reaches with these small messages, so that the two hold as many copies
// unconfirmed and their CPU per message compares.
var baseRelay = relayConfig{Prefetch: 1024, Channels: 1, Conns: 1}

func (c relayConfig) String() string {
	var parts []string
	if c.Prefetch != baseRelay.Prefetch {
		parts = append(parts, fmt.Sprintf("prefetch %d", c.Prefetch))
	}
	if c.AckEach {
		parts = append(parts, "ack each")
	}
	if c.Channels > 1 {
		parts = append(parts, fmt.Sprintf("%d channels", c.Channels))
	}
	if c.Conns > 1 {
		parts = append(parts, fmt.Sprintf("%d connections", c.Conns))
	}
	if c.Coalesce {
		parts = append(parts, "coalesced writes")
	}
	if c.Exchange != "" {
		parts = append(parts, "delay queue's exchange")
	}
	if len(parts) == 0 {
		return "base"
	}
	return strings.Join(parts, ", ")
}

// coalescer is a net.Conn whose writes are held while it is corked and
// written together by flush. amqp091-go flushes its buffer after every
// publish; under it, this turns a burst of publishes into one write(2).
type coalescer struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	buf    []byte
	err    error // of a write made by flush, returned by the next Write
}

// coalesceLimit is the most bytes held: past it, flush at once.
const coalesceLimit = 64 << 10

func (c *coalescer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if !c.corked {
		return c.Conn.Write(p)
	}
	c.buf = append(c.buf, p...)
	if len(c.buf) >= coalesceLimit {
		c.flushLocked()
	}
	return len(p), c.err
}

func (c *coalescer) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// flush writes what is held and uncorks.
func (c *coalescer) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushLocked()
	c.corked = false
}

func (c *coalescer) flushLocked() {
	if len(c.buf) > 0 && c.err == nil {
		_, c.err = c.Conn.Write(c.buf)
	}
	c.buf = c.buf[:0]
}

// dialRelay opens a connection, under a coalescer when coalesce is set.
func dialRelay(url, name string, coalesce bool) (*amqp.Connection, *coalescer, error) {
	var co *coalescer
	cfg := amqp.Config{Properties: amqp.Table{"connection_name": name}}
	if coalesce {
		cfg.Dial = func(network, addr string) (net.Conn, error) {
			conn, err := net.DialTimeout(network, addr, 15*time.Second)
			if err != nil {
				return nil, err
			}
			co = &coalescer{Conn: conn}
			return co, nil
		}
	}
	conn, err := amqp.DialConfig(url, cfg)
	return conn, co, err
}

// relayPub is one publish channel: its confirms come back in publish
// order, one each (amqp091-go splits multiple confirms), and tags maps
// their sequence numbers to the deliveries they copy.
type relayPub struct {
	ch   *amqp.Channel
	mu   sync.Mutex
	tags map[uint64]uint64 // publish sequence number -> delivery tag
}

// startRelay runs the relay from src to dst (a queue name) with cfg; stop
// closes its connections, leaving unacked deliveries to be requeued.
func startRelay(ctx context.Context, url, src, dst string, cfg relayConfig) (stop func() error, err error) {
	var conns []*amqp.Connection
	var coalescers []*coalescer
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	fail := func(format string, a ...any) (func() error, error) {
		closeAll()
		return nil, fmt.Errorf("relay: "+format, a...)
	}
	cons, err := amqp.DialConfig(url, amqp.Config{Properties: amqp.Table{"connection_name": "bench relay consume"}})
	if err != nil {
		return fail("connect: %w", err)
	}
	conns = append(conns, cons)
	pubConns := make([]*amqp.Connection, max(cfg.Conns, 1))
	for i := range pubConns {
		conn, co, err := dialRelay(url, "bench relay publish", cfg.Coalesce)
		if err != nil {
			return fail("connect: %w", err)
		}
		conns = append(conns, conn)
		pubConns[i] = conn
		if co != nil {
			coalescers = append(coalescers, co)
		}
	}
	confirmed := make(chan uint64, cfg.Prefetch+16) // delivery tags whose copies were confirmed
	failed := make(chan error, max(cfg.Channels, 1))
	pubs := make([]*relayPub, max(cfg.Channels, 1))
	for i := range pubs {
		ch, err := pubConns[i%len(pubConns)].Channel()
		if err != nil {
			return fail("open channel: %w", err)
		}
		if err := ch.Confirm(false); err != nil {
			return fail("enable confirms: %w", err)
		}
		p := &relayPub{ch: ch, tags: map[uint64]uint64{}}
		pubs[i] = p
		// At most Prefetch copies are unconfirmed: the buffer never fills.
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, cfg.Prefetch+16))
		go func() {
			for c := range confirms {
				p.mu.Lock()
				tag := p.tags[c.DeliveryTag]
				delete(p.tags, c.DeliveryTag)
				p.mu.Unlock()
				if !c.Ack {
					failed <- fmt.Errorf("relay: broker nacked the copy of delivery %d", tag)
					return
				}
				confirmed <- tag
			}
		}()
	}
	ch, err := cons.Channel()
	if err != nil {
		return fail("open channel: %w", err)
	}
	if err := ch.Qos(cfg.Prefetch, 0, false); err != nil {
		return fail("set prefetch: %w", err)
	}
	deliveries, err := ch.Consume(src, "", false, false, false, false, nil)
	if err != nil {
		return fail("consume %s: %w", src, err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	r := &relay{cfg: cfg, ch: ch, pubs: pubs, coalescers: coalescers, dst: dst}
	go func() { done <- r.loop(runCtx, deliveries, confirmed, failed) }()
	return func() error {
		cancel()
		err := <-done
		closeAll()
		return err
	}, nil
}

// relay is the running relay's state, owned by its loop.
type relay struct {
	cfg        relayConfig
	ch         *amqp.Channel // the consume channel, where acks go
	pubs       []*relayPub
	coalescers []*coalescer
	dst        string
	next       int             // the publish channel of the next copy
	acked      uint64          // every delivery tag up to this one is acked
	confirmed  map[uint64]bool // confirmed, not yet acked
}

func (r *relay) loop(ctx context.Context, deliveries <-chan amqp.Delivery, confirmed <-chan uint64, failed <-chan error) error {
	r.confirmed = map[uint64]bool{}
	for {
		// Take every confirm that came meanwhile, then ack once.
		for more := true; more; {
			select {
			case tag := <-confirmed:
				r.confirmed[tag] = true
			default:
				more = false
			}
		}
		if err := r.ack(); err != nil {
			return err
		}
		var d amqp.Delivery
		var ok bool
		select {
		case d, ok = <-deliveries:
		default:
			// Nothing waiting: the burst is over, send what it published.
			for _, c := range r.coalescers {
				c.flush()
			}
			select {
			case <-ctx.Done():
				return nil
			case err := <-failed:
				return err
			case tag := <-confirmed:
				r.confirmed[tag] = true
				continue
			case d, ok = <-deliveries:
			}
		}
		if !ok {
			return errors.New("relay: deliveries stopped")
		}
		for _, c := range r.coalescers {
			c.cork()
		}
		if err := r.publish(ctx, d); err != nil {
			return err
		}
	}
}

func (r *relay) publish(ctx context.Context, d amqp.Delivery) error {
	p := r.pubs[r.next]
	r.next = (r.next + 1) % len(r.pubs)
	msg := amqp.Publishing{
		Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: d.DeliveryMode, Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo,
		Expiration: d.Expiration, MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, UserId: d.UserId,
		AppId: d.AppId, Body: d.Body,
	}
	key := r.cfg.Key
	if key == "" {
		key = r.dst
	}
	p.mu.Lock()
	p.tags[p.ch.GetNextPublishSeqNo()] = d.DeliveryTag
	p.mu.Unlock()
	if err := p.ch.PublishWithContext(ctx, r.cfg.Exchange, key, false, false, msg); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("relay: publish: %w", err)
	}
	return nil
}

// ack acks, in tag order, every delivery whose copy and whose
// predecessors' copies are confirmed: with one multiple ack, or one ack
// each.
func (r *relay) ack() error {
	upTo := r.acked
	for r.confirmed[upTo+1] {
		upTo++
		delete(r.confirmed, upTo)
		if r.cfg.AckEach {
			if err := r.ch.Ack(upTo, false); err != nil {
				return fmt.Errorf("relay: ack: %w", err)
			}
		}
	}
	if upTo > r.acked && !r.cfg.AckEach {
		if err := r.ch.Ack(upTo, true); err != nil {
			return fmt.Errorf("relay: ack: %w", err)
		}
	}
	r.acked = upTo
	return nil
}
