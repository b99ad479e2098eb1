//go:build ignore

// Telling rebound why a message failed, over AMQP 1.0 (go-amqp). On
// RabbitMQ 4.x an AMQP 1.0 consumer settles a failed delivery with the
// modified outcome (delivery-failed, undeliverable-here) and message
// annotations: the broker dead-letters the message to rebound with them,
// from a quorum queue. A classic queue drops the annotations (the message
// still reaches rebound, without the words): there, use headers (word.go).
// Run by e2e/word_test.go as `go run word10.go` with AMQP10_URL (the
// broker's amqp:// URL: RabbitMQ 4 serves AMQP 1.0 on the same port),
// APP_QUEUE, ERROR and RETRY_AFTER_MS: it takes one message of APP_QUEUE
// and fails it.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/go-amqp"
)

// fail settles msg, which receiver gave, as failed with rebound's
// annotations: the error, the least delay a dependency asked for (0:
// none), and whether the failure is for good.
func fail(ctx context.Context, receiver *amqp.Receiver, msg *amqp.Message, cause error, retryAfter time.Duration, permanent bool) error {
	text := cause.Error()
	if len(text) > 1000 {
		text = text[:1000]
	}
	annotations := amqp.Annotations{"x-opt-retry-error": text} // string keys go out as symbols
	if retryAfter > 0 {
		annotations["x-opt-retry-after"] = retryAfter.Milliseconds() // an int64: a long
	}
	if permanent {
		annotations["x-opt-retry-non-retryable"] = true
	}
	return receiver.ModifyMessage(ctx, msg, &amqp.ModifyMessageOptions{
		DeliveryFailed:    true,
		UndeliverableHere: true,
		Annotations:       annotations,
	})
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
	u, err := url.Parse(os.Getenv("AMQP10_URL"))
	if err != nil {
		return errors.New("AMQP10_URL is not a URL")
	}
	// The user and password in the URL are used for SASL PLAIN; RabbitMQ
	// takes the virtual host from the hostname, "vhost:NAME".
	opts := &amqp.ConnOptions{}
	if vhost := strings.TrimPrefix(u.Path, "/"); vhost != "" {
		opts.HostName = "vhost:" + vhost
	}
	conn, err := amqp.Dial(ctx, u.String(), opts)
	if err != nil {
		return err
	}
	defer conn.Close()
	session, err := conn.NewSession(ctx, nil)
	if err != nil {
		return err
	}
	queue := os.Getenv("APP_QUEUE")
	receiver, err := session.NewReceiver(ctx, "/queues/"+url.PathEscape(queue), &amqp.ReceiverOptions{Credit: 1})
	if err != nil {
		return err
	}
	msg, err := receiver.Receive(ctx, nil)
	if err != nil {
		return err
	}
	ms, _ := strconv.Atoi(os.Getenv("RETRY_AFTER_MS"))
	return fail(ctx, receiver, msg, errors.New(os.Getenv("ERROR")), time.Duration(ms)*time.Millisecond, false)
}
