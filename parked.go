package main

// `rebound parked`: list, show, replay and purge parked messages. The
// broker work is in package parking; this file parses flags and prints.

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/parking"
)

const parkedUsage = `usage: rebound parked <command> [flags]

Operates on the parking queue (REBOUND_PARKING_QUEUE) of the broker in
REBOUND_AMQP_URL. Messages are read with manual acks and requeued, so
list and show change nothing (the order of the queue may change).

commands:
  list     list parked messages and a summary by reason and origin
  show ID  print one message in full: properties, headers, body
  replay   send matching messages back to their origin queue with their
           retry state reset; a parked message is removed only after the
           broker has confirmed its copy
  purge    delete matching parked messages (needs --yes)

Filters (list, replay, purge): --reason, --origin, --older-than, --limit.
Each command takes -h.`

// runParked dispatches `rebound parked <command>`.
func runParked(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"parked: missing command\n" + parkedUsage}
	}
	name, rest := args[0], args[1:]
	switch name {
	case "list":
		return parkedList(ctx, rest, environ, stdout, stderr)
	case "show":
		return parkedShow(ctx, rest, environ, stdout, stderr)
	case "replay":
		return parkedReplay(ctx, rest, environ, stdout, stderr)
	case "purge":
		return parkedPurge(ctx, rest, environ, stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, parkedUsage)
		return nil
	}
	return usageError{fmt.Sprintf("parked: unknown command %q\n%s", name, parkedUsage)}
}

// filterFlags adds the shared filter flags to fs.
func filterFlags(fs *flag.FlagSet) *parking.Filter {
	f := &parking.Filter{}
	fs.StringVar(&f.Reason, "reason", "", "only messages parked for this `reason` (max-retries, max-duration, non-retryable, unknown-origin)")
	fs.StringVar(&f.Origin, "origin", "", "only messages whose origin is this `queue`")
	fs.DurationVar(&f.OlderThan, "older-than", 0, "only messages parked longer ago than this `duration` (e.g. 1h)")
	fs.IntVar(&f.Limit, "limit", 0, "act on at most `n` matching messages (0 = all)")
	return f
}

func checkFilter(f *parking.Filter) error {
	if f.Limit < 0 {
		return usageError{fmt.Sprintf("--limit %d: want 0 (all) or more", f.Limit)}
	}
	if f.OlderThan < 0 {
		return usageError{fmt.Sprintf("--older-than %s: want a duration of 0 or more", f.OlderThan)}
	}
	return nil
}

// openParking loads the configuration and connects to the broker. The
// caller closes the connection.
func openParking(environ []string, role string) (parking.Queue, *amqp.Connection, error) {
	cfg, err := config.Load(environ)
	if err != nil {
		return parking.Queue{}, nil, err
	}
	conn, err := dialCLI(cfg, role)
	if err != nil {
		return parking.Queue{}, nil, err
	}
	q := parking.Queue{
		Conn: conn, Name: cfg.ParkingQueue, Codec: headers.NewCodec(cfg.HeaderNames()),
		ConfirmTimeout: cfg.ConfirmTimeout,
	}
	return q, conn, nil
}

// dialCLI connects for a one-shot command. Errors name the broker with its
// password redacted.
func dialCLI(cfg config.Config, role string) (*amqp.Connection, error) {
	tlsConfig, err := loadTLS(cfg)
	if err != nil {
		return nil, err
	}
	// The first broker of a cluster list that answers will do.
	var errs []error
	for _, url := range cfg.BrokerURLs() {
		conn, err := amqp.DialConfig(url, amqp.Config{
			Heartbeat:       10 * time.Second,
			Locale:          "en_US",
			TLSClientConfig: tlsConfig,
			Properties:      amqp.Table{"connection_name": "rebound " + role},
		})
		if err == nil {
			return conn, nil
		}
		errs = append(errs, fmt.Errorf("connect to %s: %w", config.Redact(url), err))
	}
	return nil, errors.Join(errs...)
}

// parkedJSON is one message in `list --format json`.
type parkedJSON struct {
	ID            string     `json:"id"`
	Origin        string     `json:"origin"`
	Reason        string     `json:"reason"`
	RetryCount    int        `json:"retry_count"`
	ParkedAt      *time.Time `json:"parked_at"`
	TaskStartedAt time.Time  `json:"task_started_at"`
	TaskAgeMs     int64      `json:"task_age_ms"`
	Error         string     `json:"error,omitempty"`
	BodyBytes     int        `json:"body_bytes"`
}

// listJSON is the whole `list --format json` document.
type listJSON struct {
	Scanned  int            `json:"scanned"`
	Matched  int            `json:"matched"`
	Messages []parkedJSON   `json:"messages"`
	ByReason map[string]int `json:"by_reason"`
	ByOrigin map[string]int `json:"by_origin"`
}

