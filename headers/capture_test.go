package headers

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// This file keeps real headers RabbitMQ wrote in testdata/, in a JSON form
// that records each value's Go type, so the normal tests decode exactly
// what amqp091-go hands rebound without needing a broker.
//
// Refresh the files against a running broker with
//
//	REBOUND_CAPTURE=1 go test -run TestCapture ./headers/
//
// (REBOUND_AMQP_URL overrides amqp://guest:guest@127.0.0.1:5672/).

// capture is one testdata file.
type capture struct {
	Broker    string            `json:"broker"`
	Scenario  string            `json:"scenario"`
	Queues    map[string]string `json:"queues"` // role (app, inbox, hop) -> name used
	Timestamp time.Time         `json:"timestamp"`
	Headers   typedValue        `json:"headers"`
}

// typedValue is one AMQP field value with its Go type spelled out.
type typedValue struct {
	Type  string          `json:"type"`
	Value json.RawMessage `json:"value,omitempty"`
}

func encodeTyped(v any) (typedValue, error) {
	raw := func(typ string, x any) (typedValue, error) {
		b, err := json.Marshal(x)
		return typedValue{Type: typ, Value: b}, err
	}
	switch v := v.(type) {
	case nil:
		return typedValue{Type: "void"}, nil
	case bool, uint8, int8, int16, int32, int64, uint16, uint32, string:
		// The Go type's name is the type's name in the file.
		return raw(fmt.Sprintf("%T", v), v)
	case float32:
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return typedValue{}, fmt.Errorf("float32 %v has no JSON form", v)
		}
		return raw("float32", v)
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return typedValue{}, fmt.Errorf("float64 %v has no JSON form", v)
		}
		return raw("float64", v)
	case amqp.Decimal:
		return raw("decimal", map[string]int64{"scale": int64(v.Scale), "value": int64(v.Value)})
	case []byte:
		return raw("bytes", base64.StdEncoding.EncodeToString(v))
	case time.Time:
		return raw("timestamp", v.UTC().Format(time.RFC3339Nano))
	case []any:
		items := make([]typedValue, len(v))
		for i, e := range v {
			var err error
			if items[i], err = encodeTyped(e); err != nil {
				return typedValue{}, fmt.Errorf("[%d]: %w", i, err)
			}
		}
		return raw("array", items)
	case amqp.Table:
		fields := make(map[string]typedValue, len(v))
		for k, e := range v {
			var err error
			if fields[k], err = encodeTyped(e); err != nil {
				return typedValue{}, fmt.Errorf("%s: %w", k, err)
			}
		}
		return raw("table", fields)
	}
	return typedValue{}, fmt.Errorf("%T is not an AMQP type", v)
}

// scalarParsers read each scalar type of the file as the Go type amqp091-go
// uses for it.
var scalarParsers = map[string]func(value string) (any, error){
	"bool": parseJSON[bool], "string": parseJSON[string],
	"uint8": parseUnsigned[uint8], "uint16": parseUnsigned[uint16], "uint32": parseUnsigned[uint32],
	"int8": parseSigned[int8], "int16": parseSigned[int16], "int32": parseSigned[int32], "int64": parseSigned[int64],
	"float32": parseFloat[float32], "float64": parseFloat[float64],
}

func parseJSON[T bool | string](value string) (any, error) {
	var x T
	err := json.Unmarshal([]byte(value), &x)
	return x, err
}

// Numbers go through strconv with T's own size, so a value that does not
// fit is an error instead of silently wrapping.
func parseUnsigned[T uint8 | uint16 | uint32](num string) (any, error) {
	u, err := strconv.ParseUint(num, 10, reflect.TypeFor[T]().Bits())
	return T(u), err
}

func parseSigned[T int8 | int16 | int32 | int64](num string) (any, error) {
	i, err := strconv.ParseInt(num, 10, reflect.TypeFor[T]().Bits())
	return T(i), err
}

func parseFloat[T float32 | float64](num string) (any, error) {
	f, err := strconv.ParseFloat(num, reflect.TypeFor[T]().Bits())
	return T(f), err
}

