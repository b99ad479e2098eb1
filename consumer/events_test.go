package consumer

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/eventstest"
)

// eventCounts counts an eventPublisher's outcomes while a test reads them.
type eventCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *eventCounts) count(outcome string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[outcome]++
}

func (o *eventCounts) get(outcome string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[outcome]
}

func (o *eventCounts) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fmt.Sprint(o.n)
}

func TestEventsRoutingKey(t *testing.T) {
	for _, tc := range []struct {
		name, reason, origin, want string
	}{
		{"plain", "max-retries", "payments.capture", "parked.max-retries.payments.capture"},
		{"cut at 255 bytes", "max-retries", strings.Repeat("q", 300), "parked.max-retries." + strings.Repeat("q", 255-len("parked.max-retries."))},
		{"cut before a split character", "max-retries", strings.Repeat("q", 235) + "ééé", "parked.max-retries." + strings.Repeat("q", 235)},
		{"a whole character that fits stays", "max-retries", strings.Repeat("q", 234) + "ééé", "parked.max-retries." + strings.Repeat("q", 234) + "é"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := eventRoutingKey(tc.reason, tc.origin)
			if got != tc.want {
				t.Errorf("routingKey = %q (%d bytes), want %q", got, len(got), tc.want)
			}
			if len(got) > 255 || !utf8.ValidString(got) {
				t.Errorf("%d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
			}
		})
	}
}

// TestParkedEventJSON: the two forms of a park event. schema1 is the
// ParkedEvent with exactly its nine fields; a CloudEvent carries the same
// fields but schema as its data, validates against
// docs/events/parked-event.schema.json, and names its reason in its type,
// its origin as its subject and the deployment as its source.
func TestParkedEventJSON(t *testing.T) {
	at := time.Date(2026, 11, 27, 2, 10, 3, 512_000_000, time.FixedZone("CET", 3600))
	e := newParkedEvent("order-8812", "payments.capture", "max-retries", "payments", "0123456789ab", strings.Repeat("x", 5000), 10, at)
	fields := map[string]any{"message_id": "order-8812", "origin": "payments.capture", "reason": "max-retries",
		"policy": "payments", "group": "0123456789ab", "retry_count": 10.0, "parked_at": "2026-11-27T01:10:03.512Z"}
	wantFields := func(t *testing.T, got map[string]any, want map[string]any) {
		t.Helper()
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s = %v, want %v", k, got[k], v)
			}
		}
		if got := len(got["error"].(string)); got != maxEventError {
			t.Errorf("error of %d bytes, want it cut to %d", got, maxEventError)
		}
		if len(got) != len(want)+1 {
			t.Errorf("fields %v: want exactly %d", got, len(want)+1)
		}
	}

	t.Run("schema1", func(t *testing.T) {
		msg := eventEncoder(EventsSchema1, "")(e)
		var got map[string]any
		if err := json.Unmarshal(msg.Body, &got); err != nil {
			t.Fatal(err)
		}
		want := maps.Clone(fields)
		want["schema"] = 1.0
		wantFields(t, got, want)
		if msg.ContentType != "application/json" || msg.Type != "rebound.parked" || msg.MessageId != "order-8812" {
			t.Errorf("schema1 properties: content type %q, type %q, message id %q", msg.ContentType, msg.Type, msg.MessageId)
		}
	})

	t.Run("cloudevents", func(t *testing.T) {
		source := EventsSource("/", "rebound.inbox")
		encode := eventEncoder(EventsCloudEvents, source)
		msg := encode(e)
		if err := eventstest.Validate(msg.Body); err != nil {
			t.Fatal(err)
		}
		var got struct {
			CloudEvent
			Data map[string]any `json:"data"`
		}
		if err := json.Unmarshal(msg.Body, &got); err != nil {
			t.Fatal(err)
		}
		if got.SpecVersion != "1.0" || got.Source != "/rebound/%2F/rebound.inbox" || got.Type != "io.github.rebound-mq.parked.max-retries" ||
			got.Subject != "payments.capture" || got.Time != "2026-11-27T01:10:03.512Z" || got.DataContentType != "application/json" {
			t.Errorf("envelope %+v", got.CloudEvent)
		}
		wantFields(t, got.Data, fields)
		if msg.ContentType != "application/cloudevents+json; charset=utf-8" || msg.Type != got.Type || msg.MessageId != got.ID {
			t.Errorf("properties: content type %q, type %q, message id %q (event id %q)", msg.ContentType, msg.Type, msg.MessageId, got.ID)
		}
		if again := encode(e); again.MessageId == msg.MessageId {
			t.Errorf("two events share the id %s", msg.MessageId)
		}
	})

	// What the schema refuses, so that the check above can fail.
	for name, body := range map[string]string{
		"no data":          `{"specversion":"1.0","id":"0123456789abcdef0123456789abcdef","source":"/rebound/%2F/rebound.inbox","type":"io.github.rebound-mq.parked.max-retries","subject":"o","time":"2026-11-27T01:10:03.512Z","datacontenttype":"application/json"}`,
		"schema 1 as data": string(eventEncoder(EventsSchema1, "")(e).Body),
	} {
		if err := eventstest.Validate([]byte(body)); err == nil {
			t.Errorf("%s: the event schema accepted %s", name, body)
		}
	}
}

