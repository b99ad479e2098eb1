// Package events tells subscribers when a message is parked: a small JSON
// event per park, published to a topic exchange (REBOUND_EVENTS_EXCHANGE)
// with the routing key parked.<reason>.<origin>, for a ticket, a chat
// message or a webhook.
//
// Events are at most once and never hold up a message: a park is final
// once its parked copy is confirmed, and its event is published after
// that, on a channel of its own (a missing exchange closes the channel it
// is published on), from a bounded queue. An event that cannot be
// published (queue full, channel closed, no confirm) is counted and
// logged, and not tried again.
//
// Concurrency: Send may be called from any goroutine; Close ends the
// publisher's goroutine and waits for it.
package events

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// schema is the version of Parked's JSON form; a field's meaning never
// changes within one.
const schema = 1

// Parked is the event of one parked message. It never carries the body.
type Parked struct {
	Schema     int    `json:"schema"`
	MessageID  string `json:"message_id"`
	Origin     string `json:"origin"`
	Reason     string `json:"reason"`
	Policy     string `json:"policy"`
	Group      string `json:"group"`
	Error      string `json:"error"`
	RetryCount int    `json:"retry_count"`
	ParkedAt   string `json:"parked_at"` // RFC 3339, milliseconds
}

// NewParked returns the event of a message parked at parkedAt; the error a
// consumer reported is cut to maxError bytes.
func NewParked(messageID, origin, reason, policy, group, errText string, retryCount int, parkedAt time.Time) Parked {
	return Parked{Schema: schema, MessageID: messageID, Origin: origin, Reason: reason, Policy: policy, Group: group,
		Error: cut(errText, maxError), RetryCount: retryCount, ParkedAt: parkedAt.UTC().Format("2006-01-02T15:04:05.000Z07:00")}
}

const maxError = 1024

// routingKey is parked.<reason>.<origin>, cut to the 255 bytes AMQP allows
// a routing key (at a character boundary). An origin's dots become more
// words of the key: bind parked.*.payments.# for one service's origins.
func routingKey(reason, origin string) string {
	return cut("parked."+reason+"."+origin, 255)
}

// cut returns s cut to at most n bytes, at a UTF-8 character boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// The outcomes an event is counted under.
const (
	published = "published" // confirmed by the broker
	failed    = "failed"    // nacked, unconfirmed in time, or its channel closed
	dropped   = "dropped"   // the queue was full, or rebound stopped first
)

// Outcomes are the outcomes an event is counted under, for a counter's
// series to exist from the start.
var Outcomes = []string{published, failed, dropped}

// queueSize bounds the events waiting to be published: a broker too slow
// for events loses events, never holds up parks.
const queueSize = 1024

// confirmTimeout is how long an event's confirm is awaited.
const confirmTimeout = 5 * time.Second

// Publisher publishes parked events on its own channel of conn.
type Publisher struct {
	conn     *amqp.Connection
	exchange string
	log      *zap.Logger
	count    func(outcome string)

	queue     chan Parked
	stop      chan struct{}
	done      sync.WaitGroup
	closeOnce sync.Once
}

// Start declares exchange (a durable topic exchange) and starts publishing
// events to it on a channel of conn. count is called once per event with
// its outcome. A declaration the broker refuses (an exchange of that name
// with another type, or no permission) is logged: parks go on, their
// events are counted failed.
func Start(conn *amqp.Connection, exchange string, log *zap.Logger, count func(outcome string)) *Publisher {
	p := &Publisher{conn: conn, exchange: exchange, log: log, count: count,
		queue: make(chan Parked, queueSize), stop: make(chan struct{})}
	if err := p.declare(); err != nil {
		log.Warn("events: exchange not declared; park events will fail until it exists", zap.String("exchange", exchange), zap.Error(err))
	}
	p.done.Add(1)
	go p.run()
	return p
}

func (p *Publisher) declare() error {
	ch, err := p.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return ch.ExchangeDeclare(p.exchange, amqp.ExchangeTopic, true, false, false, false, nil)
}

// Send queues e for publishing without waiting; a full queue drops it.
func (p *Publisher) Send(e Parked) {
	select {
	case <-p.stop:
		p.count(dropped)
		return
	default:
	}
	select {
	case p.queue <- e:
	default:
		p.count(dropped)
		p.log.Warn("events: queue full, park event dropped", zap.String("message_id", e.MessageID), zap.String("origin", e.Origin))
	}
}

// Close stops publishing and waits for the goroutine to end; the events
// still queued are dropped and counted.
func (p *Publisher) Close() {
	p.closeOnce.Do(func() { close(p.stop) })
	p.done.Wait()
	for {
		select {
		case <-p.queue:
			p.count(dropped)
		default:
			return
		}
	}
}

func (p *Publisher) run() {
	defer p.done.Done()
	var ch *channel
	defer func() {
		if ch != nil {
			ch.Close()
		}
	}()
	for {
		select {
		case <-p.stop:
			return
		case e := <-p.queue:
			if ch == nil || ch.IsClosed() {
				var err error
				if ch, err = p.channel(); err != nil {
					p.fail(e, err)
					continue
				}
			}
			if err := p.publish(ch, e); err != nil {
				p.fail(e, err)
				continue
			}
			p.count(published)
		}
	}
}

// channel is the events channel, in confirm mode, with its close
// notification: a missing exchange closes it, and the confirm then never
// comes.
type channel struct {
	*amqp.Channel
	closed chan *amqp.Error
}

func (p *Publisher) channel() (*channel, error) {
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open events channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("events channel confirm mode: %w", err)
	}
	return &channel{Channel: ch, closed: ch.NotifyClose(make(chan *amqp.Error, 1))}, nil
}

func (p *Publisher) publish(ch *channel, e Parked) error {
	body, err := json.Marshal(e)
	if err != nil {
		return err // unreachable: the event holds strings and ints
	}
	ctx, cancel := context.WithTimeout(context.Background(), confirmTimeout)
	defer cancel()
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, p.exchange, routingKey(e.Reason, e.Origin), false, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: e.MessageID,
		Type: "rebound.parked", Timestamp: time.Now(), Body: body,
	})
	if err != nil {
		return fmt.Errorf("publish to %s: %w", p.exchange, err)
	}
	select {
	case <-confirm.Done():
		if !confirm.Acked() {
			return fmt.Errorf("nacked by the broker")
		}
		return nil
	case err := <-ch.closed:
		return fmt.Errorf("events channel closed: %v", err)
	case <-ctx.Done():
		return fmt.Errorf("no confirm within %s", confirmTimeout)
	}
}

func (p *Publisher) fail(e Parked, err error) {
	p.count(failed)
	p.log.Warn("events: park event not published", zap.String("message_id", e.MessageID),
		zap.String("origin", e.Origin), zap.String("reason", e.Reason), zap.Error(err))
}
