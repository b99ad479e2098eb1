//go:build ignore

// Command probenack shows amqp091-go v1.16.0 reporting, through
// NotifyPublish, a nacked publish as acked: a publish to a full queue
// (x-max-length 1, reject-publish) between two publishes to a quorum
// queue is nacked at once, and the quorum queue's later multiple ack
// marks it acked. Its DeferredConfirmation says nack, which is why
// republisher takes each copy's outcome from it. Against RabbitMQ 4.3, or
// the broker whose URL is given:
//
//	go run scripts/probenack/main.go [amqp://guest:guest@127.0.0.1:5672/]
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	url := "amqp://guest:guest@127.0.0.1:5674/"
	if len(os.Args) > 1 {
		url = os.Args[1]
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	ch.Confirm(false)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1000))
	s := fmt.Sprint(time.Now().UnixNano())
	qq, full := "probenack.qq."+s, "probenack.full."+s
	ch.QueueDeclare(qq, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	ch.QueueDeclare(full, true, false, false, false, amqp.Table{"x-max-length": int64(0), "x-overflow": "reject-publish"})
	defer ch.QueueDelete(qq, false, false, false)
	defer ch.QueueDelete(full, false, false, false)
	wrong, rounds := 0, 200
	for r := 0; r < rounds; r++ {
		var dcs []*amqp.DeferredConfirmation
		for _, q := range []string{qq, full, qq} {
			dc, _ := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, true, false, amqp.Publishing{DeliveryMode: 2, Body: []byte("x")})
			dcs = append(dcs, dc)
		}
		for i := 0; i < 3; i++ {
			c := <-confirms
			truth := dcs[c.DeliveryTag-dcs[0].DeliveryTag].Acked()
			if i == 1 && c.Ack != truth {
				wrong++
				if wrong <= 3 {
					fmt.Printf("round %d: tag %d to the full queue: NotifyPublish says ack=%v, its DeferredConfirmation says ack=%v\n", r, c.DeliveryTag, c.Ack, truth)
				}
			}
		}
	}
	fmt.Printf("%d of %d publishes refused by the full queue were reported as acked by NotifyPublish\n", wrong, rounds)
}
