package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/consumer"
	"github.com/rebound-mq/rebound/internal/brokertest"
)

// TestForwardsEventsToTheWebhook: an event published as rebound
// publishes it reaches the webhook, after one failed POST.
func TestForwardsEventsToTheWebhook(t *testing.T) {
	b := brokertest.Require(t)
	prefix := brokertest.Unique(t)
	b.CleanupPrefix(t, b.URL, prefix)
	var calls atomic.Int32
	got := make(chan consumer.CloudEvent, 1)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		var e consumer.CloudEvent
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &e); err != nil || r.Header.Get("Content-Type") != "application/cloudevents+json; charset=utf-8" {
			t.Errorf("webhook got %q (%v)", body, err)
		}
		got <- e
	}))
	defer hook.Close()

	opt := options{url: b.URL, exchange: prefix + "events", queue: prefix + "webhook", binding: "parked.#",
		webhook: hook.URL, retryAfter: 10 * time.Millisecond}
	// The exchange, queue and binding as the forwarder declares them, so
	// that the event published below waits for it, however late it starts.
	conn := b.Dial(t, b.URL)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(opt.exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(opt.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(opt.queue, opt.binding, opt.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC().Format(time.RFC3339)
	want := consumer.CloudEvent{SpecVersion: "1.0", ID: "0123456789abcdef0123456789abcdef", Source: "/rebound/%2F/rebound.inbox",
		Type: "io.github.rebound-mq.parked.max-retries", Subject: "payments", Time: at, DataContentType: "application/json",
		Data: consumer.ParkedEvent{MessageID: "order-1", Origin: "payments", Reason: "max-retries", Policy: "default",
			Group: "0123456789ab", Error: "TimeoutError", RetryCount: 10, ParkedAt: at}}
	body, _ := json.Marshal(want)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, opt) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if err := ch.PublishWithContext(ctx, opt.exchange, "parked."+want.Data.Reason+"."+want.Data.Origin, false, false,
		amqp.Publishing{ContentType: "application/cloudevents+json; charset=utf-8", Body: body}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-got:
		if e != want {
			t.Errorf("webhook got %+v, want %+v", e, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no event reached the webhook")
	}
	if calls.Load() < 2 {
		t.Errorf("%d calls: the failed POST was not tried again", calls.Load())
	}
}
