package events

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestRoutingKey(t *testing.T) {
	for _, tc := range []struct {
		name, reason, origin, want string
	}{
		{"plain", "max-retries", "payments.capture", "parked.max-retries.payments.capture"},
		{"cut at 255 bytes", "max-retries", strings.Repeat("q", 300), "parked.max-retries." + strings.Repeat("q", 255-len("parked.max-retries."))},
		{"cut before a split character", "max-retries", strings.Repeat("q", 235) + "ééé", "parked.max-retries." + strings.Repeat("q", 235)},
		{"a whole character that fits stays", "max-retries", strings.Repeat("q", 234) + "ééé", "parked.max-retries." + strings.Repeat("q", 234) + "é"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := RoutingKey(tc.reason, tc.origin)
			if got != tc.want {
				t.Errorf("RoutingKey = %q (%d bytes), want %q", got, len(got), tc.want)
			}
			if len(got) > 255 || !utf8.ValidString(got) {
				t.Errorf("%d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
			}
		})
	}
}

func TestParkedEventJSON(t *testing.T) {
	at := time.Date(2026, 11, 27, 2, 10, 3, 512_000_000, time.FixedZone("CET", 3600))
	e := NewParked("order-8812", "payments.capture", "max-retries", "payments", "0123456789ab", strings.Repeat("x", 5000), 10, at)
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"schema": 1.0, "message_id": "order-8812", "origin": "payments.capture", "reason": "max-retries",
		"policy": "payments", "group": "0123456789ab", "retry_count": 10.0, "parked_at": "2026-11-27T01:10:03.512Z"}
	for k, v := range want {
		if fields[k] != v {
			t.Errorf("%s = %v, want %v", k, fields[k], v)
		}
	}
	if got := len(fields["error"].(string)); got != maxError {
		t.Errorf("error of %d bytes, want it cut to %d", got, maxError)
	}
	if len(fields) != len(want)+1 {
		t.Errorf("fields %v: schema 1 has exactly these nine", fields)
	}
}
