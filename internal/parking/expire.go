package parking

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Exporter keeps a copy of each message Expire removes: Export is called
// with every message first, and Sync before any of them is removed, so a
// message is gone from the queue only once its copy is safe.
type Exporter interface {
	Export(Message) error
	Sync() error
}

// expireResult is what Expire did.
type expireResult struct {
	Scanned  int // messages read from the queue
	Matched  int // messages parked longer ago than the retention (and matching the filter)
	Exported int // of them, written to the Exporter
	Removed  int // of them, removed (dry run: 0)
}

// expireBatch is how many messages Expire exports before it syncs the
// export and removes them: one sync per batch, not per message.
const expireBatch = 256

// Expire removes the parked messages f matches that were parked longer
// than retention ago (a message that does not say when it was parked
// never expires), at most f's limit. With export, each is exported and the
// export synced before it is removed; an export that fails stops Expire
// with that batch still parked. With dryRun nothing is removed (export
// still writes: an export without a removal is a backup).
func (q Queue) Expire(ctx context.Context, retention time.Duration, f Filter, now time.Time, export Exporter, dryRun bool) (res expireResult, err error) {
	if retention <= 0 {
		return res, errors.New("expire: no retention (REBOUND_PARKED_RETENTION) set")
	}
	f.OlderThan = max(f.OlderThan, retention)
	r, err := q.open()
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, r.Close()) }()
	var batch []amqp.Delivery
	flush := func() error {
		if export != nil && len(batch) > 0 {
			if err := export.Sync(); err != nil {
				return fmt.Errorf("sync the export: %w", err)
			}
		}
		if !dryRun {
			for _, d := range batch {
				if err := r.Remove(d); err != nil {
					return err
				}
				res.Removed++
			}
		}
		batch = batch[:0]
		return nil
	}
	err = q.eachMatch(ctx, r, f, now, &res.Scanned, &res.Matched, func(d amqp.Delivery, m Message) (bool, error) {
		if export != nil {
			if err := export.Export(m); err != nil {
				return false, fmt.Errorf("export message %q: %w", m.ID(), err)
			}
			res.Exported++
		}
		if batch = append(batch, d); len(batch) >= expireBatch {
			if err := flush(); err != nil {
				return false, err
			}
		}
		return true, nil
	})
	if err != nil {
		return res, err
	}
	if err := flush(); err != nil {
		return res, err
	}
	return res, ctx.Err()
}

// exportJSON is one line of an export (`rebound parked expire --export`):
// what rebound read of the message, its properties, its headers and its
// body in base64. Its field names are public interface.
type exportJSON struct {
	ID             string         `json:"id"`
	Origin         string         `json:"origin"`
	Reason         string         `json:"reason"`
	Policy         string         `json:"policy,omitempty"`
	Group          string         `json:"group"`
	Error          string         `json:"error,omitempty"`
	RetryCount     int            `json:"retry_count"`
	ParkedAt       *time.Time     `json:"parked_at"`
	TaskStartedAt  time.Time      `json:"task_started_at"`
	Properties     map[string]any `json:"properties"`
	Headers        map[string]any `json:"headers"`
	Body           string         `json:"body"`
	BodyEncoding   string         `json:"body_encoding"` // always "base64"
	ExportedAt     time.Time      `json:"exported_at"`
	ExportedSchema int            `json:"schema"` // 1
}

// jsonLines is an Exporter that writes one exportJSON a line to w, and
// calls sync (nil: none) when asked to Sync.
type jsonLines struct {
	enc  *json.Encoder
	sync func() error
	now  func() time.Time
}

// NewJSONLines returns an Exporter that writes JSON lines to w; now
// stamps each line.
func NewJSONLines(w io.Writer, sync func() error, now func() time.Time) Exporter {
	return &jsonLines{enc: json.NewEncoder(w), sync: sync, now: now}
}

// Export writes m's line.
func (j *jsonLines) Export(m Message) error {
	d := m.Delivery
	line := exportJSON{
		ID: m.ID(), Origin: m.Origin, Reason: m.Reason, Policy: m.Policy, Group: m.Group, Error: m.Error,
		RetryCount: m.Retries, TaskStartedAt: m.StartedAt, Headers: jsonTable(d.Headers),
		Body: base64.StdEncoding.EncodeToString(d.Body), BodyEncoding: "base64", ExportedAt: j.now().UTC(), ExportedSchema: 1,
		Properties: map[string]any{
			"content_type": d.ContentType, "content_encoding": d.ContentEncoding, "delivery_mode": d.DeliveryMode,
			"priority": d.Priority, "correlation_id": d.CorrelationId, "reply_to": d.ReplyTo, "expiration": d.Expiration,
			"message_id": d.MessageId, "timestamp": d.Timestamp, "type": d.Type, "user_id": d.UserId, "app_id": d.AppId,
		},
	}
	if !m.ParkedAt.IsZero() {
		line.ParkedAt = &m.ParkedAt
	}
	return j.enc.Encode(line)
}

// Sync calls the sync function.
func (j *jsonLines) Sync() error {
	if j.sync == nil {
		return nil
	}
	return j.sync()
}

// jsonTable turns a header table into values encoding/json writes as they
// read: byte arrays as base64 strings (as json does), decimals as their
// value and scale, nested tables and arrays alike.
func jsonTable(t amqp.Table) map[string]any {
	out := make(map[string]any, len(t))
	for k, v := range t {
		out[k] = jsonValue(v)
	}
	return out
}

func jsonValue(v any) any {
	switch v := v.(type) {
	case amqp.Table:
		return jsonTable(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = jsonValue(e)
		}
		return out
	case amqp.Decimal:
		return map[string]any{"decimal": v.Value, "scale": v.Scale}
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Sprint(v) // NaN and infinities are not JSON
		}
	case float32:
		if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Sprint(v)
		}
	}
	return v
}
