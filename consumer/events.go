package consumer

// Park events tell subscribers when a message is parked: a small JSON
// event per park, published to a topic exchange (REBOUND_EVENTS_EXCHANGE)
// with the routing key parked.<reason>.<origin>, for a ticket, a chat
// message or a webhook. An event is a CloudEvent 1.0 in structured JSON
// mode (what Knative, Argo Events and most webhook receivers read), its
// data the ParkedEvent's fields, described by the JSON Schema
// docs/events/parked.schema.json; REBOUND_EVENTS_FORMAT=schema1 publishes
// the ParkedEvent itself, the form before CloudEvents, for one version.
//
// Events are at most once and never hold up a message: a park is final
// once its parked copy is confirmed, and its event is published after
// that, on a channel of its own (a missing exchange closes the channel it
// is published on), from a bounded queue. An event that cannot be
// published (queue full, channel closed, no confirm) is counted and
// logged, and not tried again.
//
// Concurrency: send may be called from any goroutine; close ends the
// publisher's goroutine and waits for it.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"sync"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// eventSchema is the version of ParkedEvent's JSON form; a field's
// meaning never changes within one.
const eventSchema = 1

// ParkedEvent is the event of one parked message. It never carries the
// body. As a CloudEvent's data it has no Schema (the event's type says
// what it is).
type ParkedEvent struct {
	Schema     int    `json:"schema,omitempty"`
	MessageID  string `json:"message_id"`
	Origin     string `json:"origin"`
	Reason     string `json:"reason"`
	Policy     string `json:"policy"`
	Group      string `json:"group"`
	Error      string `json:"error"`
	RetryCount int    `json:"retry_count"`
	ParkedAt   string `json:"parked_at"` // RFC 3339, milliseconds
}

// newParkedEvent returns the event of a message parked at parkedAt; the
// error a consumer reported is cut to maxEventError bytes.
func newParkedEvent(messageID, origin, reason, policy, group, errText string, retryCount int, parkedAt time.Time) ParkedEvent {
	return ParkedEvent{MessageID: messageID, Origin: origin, Reason: reason, Policy: policy, Group: group,
		Error: cutUTF8(errText, maxEventError), RetryCount: retryCount, ParkedAt: parkedAt.UTC().Format("2006-01-02T15:04:05.000Z07:00")}
}

const maxEventError = 1024

// The forms of park events (REBOUND_EVENTS_FORMAT).
const (
	EventsCloudEvents = "cloudevents"
	EventsSchema1     = "schema1"
)

// CloudEvent is a park event as a CloudEvent 1.0 in structured JSON mode
// (https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/spec.md).
type CloudEvent struct {
	SpecVersion     string      `json:"specversion"` // "1.0"
	ID              string      `json:"id"`          // unique per event
	Source          string      `json:"source"`      // the rebound deployment (EventsSource)
	Type            string      `json:"type"`        // parkedEventType and the reason
	Subject         string      `json:"subject"`     // the origin queue
	Time            string      `json:"time"`        // when the message was parked
	DataContentType string      `json:"datacontenttype"`
	Data            ParkedEvent `json:"data"`
}

// parkedEventType is the CloudEvents type of a park, followed by the
// reason: io.github.rebound-mq.parked.max-retries. Reverse DNS of the
// project's home, as CloudEvents asks.
const parkedEventType = "io.github.rebound-mq.parked."

// cloudEventContentType is the content type of a structured CloudEvent
// (the AMQP binding's structured mode).
const cloudEventContentType = "application/cloudevents+json; charset=utf-8"

// EventsSource is the CloudEvents source of a deployment's park events,
// the same on every replica: /rebound/<vhost>/<inbox>, each escaped.
func EventsSource(vhost, inbox string) string {
	return "/rebound/" + url.PathEscape(vhost) + "/" + url.PathEscape(inbox)
}

// eventEncoder returns how events of format are published: a
// CloudEvent with source, or the ParkedEvent as it is (schema1).
func eventEncoder(format, source string) func(ParkedEvent) amqp.Publishing {
	if format == EventsSchema1 {
		return func(e ParkedEvent) amqp.Publishing {
			e.Schema = eventSchema
			body, _ := json.Marshal(e) // strings and ints: cannot fail
			return amqp.Publishing{ContentType: "application/json", MessageId: e.MessageID, Type: "rebound.parked", Body: body}
		}
	}
	return func(e ParkedEvent) amqp.Publishing {
		ce := CloudEvent{SpecVersion: "1.0", ID: eventID(), Source: source, Type: parkedEventType + e.Reason,
			Subject: e.Origin, Time: e.ParkedAt, DataContentType: "application/json", Data: e}
		body, _ := json.Marshal(ce) // strings and ints: cannot fail
		return amqp.Publishing{ContentType: cloudEventContentType, MessageId: ce.ID, Type: ce.Type, Body: body}
	}
}

