//go:build ignore

// Telling rebound why a message failed, and when to try again
// (amqp091-go). A rejection carries no words, so the consumer republishes
// the message to rebound's inbox with headers, waits for the broker's
// confirm, then acks the original. Run by e2e/word_test.go as
// `go run word.go` with AMQP_URL, APP_QUEUE, INBOX_QUEUE, ERROR and
// RETRY_AFTER_MS: it takes one message of APP_QUEUE and reports it failed.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// reportFailure republishes d to rebound's inbox with the error, and the
// least delay a dependency asked for (0: none), on out, a channel in
// confirm mode; it acks d once the broker has confirmed the copy, and
// rejects it (rebound still gets it, without the words) otherwise.
func reportFailure(ctx context.Context, out *amqp.Channel, d amqp.Delivery, appQueue, inbox string, cause error, retryAfter time.Duration) error {
	h := amqp.Table{}
	for k, v := range d.Headers { // every header kept: rebound's state is in them
		h[k] = v
	}
	text := cause.Error()
	if len(text) > 1000 {
		text = text[:1000]
	}
	h["x-retry-error"] = text
	h["x-retry-origin-queue"] = appQueue
	count, _ := h["x-retry-count"].(int64)
	h["x-retry-error-retry"] = count
	if retryAfter > 0 {
		h["x-retry-after"] = retryAfter.Milliseconds() // an int64: a Go int goes out as 32 bits
	}
	confirm, err := out.PublishWithDeferredConfirmWithContext(ctx, "", inbox, true, false, amqp.Publishing{
		Headers: h, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: d.DeliveryMode,
		Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, MessageId: d.MessageId,
		Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
	})
	if err != nil {
		return d.Reject(false)
	}
	// A copy the broker returned (no inbox queue) is acked by its confirm
	// too: a returns listener (NotifyReturn) tells them apart.
	if ok, err := confirm.WaitContext(ctx); err != nil || !ok {
		return d.Reject(false)
	}
	return d.Ack(false)
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := amqp.Dial(os.Getenv("AMQP_URL"))
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	var d amqp.Delivery
	for ok := false; !ok; {
		if d, ok, err = ch.Get(os.Getenv("APP_QUEUE"), false); err != nil {
			return err
		}
		if !ok {
			time.Sleep(20 * time.Millisecond)
		}
	}
	ms, _ := strconv.Atoi(os.Getenv("RETRY_AFTER_MS"))
	return reportFailure(ctx, ch, d, os.Getenv("APP_QUEUE"), os.Getenv("INBOX_QUEUE"), fmt.Errorf("%s", os.Getenv("ERROR")), time.Duration(ms)*time.Millisecond)
}
