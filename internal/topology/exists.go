package topology

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrCheckRefused is QueueExists's answer when the broker refuses the
// check: RabbitMQ 4.2.6 and later want a permission on a queue for a
// passive declaration of it.
var ErrCheckRefused = errors.New("passive queue.declare refused: RabbitMQ 4.2.6 and later want a permission on the queue")

// QueueExists reports whether queue exists in conn's virtual host, with a
// passive declaration on a channel of its own (a miss closes it). Before
// RabbitMQ 4.2.6 a passive declaration needs no permission; 4.2.6 and
// 4.3.0 want configure on the queue, later releases any permission
// (rabbitmq-server#16272), and without it the answer is ErrCheckRefused.
// Any other answer but the queue or NOT_FOUND is an error, not a guess.
func QueueExists(conn *amqp.Connection, queue string) (bool, error) {
	err := withChannel(conn, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
	var amqpErr *amqp.Error
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound:
		return false, nil
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp.AccessRefused:
		return false, fmt.Errorf("check queue %s: %w: %w", queue, ErrCheckRefused, err)
	}
	return false, fmt.Errorf("check queue %s: %w", queue, err)
}