func parkedList(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("parked list", flag.ContinueOnError)
	f := filterFlags(fs)
	format := fs.String("format", "table", "output `format`: table or json")
	if done, err := parseFlags(fs, args, "usage: rebound parked list [flags]\n\nLists parked messages without removing them.", stderr); done || err != nil {
		return err
	}
	if err := checkFilter(f); err != nil {
		return err
	}
	if *format != "table" && *format != "json" {
		return usageError{fmt.Sprintf("--format %q: want table or json", *format)}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("parked list: unexpected argument %q", fs.Arg(0))}
	}
	q, conn, err := openParking(environ, "parked list")
	if err != nil {
		return err
	}
	defer conn.Close()
	now := time.Now()
	l, err := q.List(ctx, *f, now)
	if err != nil {
		return fmt.Errorf("list %s: %w", q.Name, err)
	}
	doc := listJSON{Scanned: l.Scanned, Matched: l.Matched, Messages: []parkedJSON{}, ByReason: map[string]int{}, ByOrigin: map[string]int{}}
	for _, m := range l.Messages {
		j := parkedJSON{
			ID: m.ID(), Origin: m.Origin, Reason: m.Reason, RetryCount: m.Retries,
			TaskStartedAt: m.StartedAt, TaskAgeMs: now.Sub(m.StartedAt).Milliseconds(),
			Error: m.Error, BodyBytes: len(m.Delivery.Body),
		}
		if !m.ParkedAt.IsZero() {
			j.ParkedAt = &m.ParkedAt
		}
		doc.Messages = append(doc.Messages, j)
		doc.ByReason[orDash(m.Reason)]++
		doc.ByOrigin[orDash(m.Origin)]++
	}
	if *format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tORIGIN\tREASON\tRETRIES\tPARKED AT\tTASK AGE\tERROR\tBYTES")
	for _, j := range doc.Messages {
		parkedAt := "-"
		if j.ParkedAt != nil {
			parkedAt = j.ParkedAt.UTC().Format(time.RFC3339)
		}
		age := (time.Duration(j.TaskAgeMs) * time.Millisecond).Round(time.Second)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\n", orDash(j.ID), orDash(j.Origin), orDash(j.Reason),
			j.RetryCount, parkedAt, age, orDash(oneLine(j.Error, 60)), j.BodyBytes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d shown, %d matching, %d parked read; by reason: %s; by origin: %s\n",
		len(doc.Messages), doc.Matched, doc.Scanned, counts(doc.ByReason), counts(doc.ByOrigin))
	return nil
}

func parkedShow(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("parked show", flag.ContinueOnError)
	// The id may come before the flags: `show ID` is how people type it.
	var id string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
	}
	if done, err := parseFlags(fs, args, "usage: rebound parked show ID\n\nPrints every parked message whose message id is ID, without removing it.", stderr); done || err != nil {
		return err
	}
	if id == "" && fs.NArg() > 0 {
		id = fs.Arg(0)
	}
	if id == "" || fs.NArg() > 1 {
		return usageError{"usage: rebound parked show ID"}
	}
	q, conn, err := openParking(environ, "parked show")
	if err != nil {
		return err
	}
	defer conn.Close()
	l, err := q.List(ctx, parking.Filter{ID: id}, time.Now())
	if err != nil {
		return fmt.Errorf("read %s: %w", q.Name, err)
	}
	if len(l.Messages) == 0 {
		return fmt.Errorf("no parked message with id %q in %s (%d read)", id, q.Name, l.Scanned)
	}
	for i, m := range l.Messages {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		printMessage(stdout, m)
	}
	if len(l.Messages) > 1 {
		fmt.Fprintf(stdout, "\n%d parked messages have id %q\n", len(l.Messages), id)
	}
	return nil
}