// TestSendNeverWaits: an event that finds the queue full, one still
// queued when the publisher closes, and one sent after it closed are each
// dropped and counted, and Send returns at once.
func TestEventsSendNeverWaits(t *testing.T) {
	counts := map[string]int{}
	p := &eventPublisher{log: zap.NewNop(), count: func(outcome string) { counts[outcome]++ },
		queue: make(chan ParkedEvent, 1), stop: make(chan struct{})} // no publishing goroutine: nothing leaves the queue
	e := newParkedEvent("m1", "orders", "max-retries", "default", "0123456789ab", "", 3, time.Now())
	p.send(e)
	p.send(e) // the queue holds one
	if counts[eventDropped] != 1 {
		t.Fatalf("after a send to a full queue: %v, want 1 dropped", counts)
	}
	p.close()
	p.send(e)
	if counts[eventDropped] != 3 || counts[eventPublished]+counts[eventFailed] != 0 {
		t.Errorf("after close and a send: %v, want 3 dropped and nothing else", counts)
	}
}

// eventsBroker requires the broker under test and returns a connection
// to it and a prefix for the test's exchanges and queues, which are
// deleted at cleanup.
func eventsBroker(t *testing.T) (*amqp.Connection, string) {
	b := brokertest.Require(t)
	prefix := brokertest.Unique(t)
	b.CleanupPrefix(t, b.URL, prefix)
	return b.Dial(t, b.URL), prefix
}

