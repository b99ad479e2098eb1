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
	basicTypeAnnotation: true, headers.HeldTables: true,
}

// basicTypeAnnotation is where RabbitMQ puts the 0-9-1 type property in
// the AMQP 1.0 view of a message (AMQP 1.0 has no such property).
const basicTypeAnnotation = "x-basic-type"

// parked is the AMQP 0-9-1 copy of msg, a held copy that goes to the
// parking queue with reason v.Reason, parked at now: its body, its
// properties and its headers as the broker handed them over AMQP 1.0
// (application properties, and annotations but the broker's), its origin
// and the parking headers. RabbitMQ 4.3 (mc_amqpl) maps an x- header to a
// message annotation, tables and arrays included, and any other header to
// an application property, but leaves out those whose values are tables
// or arrays, which AMQP 1.0 application properties cannot hold: the copy
// carries those in headers.HeldTables, and parked puts them back.
func parked(msg *amqp10.Message, n headers.Names, v verdict, now time.Time) amqp.Publishing {
	pub := rebuilt(msg)
	if v.Origin != "" {
		pub.Headers[n.OriginQueue] = v.Origin
	}
	pub.Headers[n.ParkedReason] = string(v.Reason)
	pub.Headers[n.ParkedAt] = now.UnixMilli()
	return pub
}

// rebuilt is the AMQP 0-9-1 message of msg, as parked says, without the
// parking headers.
func rebuilt(msg *amqp10.Message) amqp.Publishing {
	h := amqp.Table{}
	for k, val := range msg.ApplicationProperties {
		h[k] = tableValue(val)
	}
	var held, basicType any
	for k, val := range msg.Annotations {
		name, ok := k.(string)
		if !ok {
			if s, isSymbol := k.(amqp10.Symbol); isSymbol {
				name, ok = string(s), true
			}
		}
		switch {
		case !ok:
		case name == headers.HeldTables:
			held = val
		case name == basicTypeAnnotation:
			basicType = val
		case !brokerAnnotations[name]:
			h[name] = tableValue(val)
		}
	}
	if held, ok := tableValue(held).(amqp.Table); ok {
		for k, val := range held {
			if _, present := h[k]; !present {
				h[k] = val
			}
		}
	}
	pub := amqp.Publishing{Headers: h, Body: body(msg)}
	if msg.Header != nil {
		pub.Priority = msg.Header.Priority
		if msg.Header.Durable {
			pub.DeliveryMode = amqp.Persistent
		}
	}
	pub.Type, _ = tableValue(basicType).(string)
	if p := msg.Properties; p != nil {
		pub.MessageId = idText(p.MessageID)
		pub.CorrelationId = idText(p.CorrelationID)
		if p.GroupID != nil {
			pub.AppId = *p.GroupID // where RabbitMQ puts the 0-9-1 app id
		}
		if p.ContentType != nil {
			pub.ContentType = *p.ContentType
		}
		if p.ContentEncoding != nil {
			pub.ContentEncoding = *p.ContentEncoding
		}
		if p.ReplyTo != nil {
			pub.ReplyTo = *p.ReplyTo
		}
		if p.Subject != nil && pub.Type == "" {
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

// idText is a message or correlation id as 0-9-1 holds it: RabbitMQ
// turns a 0-9-1 id of the form urn:uuid:... into an AMQP 1.0 UUID.
func idText(id any) string {
	switch id := id.(type) {
	case nil:
		return ""
	case amqp10.UUID:
		return "urn:uuid:" + id.String()
	}
	return fmt.Sprint(id)
}

// tableValue is v as an AMQP 0-9-1 table holds it.
func tableValue(v any) any {
	switch v := v.(type) {
	case amqp10.Symbol:
		return string(v)
	case int8, int16, int32, int64, uint8, uint16, uint32, float32, float64, string, bool, []byte, time.Time:
		return v
	case uint64:
		return int64(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = tableValue(e)
		}
		return out
	case map[string]any: // go-amqp's decoding of a map whose keys are all strings or symbols
		out := amqp.Table{}
		for k, e := range v {
			out[k] = tableValue(e)
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
