package headers

import (
	"math"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestShow: how `rebound parked show` and the console print a header's
// value, by its type.
func TestShow(t *testing.T) {
	for _, tt := range []struct {
		v    any
		want string
	}{
		{"orders.new", `"orders.new"`},
		{[]byte("eu-1"), `"eu-1" (bytes)`},
		{[]byte{0xff, 0x00}, "/wA= (bytes, base64)"},
		{time.Date(2026, 11, 27, 9, 0, 0, 0, time.FixedZone("CET", 3600)), "2026-11-27T08:00:00Z (timestamp)"},
		{amqp.Table{"tenant": "eu", "n": int64(2)}, `{"n":2,"tenant":"eu"}`},
		{[]any{"a", int32(3)}, `["a",3]`},
		{amqp.Table{"ratio": math.NaN()}, "map[ratio:NaN] (amqp091.Table)"}, // no JSON for NaN
		{int64(5), "5 (int64)"},
	} {
		if got := Show(tt.v); got != tt.want {
			t.Errorf("Show(%#v) = %s, want %s", tt.v, got, tt.want)
		}
	}
}

func TestPrintable(t *testing.T) {
	for _, tt := range []struct {
		b    string
		want bool
	}{
		{"", true}, {"order 42\tüber\n", true}, {"nul\x00", false}, {"bell\a", false}, {"\xff\xfe", false},
	} {
		if got := Printable([]byte(tt.b)); got != tt.want {
			t.Errorf("Printable(%q) = %v, want %v", tt.b, got, tt.want)
		}
	}
}

func TestMarkAttempt(t *testing.T) {
	h := amqp.Table{"tenant": "eu"}
	MarkAttempt(h, "a-1")
	if h[Attempt] != "a-1" || h["tenant"] != "eu" || len(h) != 2 {
		t.Errorf("headers %v, want the attempt id beside the rest", h)
	}
}