func decodeTyped(t typedValue) (any, error) {
	var v any
	var err error
	switch t.Type {
	case "void":
		return nil, nil
	case "decimal":
		var d struct{ Scale, Value int64 }
		if err = json.Unmarshal(t.Value, &d); err == nil {
			v = amqp.Decimal{Scale: uint8(d.Scale), Value: int32(d.Value)}
		}
	case "bytes":
		var s string
		if err = json.Unmarshal(t.Value, &s); err == nil {
			v, err = base64.StdEncoding.DecodeString(s)
		}
	case "timestamp":
		var s string
		if err = json.Unmarshal(t.Value, &s); err == nil {
			var ts time.Time
			// amqp091-go hands timestamps over in the local zone.
			if ts, err = time.Parse(time.RFC3339Nano, s); err == nil {
				v = ts.Local()
			}
		}
	case "array":
		var items []typedValue
		if err = json.Unmarshal(t.Value, &items); err == nil {
			arr := make([]any, len(items))
			for i, item := range items {
				if arr[i], err = decodeTyped(item); err != nil {
					return nil, fmt.Errorf("[%d]: %w", i, err)
				}
			}
			v = arr
		}
	case "table":
		var fields map[string]typedValue
		if err = json.Unmarshal(t.Value, &fields); err == nil {
			table := make(amqp.Table, len(fields))
			for k, f := range fields {
				if table[k], err = decodeTyped(f); err != nil {
					return nil, fmt.Errorf("%s: %w", k, err)
				}
			}
			v = table
		}
	default:
		parse, isScalar := scalarParsers[t.Type]
		if !isScalar {
			err = fmt.Errorf("unknown type %q", t.Type)
			break
		}
		v, err = parse(string(t.Value))
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", t.Type, t.Value, err)
	}
	return v, nil
}

// loadCapture reads testdata/name back into the table amqp091-go decoded.
func loadCapture(t testing.TB, name string) (capture, amqp.Table) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var c capture
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	v, err := decodeTyped(c.Headers)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	h, ok := v.(amqp.Table)
	if !ok {
		t.Fatalf("%s: headers are %T, want a table", name, v)
	}
	return c, h
}

func TestTypedJSONRoundTrip(t *testing.T) {
	h := amqp.Table{
		"void": nil, "bool": true, "uint8": uint8(200), "int8": int8(-3), "int16": int16(-300),
		"int32": int32(-70000), "int64": int64(math.MinInt64), "uint16": uint16(65000),
		"uint32": uint32(math.MaxUint32), "float32": float32(1.5), "float64": 0.1,
		"decimal": amqp.Decimal{Scale: 2, Value: -12345}, "string": "héllo", "bytes": []byte{0, 255},
		"timestamp": time.Unix(1700000000, 0),
		"array":     []any{int64(1), "two", amqp.Table{"three": int32(3)}},
		"table":     amqp.Table{"nested": []any{}},
	}
	enc, err := encodeTyped(h)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(enc)
	if err != nil {
		t.Fatal(err)
	}
	var back typedValue
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	got, err := decodeTyped(back)
	if err != nil {
		t.Fatal(err)
	}
	if !tablesEqual(got, h) {
		t.Errorf("round trip\n got %#v\nwant %#v", got, h)
	}
}

// tablesEqual compares field values with their exact Go types; times are
// compared as instants, since the zone is not part of an AMQP timestamp.
func tablesEqual(a, b any) bool {
	switch a := a.(type) {
	case amqp.Table:
		b, ok := b.(amqp.Table)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			w, ok := b[k]
			if !ok || !tablesEqual(v, w) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !tablesEqual(a[i], b[i]) {
				return false
			}
		}
		return true
	case []byte:
		b, ok := b.([]byte)
		return ok && string(a) == string(b)
	case time.Time:
		b, ok := b.(time.Time)
		return ok && a.Equal(b)
	}
	return a == b
}

