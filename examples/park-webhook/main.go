// Command park-webhook forwards rebound's park events to a webhook: it
// binds a queue of its own to REBOUND_EVENTS_EXCHANGE, and POSTs each
// event (a CloudEvent in structured JSON mode) to a URL (a chat's incoming webhook, a ticketing system),
// acking the event once the webhook answered 2xx. A webhook that fails is
// tried again after a pause: the event waits in the queue meanwhile.
//
//	park-webhook -url amqp://... -exchange rebound.events -bind 'parked.#' -webhook https://hooks.example/...
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet("park-webhook", flag.ExitOnError)
	opt := options{}
	fs.StringVar(&opt.url, "url", "amqp://guest:guest@localhost:5672/", "broker URL")
	fs.StringVar(&opt.exchange, "exchange", "rebound.events", "REBOUND_EVENTS_EXCHANGE")
	fs.StringVar(&opt.queue, "queue", "rebound.events.webhook", "the queue this forwarder binds and consumes")
	fs.StringVar(&opt.binding, "bind", "parked.#", "binding key: parked.<reason>.<origin>, e.g. parked.*.payments.#")
	fs.StringVar(&opt.webhook, "webhook", "", "URL to POST each event to")
	_ = fs.Parse(os.Args[1:])
	if err := run(ctx, opt); err != nil {
		fmt.Fprintln(os.Stderr, "park-webhook:", err)
		os.Exit(1)
	}
}

type options struct {
	url, exchange, queue, binding, webhook string
	retryAfter                             time.Duration // pause after a failed POST; default 5s
}

func run(ctx context.Context, opt options) error {
	if opt.webhook == "" {
		return fmt.Errorf("-webhook is required")
	}
	if opt.retryAfter <= 0 {
		opt.retryAfter = 5 * time.Second
	}
	conn, err := amqp.Dial(opt.url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	// rebound declares the exchange; declaring it here too (alike) lets
	// the forwarder start first.
	if err := ch.ExchangeDeclare(opt.exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(opt.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return err
	}
	if err := ch.QueueBind(opt.queue, opt.binding, opt.exchange, false, nil); err != nil {
		return err
	}
	if err := ch.Qos(1, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.ConsumeWithContext(ctx, opt.queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 10 * time.Second}
	for d := range deliveries {
		if err := post(ctx, client, opt.webhook, d.ContentType, d.Body); err != nil {
			fmt.Fprintf(os.Stderr, "park-webhook: %v; trying again in %s\n", err, opt.retryAfter)
			_ = d.Nack(false, true)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(opt.retryAfter):
			}
			continue
		}
		if err := d.Ack(false); err != nil {
			return err
		}
	}
	return nil
}

// post sends event with its own content type: a CloudEvent in structured
// mode keeps application/cloudevents+json over HTTP too, which is how a
// CloudEvents receiver (Knative, Argo Events) tells it from plain JSON.
func post(ctx context.Context, client *http.Client, url, contentType string, event []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(event))
	if err != nil {
		return err
	}
	if contentType == "" {
		contentType = "application/json"
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("webhook answered %s", resp.Status)
	}
	return nil
}
