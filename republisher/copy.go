package republisher

import amqp "github.com/rabbitmq/amqp091-go"

const (
	// bccHeader routes a publish to more queues than its routing key
	// names, and is never delivered with the message.
	bccHeader = "BCC"
	// legacyDelayHeader is what rebound routed delayed copies on before
	// the delay exchange was direct: copies made then still carry it.
	legacyDelayHeader = "rebound-delay-ms"
)

// Copy returns the publishing for a copy of d with the given headers,
// bound for dest: the body and properties are kept, except expiration (in
// a delay queue it would cut the delay short; in the parking queue it
// would expire a parked message) and user id (the broker refuses a publish
// whose user id is not the publishing connection's user, and rebound's
// user is not the producer's). The sidecar and `rebound parked replay`
// both copy with it.
//
// headers must be the copy's own table, from the headers Codec (which
// drops every header the broker owns, CC and BCC among them): Copy sets the
// routing header there, the one place it is set. A delayed copy gets BCC
// with its origin queue alone: the broker routes on it when the delay queue
// dead-letters the copy back, and delivers the copy without it, so a
// consumer that republishes a retry with its headers sends it nowhere else.
func Copy(d amqp.Delivery, headers amqp.Table, dest Destination) amqp.Publishing {
	delete(headers, legacyDelayHeader)
	if dest.BackTo != "" {
		headers[bccHeader] = []any{dest.BackTo}
	}
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}
