package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// amqp10Value is a value as the AMQP 1.0 client decoded it, with its type.
type amqp10Value struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}

// amqp10Message is what testdata/amqp10_client.py reports of a message.
type amqp10Message struct {
	ID            *amqp10Value            `json:"id"`
	Subject       *string                 `json:"subject"`
	ContentType   *string                 `json:"content_type"`
	CorrelationID *amqp10Value            `json:"correlation_id"`
	BodySection   string                  `json:"body_section"`
	Body          *amqp10Value            `json:"body"`
	Properties    map[string]*amqp10Value `json:"properties"`
	Annotations   map[string]*amqp10Value `json:"annotations"`
}

// amqp10Cases is how many messages testdata/amqp10_client.py sends.
const amqp10Cases = 4

// amqp10 runs testdata/amqp10_client.py with action on queue and returns
// what it printed. A send puts started (Unix ms) in x-task-started-at.
func amqp10(t *testing.T, url, queue, action string, started time.Time) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, debianPython, "testdata/amqp10_client.py")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "AMQP10_URL="+url, "QUEUE="+queue,
		"ACTION="+action, "COUNT="+strconv.Itoa(amqp10Cases), "STARTED_AT="+strconv.FormatInt(started.UnixMilli(), 10))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("AMQP 1.0 client, %s on %s: %v\n%s", action, queue, err, stderr.String())
	}
	return stdout.String()
}

// receive10 takes every case off queue over AMQP 1.0, by its case.
func receive10(t *testing.T, url, queue string) map[string]amqp10Message {
	t.Helper()
	var msgs []amqp10Message
	if err := json.Unmarshal([]byte(amqp10(t, url, queue, "receive", time.Time{})), &msgs); err != nil {
		t.Fatal(err)
	}
	out := map[string]amqp10Message{}
	for _, m := range msgs {
		c := m.Properties["case"]
		if c == nil {
			t.Fatalf("a message without its case property: %+v", m)
		}
		out[c.Value] = m
	}
	return out
}

// amqp10Broker requires a broker that speaks AMQP 1.0 natively, or skips.
func amqp10Broker(t *testing.T) {
	t.Helper()
	if b := brokertest.Require(t); !b.AtLeast(4, 0) {
		t.Skipf("RabbitMQ %s: AMQP 1.0 is native from 4.0 on (3.x speaks it only through the rabbitmq_amqp1_0 plugin, not enabled here)", b.Version())
	}
}

