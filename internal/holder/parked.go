package holder

import (
	"fmt"
	"strings"
	"time"

	amqp10 "github.com/Azure/go-amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
)

// brokerAnnotations are what the broker writes on a message it delivers
// over AMQP 1.0, and the hold queue's delivery time: none is the
// application's, and a parked copy does not carry them.
var brokerAnnotations = map[string]bool{
	routingKeyAnnotation: true, ccAnnotation: true, "x-exchange": true,
	"x-acquired-count": true, "x-delivery-count": true, headers.XOptDeliveryTime: true,
}

// Parked is the AMQP 0-9-1 copy of msg, a held copy that goes to the
// parking queue with reason v.Reason, parked at now: its body, its
// properties and its headers as the broker handed them over AMQP 1.0
// (application properties, and annotations but the broker's), its origin
// and the parking headers. RabbitMQ 4.3 drops 0-9-1 headers that hold
// tables or arrays from the application properties of the AMQP 1.0 view:
// those a parked copy lacks.
func Parked(msg *amqp10.Message, n headers.Names, v Verdict, now time.Time) amqp.Publishing {
	h := amqp.Table{}
	for k, val := range msg.ApplicationProperties {
		h[k] = tableValue(val)
	}
	for k, val := range msg.Annotations {
		name, ok := k.(string)
		if !ok {
			if s, isSymbol := k.(amqp10.Symbol); isSymbol {
				name, ok = string(s), true
			}
		}
		if ok && !brokerAnnotations[name] {
			h[name] = tableValue(val)
		}
	}
	if v.Origin != "" {
		h[n.OriginQueue] = v.Origin
	}
	h[n.ParkedReason] = string(v.Reason)
	h[n.ParkedAt] = now.UnixMilli()
	pub := amqp.Publishing{Headers: h, Body: body(msg)}
	if msg.Header != nil {
		pub.Priority = msg.Header.Priority
		if msg.Header.Durable {
			pub.DeliveryMode = amqp.Persistent
		}
	}
	if p := msg.Properties; p != nil {
		pub.MessageId = idText(p.MessageID)
		pub.CorrelationId = idText(p.CorrelationID)
		if p.ContentType != nil {
			pub.ContentType = *p.ContentType
		}
		if p.ContentEncoding != nil {
			pub.ContentEncoding = *p.ContentEncoding
		}
		if p.ReplyTo != nil {
			pub.ReplyTo = *p.ReplyTo
		}
		if p.Subject != nil {
			pub.Type = *p.Subject
		}
		if p.CreationTime != nil {
			pub.Timestamp = *p.CreationTime
		}
	}
	return pub
}

// body is msg's application data: its data sections, joined; a value
// section as text.
func body(msg *amqp10.Message) []byte {
	if len(msg.Data) > 0 {
		var b []byte
		for _, d := range msg.Data {
			b = append(b, d...)
		}
		return b
	}
	if msg.Value != nil {
		return []byte(fmt.Sprint(msg.Value))
	}
	return nil
}

func idText(id any) string {
	if id == nil {
		return ""
	}
	return fmt.Sprint(id)
}

// tableValue is v as an AMQP 0-9-1 table holds it.
func tableValue(v any) any {
	switch v := v.(type) {
	case amqp10.Symbol:
		return string(v)
	case int8, int16, int32, int64, float32, float64, string, bool, []byte, time.Time:
		return v
	case uint8:
		return int64(v)
	case uint16:
		return int64(v)
	case uint32:
		return int64(v)
	case uint64:
		return int64(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = tableValue(e)
		}
		return out
	case map[any]any:
		out := amqp.Table{}
		for k, e := range v {
			out[strings.TrimSpace(fmt.Sprint(k))] = tableValue(e)
		}
		return out
	case nil:
		return nil
	}
	return fmt.Sprint(v)
}