// eventID returns 128 random bits in hex: an id no other event has.
func eventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// eventRoutingKey is parked.<reason>.<origin>, cut to the 255 bytes AMQP
// allows a routing key (at a character boundary). An origin's dots become more
// words of the key: bind parked.*.payments.# for one service's origins.
func eventRoutingKey(reason, origin string) string {
	return cutUTF8("parked."+reason+"."+origin, 255)
}

// cutUTF8 returns s cut to at most n bytes, at a UTF-8 character boundary.
func cutUTF8(s string, n int) string {
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
	eventPublished = "published" // confirmed by the broker
	eventFailed    = "failed"    // nacked, unconfirmed in time, or its channel closed
	eventDropped   = "dropped"   // the queue was full, or rebound stopped first
)

// eventOutcomes are the outcomes an event is counted under, for a counter's
// series to exist from the start.
var eventOutcomes = []string{eventPublished, eventFailed, eventDropped}

// eventQueueSize bounds the events waiting to be published: a broker too slow
// for events loses events, never holds up parks.
const eventQueueSize = 1024

// eventConfirmTimeout is how long an event's confirm is awaited.
const eventConfirmTimeout = 5 * time.Second

// eventPublisher publishes parked events on its own channel of conn.
type eventPublisher struct {
	conn     *amqp.Connection
	exchange string
	encode   func(ParkedEvent) amqp.Publishing
	log      *zap.Logger
	count    func(outcome string)

	queue     chan ParkedEvent
	stop      chan struct{}
	done      sync.WaitGroup
	closeOnce sync.Once
}

// startEvents declares exchange (a durable topic exchange) and starts
// publishing events to it, as encode makes them, on a channel of conn.
// count is called once per event with its outcome. A declaration the
// broker refuses (an exchange of that name with another type, or no
// permission) is logged: parks go on, their events are counted failed.
func startEvents(conn *amqp.Connection, exchange string, encode func(ParkedEvent) amqp.Publishing, log *zap.Logger, count func(outcome string)) *eventPublisher {
	p := &eventPublisher{conn: conn, exchange: exchange, encode: encode, log: log, count: count,
		queue: make(chan ParkedEvent, eventQueueSize), stop: make(chan struct{})}
	if err := p.declare(); err != nil {
		log.Warn("events: exchange not declared; park events will fail until it exists", zap.String("exchange", exchange), zap.Error(err))
	}
	p.done.Add(1)
	go p.run()
	return p
}

func (p *eventPublisher) declare() error {
	ch, err := p.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return ch.ExchangeDeclare(p.exchange, amqp.ExchangeTopic, true, false, false, false, nil)
}

// send queues e for publishing without waiting; a full queue drops it.
func (p *eventPublisher) send(e ParkedEvent) {
	select {
	case <-p.stop:
		p.count(eventDropped)
		return
	default:
	}
	select {
	case p.queue <- e:
	default:
		p.count(eventDropped)
		p.log.Warn("events: queue full, park event dropped", zap.String("message_id", e.MessageID), zap.String("origin", e.Origin))
	}
}

// close stops publishing and waits for the goroutine to end; the events
// still queued are dropped and counted.
func (p *eventPublisher) close() {
	p.closeOnce.Do(func() { close(p.stop) })
	p.done.Wait()
	for {
		select {
		case <-p.queue:
			p.count(eventDropped)
		default:
			return
		}
	}
}

func (p *eventPublisher) run() {
	defer p.done.Done()
	var ch *eventChannel
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
				if ch, err = p.openChannel(); err != nil {
					p.fail(e, err)
					continue
				}
			}
			if err := p.publish(ch, e); err != nil {
				p.fail(e, err)
				continue
			}
			p.count(eventPublished)
		}
	}
}

// eventChannel is the events channel, in confirm mode, with its close
// notification: a missing exchange closes it, and the confirm then never
// comes.
type eventChannel struct {
	*amqp.Channel
	closed chan *amqp.Error
}

func (p *eventPublisher) openChannel() (*eventChannel, error) {
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open events channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("events channel confirm mode: %w", err)
	}
	return &eventChannel{Channel: ch, closed: ch.NotifyClose(make(chan *amqp.Error, 1))}, nil
}

func (p *eventPublisher) publish(ch *eventChannel, e ParkedEvent) error {
	ctx, cancel := context.WithTimeout(context.Background(), eventConfirmTimeout)
	defer cancel()
	msg := p.encode(e)
	msg.DeliveryMode, msg.Timestamp = amqp.Persistent, time.Now()
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, p.exchange, eventRoutingKey(e.Reason, e.Origin), false, false, msg)
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
		return fmt.Errorf("no confirm within %s", eventConfirmTimeout)
	}
}

func (p *eventPublisher) fail(e ParkedEvent, err error) {
	p.count(eventFailed)
	p.log.Warn("events: park event not published", zap.String("message_id", e.MessageID),
		zap.String("origin", e.Origin), zap.String("reason", e.Reason), zap.Error(err))
}
