package console

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/parking"
)

// previewLimit is the most bytes of a body the message page shows.
const previewLimit = 64 << 10

// messageView is the message page's data. Every string in it is shown
// escaped, the body included.
type messageView struct {
	Group      string
	Stale      string
	ID         string
	Properties []field
	Headers    []field
	History    []death // the broker's x-death record, newest first
	Retry      []field // what rebound's headers say of its retries
	Body       bodyPreview
}

type field struct{ Name, Value string }

type death struct {
	Queue, Reason string
	Time          time.Time
}

// bodyPreview is a body as the page shows it.
type bodyPreview struct {
	Bytes     int
	Kind      string // json, text, binary
	Encoding  string // content encoding, and what the page did with it
	Text      string // json (indented) or text; for binary a hex dump
	Truncated bool   // Text covers only the first previewLimit bytes
}

func (s *Server) messageView(m parking.Message, now time.Time) messageView {
	d := m.Delivery
	v := messageView{ID: m.ID()}
	prop := func(name, value string) {
		if value != "" {
			v.Properties = append(v.Properties, field{name, value})
		}
	}
	prop("message id", d.MessageId)
	prop("content type", d.ContentType)
	prop("content encoding", d.ContentEncoding)
	if d.DeliveryMode != 0 {
		prop("delivery mode", fmt.Sprint(d.DeliveryMode))
	}
	if d.Priority != 0 {
		prop("priority", fmt.Sprint(d.Priority))
	}
	prop("correlation id", d.CorrelationId)
	prop("reply to", d.ReplyTo)
	prop("expiration", d.Expiration)
	if !d.Timestamp.IsZero() {
		prop("timestamp", d.Timestamp.UTC().Format(time.RFC3339))
	}
	prop("type", d.Type)
	prop("user id", d.UserId)
	prop("app id", d.AppId)
	for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
		v.Headers = append(v.Headers, field{k, headers.Show(d.Headers[k])})
	}
	for _, x := range headers.Deaths(d.Headers) {
		v.History = append(v.History, death{Queue: x.Queue, Reason: x.Reason, Time: x.Time})
	}
	retry := func(name, value string) { v.Retry = append(v.Retry, field{name, value}) }
	retry("origin", orDash(m.Origin))
	retry("parked reason", orDash(m.Reason))
	if !m.ParkedAt.IsZero() {
		retry("parked at", m.ParkedAt.UTC().Format(time.RFC3339)+" ("+now.Sub(m.ParkedAt).Round(time.Second).String()+" ago)")
	}
	retry("retries", fmt.Sprint(m.Retries))
	retry("task started", m.StartedAt.UTC().Format(time.RFC3339))
	retry("policy", orDash(m.Policy))
	retry("group", orDash(m.Group))
	if m.FirstDeathReason != "" || m.FirstDeathQueue != "" {
		retry("first death", orDash(m.FirstDeathReason)+" in "+orDash(m.FirstDeathQueue))
	}
	if m.Error != "" {
		e := m.Error
		if m.ErrorStamped {
			e += fmt.Sprintf(" (reported at retry %d)", m.ErrorRetry)
		}
		retry("error", e)
	}
	if m.RedirectedFrom != "" {
		retry("redirected from", m.RedirectedFrom)
	}
	v.Body = preview(d.Body, d.ContentType, d.ContentEncoding)
	return v
}

// preview shows a body by its content type: JSON indented, text as is,
// anything else as a hex dump; a gzip body is shown decompressed. At most
// previewLimit bytes are shown.
func preview(body []byte, contentType, encoding string) bodyPreview {
	p := bodyPreview{Bytes: len(body), Encoding: encoding}
	if strings.EqualFold(encoding, "gzip") {
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err == nil {
			plain, err := io.ReadAll(io.LimitReader(zr, previewLimit+1))
			if err == nil || len(plain) > 0 {
				body, p.Encoding = plain, "gzip, shown decompressed"
			}
		}
	}
	if len(body) > previewLimit {
		body, p.Truncated = body[:previewLimit], true
	}
	media, _, _ := mime.ParseMediaType(contentType)
	switch {
	case (media == "application/json" || strings.HasSuffix(media, "+json")) && !p.Truncated && json.Valid(body):
		var out bytes.Buffer
		if err := json.Indent(&out, body, "", "  "); err == nil {
			p.Kind, p.Text = "json", out.String()
			return p
		}
	}
	if headers.Printable(body) || (p.Truncated && headers.Printable(body[:lastRuneStart(body)])) {
		p.Kind, p.Text = "text", string(body[:lastRuneStart(body)])
		if !p.Truncated {
			p.Text = string(body)
		}
		return p
	}
	shown := body[:min(len(body), 4<<10)]
	p.Kind, p.Text = "binary", hex.Dump(shown)
	p.Truncated = p.Truncated || len(shown) < len(body)
	return p
}

// lastRuneStart is where the last, possibly cut, rune of b starts: a
// preview cut inside a rune drops it.
func lastRuneStart(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