func TestCapture(t *testing.T) {
	if os.Getenv("REBOUND_CAPTURE") == "" {
		t.Skip("set REBOUND_CAPTURE=1 to capture x-death tables from the broker into testdata/")
	}
	url := os.Getenv("REBOUND_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("capture needs a broker: %v", err)
	}
	// Registered before the deletes below, so it runs after them.
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	broker := fmt.Sprintf("%v %v", conn.Properties["product"], conn.Properties["version"])

	// Names are unique so a capture can run next to anything else; they
	// show up in the files, which is why the tests read them from there.
	prefix := fmt.Sprintf("rebound.capture.%d.", time.Now().UnixNano())
	app, inbox, hop, dlx := prefix+"app", prefix+"inbox", prefix+"delay.1500", prefix+"dlx"
	queues := map[string]string{"app": app, "inbox": inbox, "hop": hop, "dead-letter-exchange": dlx}
	t.Cleanup(func() {
		for _, q := range []string{app, inbox, hop} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("delete queue %s: %v", q, err)
			}
		}
		if err := ch.ExchangeDelete(dlx, false, false); err != nil {
			t.Errorf("delete exchange %s: %v", dlx, err)
		}
	})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ch.ExchangeDeclare(dlx, amqp.ExchangeFanout, false, false, false, false, nil))
	_, err = ch.QueueDeclare(app, false, false, false, false, amqp.Table{"x-dead-letter-exchange": dlx})
	must(err)
	_, err = ch.QueueDeclare(inbox, false, false, false, false, nil)
	must(err)
	must(ch.QueueBind(inbox, "", dlx, false, nil))
	// The hop is a delay queue as rebound declares one: it hands the
	// message back to the app queue through the default exchange.
	_, err = ch.QueueDeclare(hop, false, false, false, false, amqp.Table{
		"x-message-ttl": int64(1500), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": app,
	})
	must(err)

	get := func(q string) amqp.Delivery {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			d, ok, err := ch.Get(q, false)
			must(err)
			if ok {
				return d
			}
		}
		t.Fatalf("no message in %s", q)
		return amqp.Delivery{}
	}
	save := func(file, scenario string, d amqp.Delivery) {
		t.Helper()
		enc, err := encodeTyped(d.Headers)
		must(err)
		c := capture{Broker: broker, Scenario: scenario, Queues: queues, Timestamp: d.Timestamp.UTC(), Headers: enc}
		b, err := json.MarshalIndent(c, "", "  ")
		must(err)
		must(os.WriteFile(filepath.Join("testdata", file), append(b, '\n'), 0o644))
		t.Logf("wrote testdata/%s from %s", file, broker)
	}

	// Application headers in the types other clients send, to see what
	// the broker hands back after dead-lettering.
	appHeaders := amqp.Table{
		"x-retry-error": "connection refused", "tenant": "acme", "attempt-int32": int32(7),
		"priority-hint": int16(2), "trace": amqp.Table{"span": "abc"},
	}
	sent := time.Now().Truncate(time.Second)
	must(ch.Publish("", app, true, false, amqp.Publishing{
		Headers: appHeaders, Timestamp: sent, MessageId: "capture-1", Body: []byte("hello"),
	}))
	// AMQP timestamps have whole seconds: wait so the timestamp property,
	// the first death and the delay queue's death are told apart.
	time.Sleep(1100 * time.Millisecond)
	must(get(app).Reject(false))
	first := get(inbox)
	save("xdeath-rejected-once.json",
		"published to the app queue through the default exchange, rejected with requeue=false, "+
			"dead-lettered through a fanout exchange to an inbox queue", first)

	// What rebound does: republish into a delay queue with every header
	// kept (x-death included), let the TTL hand it back, reject it again.
	must(ch.Publish("", hop, true, false, amqp.Publishing{
		Headers: first.Headers, Timestamp: first.Timestamp, MessageId: first.MessageId, Body: first.Body,
	}))
	must(first.Ack(false))
	must(get(app).Reject(false))
	second := get(inbox)
	save("xdeath-after-delay-hop.json",
		"the first capture's message republished with its headers into a TTL queue that dead-letters "+
			"back to the app queue through the default exchange (as rebound's delay queues do), "+
			"rejected again and dead-lettered to the inbox", second)
	must(second.Ack(false))
}

