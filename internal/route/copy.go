package route

import amqp "github.com/rabbitmq/amqp091-go"

// copyOf returns the publishing for a copy of d with the given headers:
// the body and properties are kept, except expiration (in a delay queue
// it would cut the delay short; in the parking queue it would expire a
// parked message) and user id (the broker refuses a publish whose user id
// is not the publishing connection's user, and rebound's user is not the
// producer's).
//
// headers must be the copy's own table, from the headers Codec, which
// drops every header the broker owns, CC and BCC among them: a copy is
// routed by its destination alone.
func copyOf(d amqp.Delivery, headers amqp.Table) amqp.Publishing {
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