// TestAMQP10ClientThroughRebound: on RabbitMQ 4, an AMQP 1.0 producer
// publishes to an application queue, an AMQP 1.0 consumer rejects each
// message (outcome rejected, or modified and undeliverable here), rebound
// retries them, and the consumer receives them back. What survives the
// trip is pinned down here, field by field, against two controls: the
// same messages sent and received over AMQP 1.0 directly (all of it
// survives: the loss is not the broker's queues), and relayed once by a
// plain AMQP 0.9.1 client that copies every property and header (the same
// loss as rebound's: it is what any 0.9.1 hop costs).
func TestAMQP10ClientThroughRebound(t *testing.T) {
	amqp10Broker(t)
	requireClient(t, missingPython("proton", "python3-qpid-proton")())
	e := newTestEnv(t, map[string]string{"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "50ms", "REBOUND_MAX_RETRIES": "5"})
	e.startInProcess()
	// AMQP 1.0 on the same port as 0.9.1, the vhost named in the open frame's hostname.
	url := strings.TrimSuffix(e.URL(), "/")

	started := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	amqp10(t, url, e.App, "send", started)
	amqp10(t, url, e.App, "reject", started)
	e.WaitQueueLen(e.App, amqp10Cases, 30*time.Second)
	retried := receive10(t, url, e.App)

	direct := e.extraQueue("direct")
	amqp10(t, url, direct, "send", started)
	sent := receive10(t, url, direct)

	in, out := e.extraQueue("relay-in"), e.extraQueue("relay-out")
	amqp10(t, url, in, "send", started)
	for range amqp10Cases {
		d := e.Get(in, 10*time.Second)
		e.Publish(out, amqp.Publishing{
			Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: d.DeliveryMode,
			Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration,
			MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
		})
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	relayed := receive10(t, url, out)

	v := func(typ, value string) *amqp10Value { return &amqp10Value{Type: typ, Value: value} }
	str := func(s string) *string { return &s }
	started10 := v("long", strconv.FormatInt(started.UnixMilli(), 10))
	hex := func(s string) string { return fmt.Sprintf("%x", s) }
	type want struct {
		id, correlationID *amqp10Value
		subject           *string
		contentType       *string
		bodySection       string
		body              *amqp10Value
		properties        map[string]*amqp10Value
		annotations       map[string]*amqp10Value // some of the retried copy's annotations
	}
	// What the AMQP 1.0 consumer gets back from rebound, measured on 4.3.6.
	retriedWant := map[string]want{
		"string-id": {
			id: v("string", "order-1"), correlationID: v("string", "corr-1"), contentType: str("application/json"),
			subject:     nil, // order.created is gone
			bodySection: "data", body: v("binary", hex(`{"order": 1}`)),
			properties: map[string]*amqp10Value{
				"case": v("string", "string-id"), "outcome": v("string", "rejected"), "text": v("string", "x"),
				"count": v("long", "42"), "flag": v("boolean", "True"),
				"tier": v("string", "vip"), // was a symbol
			},
			annotations: map[string]*amqp10Value{"x-task-started-at": started10},
		},
		"uuid-id": {
			id: v("uuid", "3f1b7c2e-8a4d-4e6f-9b0a-1c2d3e4f5a6b"), bodySection: "amqp-value", body: v("string", "hello"),
			// x-task-started-at, sent as an application property, comes back as an annotation.
			properties:  map[string]*amqp10Value{"case": v("string", "uuid-id"), "outcome": v("string", "modified")},
			annotations: map[string]*amqp10Value{"x-task-started-at": started10},
		},
		"ulong-id": {
			id:          v("string", "7"), // was the ulong 7
			bodySection: "data", body: v("binary", hex("seven")),
			properties: map[string]*amqp10Value{"case": v("string", "ulong-id"), "outcome": v("string", "rejected")},
		},
		"binary-id": {
			id:          nil, // gone as the message id; the broker keeps it in an annotation
			bodySection: "data", body: v("binary", hex("binary")),
			properties:  map[string]*amqp10Value{"case": v("string", "binary-id"), "outcome": v("string", "modified")},
			annotations: map[string]*amqp10Value{"x-message-id": v("binary", "010203")},
		},
	}
	j := func(m any) string { b, _ := json.Marshal(m); return string(b) }
	for c, w := range retriedWant {
		t.Run(c, func(t *testing.T) {
			got := retried[c]
			t.Logf("sent    %s\nretried %s", j(sent[c]), j(got))
			if !reflect.DeepEqual(got.ID, w.id) || !reflect.DeepEqual(got.CorrelationID, w.correlationID) ||
				!reflect.DeepEqual(got.Subject, w.subject) || !reflect.DeepEqual(got.ContentType, w.contentType) {
				t.Errorf("id %s, correlation id %s, subject %s, content type %s; want %s, %s, %s, %s",
					j(got.ID), j(got.CorrelationID), j(got.Subject), j(got.ContentType), j(w.id), j(w.correlationID), j(w.subject), j(w.contentType))
			}
			if got.BodySection != w.bodySection || !reflect.DeepEqual(got.Body, w.body) {
				t.Errorf("body %s %s, want %s %s", got.BodySection, j(got.Body), w.bodySection, j(w.body))
			}
			if !reflect.DeepEqual(got.Properties, w.properties) {
				t.Errorf("application properties %s, want %s", j(got.Properties), j(w.properties))
			}
			// rebound's state reaches an AMQP 1.0 consumer as annotations.
			annotations := maps.Clone(w.annotations)
			if annotations == nil {
				annotations = map[string]*amqp10Value{}
			}
			annotations["x-retry-count"] = v("long", "1")
			annotations["x-retry-origin-queue"] = v("string", e.App)
			for k, want := range annotations {
				if !reflect.DeepEqual(got.Annotations[k], want) {
					t.Errorf("annotation %s = %s, want %s", k, j(got.Annotations[k]), j(want))
				}
			}
			// The controls: sent and received directly, everything
			// survives; through a plain 0.9.1 relay, as much as through
			// rebound.
			if s := sent[c]; s.Subject == nil && c == "string-id" || s.ID == nil ||
				c == "ulong-id" && s.ID.Type != "ulong" || c == "string-id" && s.Properties["tier"].Type != "symbol" {
				t.Errorf("sent and received directly over AMQP 1.0, the message changed: %s", j(s))
			}
			r := relayed[c]
			if !reflect.DeepEqual(r.ID, got.ID) || !reflect.DeepEqual(r.Subject, got.Subject) || !reflect.DeepEqual(r.Body, got.Body) ||
				!reflect.DeepEqual(r.Properties, got.Properties) || r.BodySection != got.BodySection {
				t.Errorf("a plain AMQP 0.9.1 relay kept other things than rebound: %s", j(r))
			}
		})
	}
}