func TestDecodeCaptured(t *testing.T) {
	c := NewCodec(DefaultNames())
	for _, file := range []string{"xdeath-rejected-once.json", "xdeath-after-delay-hop.json"} {
		t.Run(file, func(t *testing.T) {
			capt, h := loadCapture(t, file)
			if capt.Broker != "RabbitMQ 3.10.8" {
				t.Errorf("broker = %q", capt.Broker)
			}
			// The types amqp091-go hands over, which is what the readers
			// must accept: x-death an array of tables, count a long, time
			// a timestamp.
			deaths, ok := h[XDeath].([]any)
			if !ok || len(deaths) == 0 {
				t.Fatalf("x-death = %T", h[XDeath])
			}
			var oldest time.Time
			for i, d := range deaths {
				entry, ok := d.(amqp.Table)
				if !ok {
					t.Fatalf("x-death[%d] = %T", i, d)
				}
				if _, ok := entry["count"].(int64); !ok {
					t.Errorf("x-death[%d].count = %T", i, entry["count"])
				}
				at, ok := entry["time"].(time.Time)
				if !ok {
					t.Fatalf("x-death[%d].time = %T", i, entry["time"])
				}
				if oldest.IsZero() || at.Before(oldest) {
					oldest = at
				}
			}
			if err := h.Validate(); err != nil {
				t.Fatal(err)
			}

			now := capt.Timestamp.Add(time.Minute)
			s, problems := c.Decode(h, capt.Timestamp, now, nil)
			if len(problems) != 0 {
				t.Errorf("problems = %v", problems)
			}
			if s.Origin != capt.Queues["app"] {
				t.Errorf("Origin = %q, want the app queue %q", s.Origin, capt.Queues["app"])
			}
			if s.Retries != 0 || !s.StartedAt.Equal(capt.Timestamp) {
				t.Errorf("state = %+v, want no retries, started at the timestamp property %v", s, capt.Timestamp)
			}
			// Without the timestamp property, the first death.
			if s, _ := c.Decode(h, time.Time{}, now, nil); !s.StartedAt.Equal(oldest) {
				t.Errorf("StartedAt = %v, want the oldest x-death time %v", s.StartedAt, oldest)
			}

			before := fmt.Sprint(h)
			out := c.Retry(h, s, time.Second, time.Time{})
			checkCopy(t, h, out, before, now)
			again, _ := c.Decode(out, time.Time{}, now, nil)
			if again.Retries != 1 || again.Origin != s.Origin || !again.StartedAt.Equal(s.StartedAt) {
				t.Errorf("decoded copy = %+v", again)
			}
		})
	}
}

// TestCapturedRoundTripOrder pins down what the delay-hop capture shows
// about RabbitMQ 3.10: when the app queue dead-letters the message again,
// its x-death entry moves to the front (count 2) and keeps its first time,
// so the newest entry is the app queue, not the delay queue, and the
// oldest time is not the last entry's.
func TestCapturedRoundTripOrder(t *testing.T) {
	capt, h := loadCapture(t, "xdeath-after-delay-hop.json")
	deaths := h[XDeath].([]any)
	if len(deaths) != 2 {
		t.Fatalf("x-death has %d entries, want 2", len(deaths))
	}
	newest, last := deaths[0].(amqp.Table), deaths[1].(amqp.Table)
	if newest["queue"] != capt.Queues["app"] || newest["reason"] != "rejected" || newest["count"] != int64(2) {
		t.Errorf("newest entry = %v", newest)
	}
	if last["queue"] != capt.Queues["hop"] || last["reason"] != "expired" {
		t.Errorf("last entry = %v", last)
	}
	if !newest["time"].(time.Time).Before(last["time"].(time.Time)) {
		t.Errorf("newest entry's time %v is not before the last entry's %v", newest["time"], last["time"])
	}
}
