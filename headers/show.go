package headers

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Show formats one header value for people, as `rebound parked show` and
// the console print it: strings and byte arrays quoted, tables and arrays
// as JSON where they can be, binary as base64.
func Show(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("%q", v)
	case []byte:
		if Printable(v) {
			return fmt.Sprintf("%q (bytes)", v)
		}
		return base64.StdEncoding.EncodeToString(v) + " (bytes, base64)"
	case time.Time:
		return v.UTC().Format(time.RFC3339) + " (timestamp)"
	case amqp.Table, []any:
		if b, err := json.Marshal(v); err == nil {
			return string(b)
		}
	}
	return fmt.Sprintf("%v (%T)", v, v)
}

// Printable reports whether b is UTF-8 text a terminal or a page shows as
// is.
func Printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			return false
		}
	}
	return true
}