func printMessage(w io.Writer, m parking.Message) {
	d := m.Delivery
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	prop := func(name string, v any, set bool) {
		if set {
			fmt.Fprintf(tw, "%s:\t%v\n", name, v)
		}
	}
	prop("message id", d.MessageId, true)
	prop("origin", orDash(m.Origin), true)
	prop("reason", orDash(m.Reason), true)
	if !m.ParkedAt.IsZero() {
		prop("parked at", m.ParkedAt.UTC().Format(time.RFC3339Nano), true)
	}
	prop("retries", m.Retries, true)
	prop("task started", m.StartedAt.UTC().Format(time.RFC3339Nano), true)
	prop("content type", d.ContentType, d.ContentType != "")
	prop("content encoding", d.ContentEncoding, d.ContentEncoding != "")
	prop("delivery mode", d.DeliveryMode, d.DeliveryMode != 0)
	prop("priority", d.Priority, d.Priority != 0)
	prop("correlation id", d.CorrelationId, d.CorrelationId != "")
	prop("reply to", d.ReplyTo, d.ReplyTo != "")
	prop("expiration", d.Expiration, d.Expiration != "")
	prop("timestamp", d.Timestamp.UTC().Format(time.RFC3339), !d.Timestamp.IsZero())
	prop("type", d.Type, d.Type != "")
	prop("user id", d.UserId, d.UserId != "")
	prop("app id", d.AppId, d.AppId != "")
	_ = tw.Flush()
	fmt.Fprintln(w, "headers:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
		fmt.Fprintf(tw, "  %s:\t%s\n", k, headerValue(d.Headers[k]))
	}
	_ = tw.Flush()
	if printable(d.Body) {
		fmt.Fprintf(w, "body (%d bytes, text):\n%s\n", len(d.Body), d.Body)
		return
	}
	fmt.Fprintf(w, "body (%d bytes, binary, base64):\n%s\n", len(d.Body), base64.StdEncoding.EncodeToString(d.Body))
	preview := d.Body[:min(len(d.Body), 64)]
	fmt.Fprintf(w, "first %d bytes:\n%s", len(preview), hex.Dump(preview))
}

// headerValue formats one header value for people: strings and byte
// arrays quoted, tables and arrays as JSON where they can be.
func headerValue(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("%q", v)
	case []byte:
		if printable(v) {
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

// printable reports whether b is UTF-8 text a terminal shows as is.
func printable(b []byte) bool {
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

func parkedReplay(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("parked replay", flag.ContinueOnError)
	f := filterFlags(fs)
	dryRun := fs.Bool("dry-run", false, "report what would be replayed, change nothing")
	if done, err := parseFlags(fs, args, `usage: rebound parked replay [flags]

Sends matching parked messages back to their origin queue (default exchange,
routing key = origin) with their retry state reset: no retry count, a fresh
task start, no park headers. A parked message is removed only once the
broker has confirmed its copy; messages with an unknown or missing origin
stay parked and are reported. Interrupted, it loses nothing: at worst a
message is both replayed and still parked.`, stderr); done || err != nil {
		return err
	}
	if err := checkFilter(f); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("parked replay: unexpected argument %q", fs.Arg(0))}
	}
	q, conn, err := openParking(environ, "parked replay")
	if err != nil {
		return err
	}
	defer conn.Close()
	res, err := q.Replay(ctx, *f, time.Now(), *dryRun)
	verb := "replayed"
	if *dryRun {
		verb = "would replay"
	}
	fmt.Fprintf(stdout, "%s %d of %d matching messages (%d parked read); %d stay parked\n",
		verb, res.Replayed, res.Matched, res.Scanned, len(res.Kept))
	reportKept(stdout, res.Kept)
	if err != nil {
		return fmt.Errorf("replay from %s: %w", q.Name, err)
	}
	if len(res.Kept) > 0 {
		return fmt.Errorf("%d matching messages were not replayed and stay parked", len(res.Kept))
	}
	return nil
}

// reportKept lists the messages a replay left parked, grouped by cause.
func reportKept(w io.Writer, kept []parking.Kept) {
	const maxIDs = 20
	byWhy := map[string][]parking.Kept{}
	for _, k := range kept {
		byWhy[k.Why] = append(byWhy[k.Why], k)
	}
	for _, why := range slices.Sorted(maps.Keys(byWhy)) {
		ks := byWhy[why]
		fmt.Fprintf(w, "  %d stay parked: %s\n", len(ks), why)
		for i, k := range ks {
			if i == maxIDs {
				fmt.Fprintf(w, "    ... and %d more\n", len(ks)-maxIDs)
				break
			}
			fmt.Fprintf(w, "    id %s origin %s\n", orDash(k.Message.ID()), orDash(k.Message.Origin))
		}
	}
}

func parkedPurge(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("parked purge", flag.ContinueOnError)
	f := filterFlags(fs)
	yes := fs.Bool("yes", false, "really delete the matching messages")
	if done, err := parseFlags(fs, args, "usage: rebound parked purge --yes [flags]\n\nDeletes matching parked messages for good.", stderr); done || err != nil {
		return err
	}
	if err := checkFilter(f); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("parked purge: unexpected argument %q", fs.Arg(0))}
	}
	if !*yes {
		return usageError{"parked purge deletes messages for good: add --yes (see what matches first with `rebound parked list` and the same filters)"}
	}
	q, conn, err := openParking(environ, "parked purge")
	if err != nil {
		return err
	}
	defer conn.Close()
	scanned, removed, err := q.Purge(ctx, *f, time.Now())
	fmt.Fprintf(stdout, "purged %d messages (%d parked read)\n", removed, scanned)
	if err != nil {
		return fmt.Errorf("purge %s: %w", q.Name, err)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine shortens s to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// counts formats a tally as "a=2 b=1", largest first.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := slices.SortedFunc(maps.Keys(m), func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
