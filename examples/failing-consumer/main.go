// Command failing-consumer is rebound's demo application: it consumes a
// queue, fails every message it gets, and rejects it so RabbitMQ
// dead-letters it to rebound. It prints each attempt with the time since
// the message was first seen, so the backoff is visible, and exits once
// every message it published has ended in rebound's parking queue.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "failing-consumer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	url := flag.String("url", "amqp://guest:guest@localhost:5672/", "broker URL")
	queue := flag.String("queue", "demo.orders", "application queue")
	dlx := flag.String("dlx", "rebound.dlx", "rebound's dead-letter exchange")
	parking := flag.String("parking", "rebound.parked", "rebound's parking queue")
	count := flag.Int("messages", 3, "messages to publish")
	flag.Parse()

	conn, err := amqp.Dial(*url)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	// The one thing an application queue needs: dead-letter to rebound.
	if _, err := ch.QueueDeclare(*queue, true, false, false, false, amqp.Table{"x-dead-letter-exchange": *dlx}); err != nil {
		return fmt.Errorf("declare %s: %w", *queue, err)
	}
	parkedBefore, err := queueLen(conn, *parking)
	if err != nil {
		return fmt.Errorf("rebound's parking queue %s is missing; is rebound running? %w", *parking, err)
	}
	for i := 1; i <= *count; i++ {
		msg := amqp.Publishing{MessageId: fmt.Sprintf("order-%d", i), ContentType: "text/plain", DeliveryMode: amqp.Persistent,
			Timestamp: time.Now(), Body: []byte(fmt.Sprintf("order %d", i))}
		if err := ch.PublishWithContext(ctx, "", *queue, false, false, msg); err != nil {
			return err
		}
	}
	fmt.Printf("published %d messages to %s; failing every attempt\n", *count, *queue)

	deliveries, err := ch.Consume(*queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	firstSeen := map[string]time.Time{}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("consumer closed")
			}
			if _, seen := firstSeen[d.MessageId]; !seen {
				firstSeen[d.MessageId] = time.Now()
			}
			fmt.Printf("%7.1fs  %-8s  attempt %d  (x-retry-count=%v)  -> reject\n",
				time.Since(firstSeen[d.MessageId]).Seconds(), d.MessageId, retries(d)+1, d.Headers["x-retry-count"])
			if err := d.Nack(false, false); err != nil {
				return err
			}
		case <-tick.C:
			n, err := queueLen(conn, *parking)
			if err == nil && n-parkedBefore >= *count {
				fmt.Printf("all %d messages are parked in %s; look at them with: ./bin/rebound parked list\n", *count, *parking)
				return nil
			}
		}
	}
}

func retries(d amqp.Delivery) int64 {
	n, _ := d.Headers["x-retry-count"].(int64)
	return n
}

func queueLen(conn *amqp.Connection, queue string) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	return q.Messages, err
}
