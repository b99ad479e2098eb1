package republisher

import amqp "github.com/rabbitmq/amqp091-go"

// Headers RabbitMQ routes on besides the routing key.
const (
	ccHeader  = "CC"
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
// headers must be the copy's own table: Copy sets its routing headers
// there, the one place they are set. CC and BCC route a publish to more
// queues than its routing key names, and rebound may publish to every
// queue of its vhost: whatever the producer or an earlier hop put in them
// is dropped, and CC is set to dest.CC alone.
func Copy(d amqp.Delivery, headers amqp.Table, dest Destination) amqp.Publishing {
	for _, name := range [...]string{ccHeader, bccHeader, legacyDelayHeader} {
		delete(headers, name)
	}
	if dest.CC != "" {
		headers[ccHeader] = []any{dest.CC}
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