// TestPublisherOnTheBroker: what a subscriber bound to parked.# gets of a
// park (the event as JSON, its routing key, type and message id); while
// the exchange is missing (deleted by hand), events fail, are counted and
// logged, and parks go on; once it exists again, events flow again.
func TestEventsPublisherOnTheBroker(t *testing.T) {
	conn, prefix := eventsBroker(t)
	exchange, queue := prefix+"events", prefix+"subscriber"
	core, logs := observer.New(zap.WarnLevel)
	o := &eventCounts{n: map[string]int{}}
	p := startEvents(conn, exchange, eventEncoder(EventsCloudEvents, EventsSource("/", "rebound.inbox")), zap.New(core), o.count)
	defer p.close()

	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "parked.#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 27, 2, 10, 3, 0, time.UTC)
	p.send(newParkedEvent("m1", "payments.capture", "max-retries", "default", "0123456789ab", "boom", 10, at))
	if !brokertest.Await(10*time.Second, func() bool { return o.get(eventPublished) == 1 }) {
		t.Fatalf("outcomes %v, want one published", o)
	}
	d, ok, err := ch.Get(queue, true)
	if err != nil || !ok {
		t.Fatalf("the subscriber got nothing: %v, %v", ok, err)
	}
	if err := eventstest.Validate(d.Body); err != nil {
		t.Error(err)
	}
	var got CloudEvent
	if err := json.Unmarshal(d.Body, &got); err != nil {
		t.Fatal(err)
	}
	if d.RoutingKey != "parked.max-retries.payments.capture" || d.ContentType != cloudEventContentType || d.Type != "io.github.rebound-mq.parked.max-retries" ||
		d.MessageId != got.ID || d.DeliveryMode != amqp.Persistent || got.Data.MessageID != "m1" || got.Data.Error != "boom" || got.Time != "2026-11-27T02:10:03.000Z" {
		t.Errorf("event: routing key %s, content type %s, type %s, id %s, %+v", d.RoutingKey, d.ContentType, d.Type, d.MessageId, got)
	}

	if err := ch.ExchangeDelete(exchange, false, false); err != nil {
		t.Fatal(err)
	}
	p.send(newParkedEvent("m2", "orders", "max-retries", "default", "0123456789ab", "", 10, at))
	if !brokertest.Await(10*time.Second, func() bool { return o.get(eventFailed) == 1 }) {
		t.Fatalf("outcomes %v, want one failed", o)
	}
	// The failure is counted, then logged: wait for the warning too.
	warnings := func() int {
		return len(logs.FilterMessage("events: park event not published").FilterField(zap.String("message_id", "m2")).All())
	}
	if brokertest.Await(10*time.Second, func() bool { return warnings() >= 1 }); warnings() != 1 {
		t.Errorf("%d warnings for m2's event, want 1", warnings())
	}

	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "parked.#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	p.send(newParkedEvent("m3", "orders", "max-retries", "default", "0123456789ab", "", 10, at))
	if !brokertest.Await(10*time.Second, func() bool { return o.get(eventPublished) == 2 }) {
		t.Fatalf("outcomes %v, want a second published once the exchange is back", o)
	}
	if d, ok, err := ch.Get(queue, true); err != nil || !ok || !strings.Contains(string(d.Body), `"message_id":"m3"`) {
		t.Errorf("after the exchange came back the subscriber got %s, %v, %v; want m3's event", d.Body, ok, err)
	}
}

// TestEventsFailWhileTheConnectionIsGone: a park event sent after the
// connection under the events publisher closed is counted failed and
// logged, and the next send is not held up by it.
func TestEventsFailWhileTheConnectionIsGone(t *testing.T) {
	conn, prefix := eventsBroker(t)
	core, logs := observer.New(zap.WarnLevel)
	o := &eventCounts{n: map[string]int{}}
	p := startEvents(conn, prefix+"events", eventEncoder(EventsCloudEvents, "/rebound/%2F/rebound.inbox"), zap.New(core), o.count)
	defer p.close()
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 27, 2, 10, 3, 0, time.UTC)
	for _, id := range []string{"m1", "m2"} {
		p.send(newParkedEvent(id, "orders", "max-retries", "default", "0123456789ab", "", 10, at))
	}
	// A failure is counted, then logged: wait for both.
	warnings := func() []observer.LoggedEntry { return logs.FilterMessage("events: park event not published").All() }
	if !brokertest.Await(10*time.Second, func() bool { return o.get(eventFailed) == 2 && len(warnings()) == 2 }) {
		t.Fatalf("outcomes %v and %d warnings, want two failed and logged", o, len(warnings()))
	}
	if o.get(eventPublished) != 0 {
		t.Errorf("outcomes %v: published without a connection", o)
	}
	if failed := warnings(); !strings.Contains(fmt.Sprint(failed[0].ContextMap()["error"]), "open events channel") {
		t.Errorf("warnings %v, want them to name the events channel", failed)
	}
}

// TestStartWithAnExchangeItCannotDeclare: an exchange of the name with
// another type is refused at start: rebound warns and starts anyway.
func TestEventsStartWithAnExchangeItCannotDeclare(t *testing.T) {
	conn, prefix := eventsBroker(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(prefix+"events", amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	p := startEvents(conn, prefix+"events", eventEncoder(EventsCloudEvents, "/rebound/%2F/rebound.inbox"), zap.New(core), func(string) {})
	p.close()
	if l := logs.FilterMessage("events: exchange not declared; park events will fail until it exists").All(); len(l) != 1 {
		t.Errorf("%d warnings about the exchange, want 1", len(l))
	}
}
