package cli

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
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/group"
	"github.com/rebound-mq/rebound/internal/parking"
	"github.com/rebound-mq/rebound/policy"
)

// parkedReasons are the reasons --reason accepts: every reason rebound
// parks for, the one the broker's delivery limit gives, and cancelled.
func parkedReasons() []string {
	out := make([]string, 0, len(policy.Reasons)+2)
	for _, r := range policy.Reasons {
		out = append(out, string(r))
	}
	// Written by others than the sidecar: the broker (past a quorum
	// queue's delivery limit) and `rebound delayed cancel`.
	return append(out, string(policy.DeliveryLimit), string(policy.Cancelled))
}

// filterFlags adds the shared filter flags to fs.
func filterFlags(fs *flag.FlagSet) *parking.Filter {
	f := &parking.Filter{}
	fs.StringVar(&f.Reason, "reason", "", "only messages parked for this `reason`: "+strings.Join(parkedReasons(), ", "))
	fs.Func("origin", "only messages whose origin matches this "+originHelp, func(s string) (err error) {
		f.Origins, err = compileOrigin(s)
		return err
	})
	fs.StringVar(&f.Group, "group", "", "only messages of this failure `group` (12 hex digits, as `rebound parked groups` lists them)")
	fs.Var((*days)(&f.OlderThan), "older-than", "only messages parked longer ago than this `duration`: Go's units and d for days (90m, 36h, 2d, 2d12h)")
	fs.IntVar(&f.Limit, "limit", 0, "act on at most `n` matching messages, and stop reading there (0 = all)")
	fs.Func("parked-before", "only messages parked before this `time` (RFC 3339, as a --dry-run prints it): with --limit, exactly what the dry run counted", func(s string) (err error) {
		f.ParkedBefore, err = time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return fmt.Errorf("want an RFC 3339 time such as 2026-12-07T10:00:00Z")
		}
		return nil
	})
	return f
}

func checkFilter(f *parking.Filter) error {
	if f.Limit < 0 {
		return usageError{fmt.Sprintf("--limit %d: want 0 (all) or more", f.Limit)}
	}
	if f.OlderThan < 0 {
		return usageError{fmt.Sprintf("--older-than %s: want a duration of 0 or more", f.OlderThan)}
	}
	if f.Group != "" && !group.Valid(f.Group) {
		return usageError{fmt.Sprintf("--group %q: want a group id, 12 hex digits as `rebound parked groups` lists them", f.Group)}
	}
	if f.Reason != "" && !slices.Contains(parkedReasons(), f.Reason) {
		return usageError{fmt.Sprintf("--reason %q: want one of %s", f.Reason, strings.Join(parkedReasons(), ", "))}
	}
	return nil
}

// days is a duration flag that also takes days, the natural unit for
// how long a message has been parked: "2d", "2d12h", "1.5d", or any
// duration Go's time.ParseDuration reads.
type days time.Duration

func (d *days) String() string { return policy.FormatDuration(time.Duration(*d)) }

func (d *days) Set(s string) error {
	v, err := parseDays(s)
	if err != nil {
		return err
	}
	*d = days(v)
	return nil
}

// parseDays reads an optional leading number of days ("2d", "1.5d")
// followed by an optional Go duration ("12h30m").
func parseDays(s string) (time.Duration, error) {
	bad := errors.New("want a duration in Go's units or with d for days (90m, 36h, 2d, 2d12h)")
	sign, rest := time.Duration(1), s
	if r, ok := strings.CutPrefix(rest, "-"); ok {
		sign, rest = -1, r
	}
	var total time.Duration
	if i := strings.IndexByte(rest, 'd'); i >= 0 {
		n, err := strconv.ParseFloat(rest[:i], 64)
		if err != nil || n < 0 || n > 100_000 || strings.ContainsAny(rest[:i], "eE+-") {
			return 0, bad
		}
		total, rest = time.Duration(n*float64(24*time.Hour)), rest[i+1:]
		if rest == "" {
			return sign * total, nil
		}
	}
	v, err := time.ParseDuration(rest)
	if err != nil || v < 0 {
		return 0, bad
	}
	return sign * (total + v), nil
}

// openParking loads the configuration and connects to the broker. The
// caller closes the connection.
func openParking(ctx context.Context, in invocation, role string) (parking.Queue, *amqp.Connection, error) {
	cfg, conn, err := loadAndConnect(ctx, in, role)
	if err != nil {
		return parking.Queue{}, nil, err
	}
	q := parking.Queue{Conn: conn, Router: cfg.Router(), ConfirmTimeout: cfg.ConfirmTimeout}
	return q, conn, nil
}

// parkedJSON is one message in `parked list --format json`. Its field
// names are public interface.
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
	// FirstDeathReason and FirstDeathQueue: why and where the task was
	// first dead-lettered (rejected, expired, maxlen, delivery_limit).
	FirstDeathReason string `json:"first_death_reason,omitempty"`
	FirstDeathQueue  string `json:"first_death_queue,omitempty"`
	// Policy is "<name>:<fingerprint>" of the policy that parked it;
	// absent when unknown (an earlier rebound's, or the broker's).
	Policy string `json:"policy,omitempty"`
	// Group is the failure group (rebound parked groups).
	Group string `json:"group"`
	// ErrorRetry is the retry count the error was reported at (-1:
	// before a replay); absent when the message does not say.
	ErrorRetry *int `json:"error_retry,omitempty"`
	// RedirectedFrom is the origin of a message `parked replay --to` sent
	// elsewhere.
	RedirectedFrom string `json:"redirected_from,omitempty"`
}

// listJSON is the whole `parked list --format json` document. ByReason
// and ByOrigin count the matching messages read; "-" stands for an
// unknown reason or origin. Limited says the reading stopped at --limit,
// Unread how many parked messages it left unread.
type listJSON struct {
	Scanned  int            `json:"scanned"`
	Matched  int            `json:"matched"`
	Messages []parkedJSON   `json:"messages"`
	ByReason map[string]int `json:"by_reason"`
	ByOrigin map[string]int `json:"by_origin"`
	Limited  bool           `json:"limited"`
	Unread   int            `json:"unread"`
}

const parkedListUsage = `usage: rebound parked list [flags]

Lists parked messages without removing them, then a summary of the
matching messages by reason and by origin. Messages are read with manual
acks and requeued, so the parking queue keeps them all (its order may
change). With --limit it stops reading at that many matches, and says so:
the summary then covers what it read.`

func runParkedList(ctx context.Context, args []string, in invocation) error {
	opt, done, err := parseReadFlags(flag.NewFlagSet("parked list", flag.ContinueOnError), args, parkedListUsage, "", in)
	if done || err != nil {
		return err
	}
	if opt.by != "" {
		return parkedGroups(ctx, in, opt.filter, opt.by, opt.format)
	}
	q, conn, err := openParking(ctx, in, "parked list")
	if err != nil {
		return err
	}
	defer conn.Close()
	now := time.Now()
	l, err := q.List(ctx, opt.filter, now)
	if err != nil {
		return fmt.Errorf("list %s: %w", q.Name(), err)
	}
	doc := listJSON{Scanned: l.Scanned, Matched: l.Matched, Messages: []parkedJSON{}, ByReason: dashed(l.ByReason), ByOrigin: dashed(l.ByOrigin),
		Limited: l.Limited, Unread: l.Unread}
	for _, m := range l.Messages {
		j := parkedJSON{
			ID: m.ID(), Origin: m.Origin, Reason: m.Reason, RetryCount: m.Retries,
			TaskStartedAt: m.StartedAt, TaskAgeMs: now.Sub(m.StartedAt).Milliseconds(),
			Error: m.Error, BodyBytes: len(m.Delivery.Body),
			FirstDeathReason: m.FirstDeathReason, FirstDeathQueue: m.FirstDeathQueue, Policy: m.Policy,
			Group: m.Group, RedirectedFrom: m.RedirectedFrom,
		}
		if !m.ParkedAt.IsZero() {
			j.ParkedAt = &m.ParkedAt
		}
		if m.ErrorStamped {
			j.ErrorRetry = &m.ErrorRetry
		}
		doc.Messages = append(doc.Messages, j)
	}
	if opt.format == "json" {
		enc := json.NewEncoder(in.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}
	tw := tabwriter.NewWriter(in.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tORIGIN\tREASON\tGROUP\tPOLICY\tFIRST DEATH\tRETRIES\tPARKED AT\tTASK AGE\tERROR\tBYTES")
	for _, j := range doc.Messages {
		parkedAt := "-"
		if j.ParkedAt != nil {
			parkedAt = j.ParkedAt.UTC().Format(time.RFC3339)
		}
		age := (time.Duration(j.TaskAgeMs) * time.Millisecond).Round(time.Second)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\n", orDash(j.ID), orDash(j.Origin), orDash(j.Reason), j.Group, orDash(j.Policy),
			firstDeath(j.FirstDeathReason, j.FirstDeathQueue), j.RetryCount, parkedAt, age, orDash(oneLine(j.Error, 60)), j.BodyBytes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(in.stdout, "%d shown, %d matching, %d parked read; matching by reason: %s; by origin: %s\n",
		len(doc.Messages), doc.Matched, doc.Scanned, counts(doc.ByReason), counts(doc.ByOrigin))
	if doc.Limited {
		fmt.Fprintf(in.stdout, "stopped reading at --limit %d: %d parked messages not read, and not counted above\n", opt.filter.Limit, doc.Unread)
	}
	return nil
}

// dashed returns a tally with "" keys shown as "-".
func dashed(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[orDash(k)] += v
	}
	return out
}

const parkedShowUsage = `usage: rebound parked show ID
       rebound parked show --group ID [--limit n]

Prints every parked message whose message id is ID, or every message of
the failure group ID (at most --limit), without removing it: properties,
headers and body.`

func runParkedShow(ctx context.Context, args []string, in invocation) error {
	fs := flag.NewFlagSet("parked show", flag.ContinueOnError)
	groupID := fs.String("group", "", "show the messages of this failure `group` instead of one id")
	limit := fs.Int("limit", 0, "with --group, show at most `n` messages (0 = all)")
	// The id may come before the flags: `show ID` is how people type it.
	var id string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
	}
	if done, err := parseFlags(fs, args, parkedShowUsage, 1, in); done || err != nil {
		return err
	}
	if id == "" && fs.NArg() > 0 {
		id = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q (see -h)", fs.Arg(0))}
	}
	f := parking.Filter{ID: id, Group: *groupID, Limit: *limit}
	switch {
	case id == "" && f.Group == "":
		return usageError{"missing message ID or --group (see -h)"}
	case id != "" && f.Group != "":
		return usageError{"a message ID or --group, not both (see -h)"}
	case f.Group == "" && f.Limit != 0:
		return usageError{"--limit goes with --group (see -h)"}
	}
	if err := checkFilter(&f); err != nil {
		return err
	}
	q, conn, err := openParking(ctx, in, "parked show")
	if err != nil {
		return err
	}
	defer conn.Close()
	l, err := q.List(ctx, f, time.Now())
	if err != nil {
		return fmt.Errorf("read %s: %w", q.Name(), err)
	}
	if len(l.Messages) == 0 && f.Group != "" {
		return fmt.Errorf("no parked message of group %s in %s (%d read)", f.Group, q.Name(), l.Scanned)
	}
	if len(l.Messages) == 0 {
		return fmt.Errorf("no parked message with id %q in %s (%d read)", id, q.Name(), l.Scanned)
	}
	for i, m := range l.Messages {
		if i > 0 {
			fmt.Fprintln(in.stdout)
		}
		printMessage(in.stdout, m)
	}
	switch {
	case f.Group != "":
		fmt.Fprintf(in.stdout, "\n%d parked messages of group %s shown (%d read)\n", len(l.Messages), f.Group, l.Scanned)
	case len(l.Messages) > 1:
		fmt.Fprintf(in.stdout, "\n%d parked messages have id %q\n", len(l.Messages), id)
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
	prop("policy", orDash(m.Policy), true)
	prop("group", m.Group, true)
	prop("error", oneLine(m.Error, 200), m.Error != "")
	prop("error reported at", errorReportedAt(m), m.Error != "")
	prop("redirected from", m.RedirectedFrom, m.RedirectedFrom != "")
	if !m.ParkedAt.IsZero() {
		prop("parked at", m.ParkedAt.UTC().Format(time.RFC3339Nano), true)
	}
	prop("first death", firstDeath(m.FirstDeathReason, m.FirstDeathQueue), true)
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
		fmt.Fprintf(tw, "  %s:\t%s\n", k, headers.Show(d.Headers[k]))
	}
	_ = tw.Flush()
	if headers.Printable(d.Body) {
		fmt.Fprintf(w, "body (%d bytes, text):\n%s\n", len(d.Body), d.Body)
		return
	}
	fmt.Fprintf(w, "body (%d bytes, binary, base64):\n%s\n", len(d.Body), base64.StdEncoding.EncodeToString(d.Body))
	preview := d.Body[:min(len(d.Body), 64)]
	fmt.Fprintf(w, "first %d bytes:\n%s", len(preview), hex.Dump(preview))
}

const parkedReplayUsage = `usage: rebound parked replay [flags]

Sends matching parked messages back to their origin queue, or with --to to
another queue (which x-retry-redirected-from then records) (default exchange,
routing key = origin) with their retry state reset: no retry count, a fresh
task start, no park headers. A parked message is removed only once the
broker has confirmed its copy; messages with an unknown or missing origin
stay parked and are reported (exit status 1). Interrupted, it loses
nothing: at worst a message is both replayed and still parked.

--dry-run counts what would be replayed and prints the --parked-before
and --limit that make the replay move exactly those, and none parked
since.

--rate N holds the replay to N messages a second. --canary K replays K
matching messages first, then watches the parking queue for
--canary-wait: if one of them comes back parked, it stops there and says
so (exit status 1); otherwise it replays the rest (those parked before the
canaries went out). A canary fails only once its policy parks it again,
so --canary-wait defaults to the time the longest policy that can decide
the canaries (given --origin) takes to park a message that fails every
time, plus a minute.

Messages parked non-retryable (their consumer said a retry cannot help)
are left parked unless --include-non-retryable or --reason non-retryable
asks for them.`

func runParkedReplay(ctx context.Context, args []string, in invocation) error {
	fs := flag.NewFlagSet("parked replay", flag.ContinueOnError)
	f := filterFlags(fs)
	dryRun := fs.Bool("dry-run", false, "report what would be replayed, change nothing")
	rate := fs.Float64("rate", 0, "replay at most `n` messages a second (0 = as fast as the broker confirms)")
	canary := fs.Int("canary", 0, "replay `k` messages first, and the rest only if none of them comes back parked within --canary-wait")
	canaryWait := fs.Duration("canary-wait", 0, "how long to watch the canaries (`duration`; default: the time the longest policy that can decide them takes to park a message, plus a minute)")
	includeNonRetryable := fs.Bool("include-non-retryable", false, "replay messages parked non-retryable too (their consumer said retrying cannot help)")
	to := fs.String("to", "", "send the messages to this `queue` instead of their origin (it must pass REBOUND_ORIGIN_QUEUES and exist; x-retry-redirected-from records the origin)")
	if done, err := parseFlags(fs, args, parkedReplayUsage, 0, in); done || err != nil {
		return err
	}
	skipNonRetryable(f, *includeNonRetryable)
	if err := checkFilter(f); err != nil {
		return err
	}
	switch {
	case *rate < 0:
		return usageError{fmt.Sprintf("--rate %g: want messages a second, 0 (no limit) or more", *rate)}
	case *canary < 0:
		return usageError{fmt.Sprintf("--canary %d: want 0 (none) or more messages", *canary)}
	case *canary > 0 && *canaryWait < 0:
		return usageError{fmt.Sprintf("--canary-wait %s: want a duration above 0", *canaryWait)}
	case *canary > 0 && *dryRun:
		return usageError{"--canary with --dry-run: a dry run sends no canary to watch"}
	}
	q, conn, err := openParking(ctx, in, "parked replay")
	if err != nil {
		return err
	}
	defer conn.Close()
	if *to != "" {
		if err := checkRedirect(q, *to); err != nil {
			return err
		}
	}
	if !*dryRun {
		// Copies go out on a connection of their own: reads on a
		// connection the broker throttles for its publishing crawl.
		if _, q.PubConn, err = loadAndConnect(ctx, in, "parked replay publish"); err != nil {
			return err
		}
		defer q.PubConn.Close()
	}
	if !*dryRun {
		var flush func()
		if q.Tracer, flush, err = commandTracer(ctx, in); err != nil {
			return err
		}
		defer flush()
	}
	opt := parking.ReplayOptions{DryRun: *dryRun, Rate: *rate, To: *to}
	if *canary > 0 {
		if *canaryWait == 0 {
			*canaryWait = defaultCanaryWait(in, q, f)
		}
		return replayCanary(ctx, in, q, *f, *canary, *canaryWait, opt)
	}
	now := time.Now()
	res, err := q.ReplayWith(ctx, *f, now, opt)
	if *dryRun && err == nil {
		printBound(in.stdout, "to replay exactly these", "", f.Bound(now), res.Replayed)
	}
	return reportReplay(in, q, res, err, *dryRun)
}

// printBound prints, after a dry run that counted n messages as of bound,
// the flags (after flags, such as --yes) that make the real run act on
// exactly those: the messages parked since are left alone.
func printBound(w io.Writer, what, flags string, bound time.Time, n int) {
	if n > 0 {
		fmt.Fprintf(w, "%s, and none parked since: add %s--parked-before %s --limit %d\n", what, flags, bound.UTC().Format(time.RFC3339Nano), n)
	}
}

// replayCanary runs `parked replay --canary`.
func replayCanary(ctx context.Context, in invocation, q parking.Queue, f parking.Filter, k int, wait time.Duration, opt parking.ReplayOptions) error {
	announce := func(c parking.ReplayResult) {
		fmt.Fprintf(in.stdout, "canary: replayed %d of %d matching messages (%d parked read); watching %s for %s\n",
			c.Replayed, c.Matched, c.Scanned, q.Name(), wait)
	}
	res, err := q.ReplayCanary(ctx, f, k, wait, time.Second, time.Now, opt, announce)
	reportKept(in.stdout, res.Canaries.Kept)
	if len(res.Back) > 0 {
		fmt.Fprintf(in.stdout, "canary: %d of %d came back parked within %s; the rest stay parked\n",
			len(res.Back), res.Canaries.Replayed, res.Watched.Round(time.Second))
		for _, m := range res.Back {
			fmt.Fprintf(in.stdout, "  id %s origin %s reason %s error %s\n", orDash(m.ID()), orDash(m.Origin), orDash(m.Reason), orDash(oneLine(m.Error, 60)))
		}
		return fmt.Errorf("%d canaries came back parked: replay stopped", len(res.Back))
	}
	if err != nil {
		return fmt.Errorf("replay from %s: %w", q.Name(), err)
	}
	fmt.Fprintf(in.stdout, "canary: none came back parked within %s; the rest:\n", res.Watched.Round(time.Second))
	return reportReplay(in, q, res.Rest, nil, false)
}

// reportReplay prints what a replay did and returns its error, if any.
func reportReplay(in invocation, q parking.Queue, res parking.ReplayResult, err error, dryRun bool) error {
	verb := "replayed"
	if dryRun {
		verb = "would replay"
	}
	fmt.Fprintf(in.stdout, "%s %d of %d matching messages (%d parked read); %d stay parked\n",
		verb, res.Replayed, res.Matched, res.Scanned, len(res.Kept))
	if res.Took > 0 && res.Replayed > 1 && !dryRun {
		fmt.Fprintf(in.stdout, "  %.1f messages a second over %s\n", float64(res.Replayed)/res.Took.Seconds(), res.Took.Round(time.Millisecond))
	}
	if res.Unchecked > 0 {
		fmt.Fprintf(in.stdout, "  %d of them to origin queues the broker would not let rebound check (no permission on them): a replay keeps any copy the broker returns\n", res.Unchecked)
	}
	reportKept(in.stdout, res.Kept)
	if err != nil {
		return fmt.Errorf("replay from %s: %w", q.Name(), err)
	}
	if len(res.Kept) > 0 {
		return fmt.Errorf("%d matching messages were not replayed and stay parked", len(res.Kept))
	}
	return nil
}

// reportKept lists the messages a replay left parked, grouped by cause.
func reportKept(w io.Writer, kept []parking.Kept) {
	reportByWhy(w, kept, "stay parked", func(k parking.Kept) (string, string) {
		return k.Why, fmt.Sprintf("id %s origin %s", orDash(k.Message.ID()), orDash(k.Message.Origin))
	})
}

const parkedPurgeUsage = `usage: rebound parked purge --yes | --dry-run [flags]

Deletes matching parked messages for good. --dry-run counts them, changes
nothing, and prints the --parked-before and --limit that make the purge
delete exactly those, and none parked since.`

func runParkedPurge(ctx context.Context, args []string, in invocation) error {
	fs := flag.NewFlagSet("parked purge", flag.ContinueOnError)
	f := filterFlags(fs)
	yes := fs.Bool("yes", false, "really delete the matching messages")
	dryRun := fs.Bool("dry-run", false, "count what would be deleted, change nothing")
	if done, err := parseFlags(fs, args, parkedPurgeUsage, 0, in); done || err != nil {
		return err
	}
	if err := checkFilter(f); err != nil {
		return err
	}
	if *yes && *dryRun {
		return usageError{"--yes with --dry-run: choose one"}
	}
	if !*yes && !*dryRun {
		return usageError{"purge deletes messages for good: add --yes (see what it would delete first with --dry-run)"}
	}
	q, conn, err := openParking(ctx, in, "parked purge")
	if err != nil {
		return err
	}
	defer conn.Close()
	now := time.Now()
	if *dryRun {
		l, err := q.List(ctx, *f, now)
		if err != nil {
			return fmt.Errorf("list %s: %w", q.Name(), err)
		}
		fmt.Fprintf(in.stdout, "would purge %d messages (%d parked read); nothing changed\n", l.Matched, l.Scanned)
		printBound(in.stdout, "to delete exactly these", "--yes ", f.Bound(now), l.Matched)
		return nil
	}
	scanned, removed, err := q.Purge(ctx, *f, now)
	fmt.Fprintf(in.stdout, "purged %d messages (%d parked read)\n", removed, scanned)
	if err != nil {
		return fmt.Errorf("purge %s: %w", q.Name(), err)
	}
	return nil
}

// checkRedirect refuses a --to queue the sidecar would not send a message
// back to (one of rebound's own, or one REBOUND_ORIGIN_QUEUES does not
// allow), or one that does not exist: a usage error, before anything moves.
func checkRedirect(q parking.Queue, to string) error {
	if o := q.Router.CheckOrigin(to, ""); o.Refused != "" {
		return usageError{fmt.Sprintf("--to %q: %s", to, o.Why)}
	}
	// A queue the broker will not let rebound check counts as existing:
	// copies are mandatory, so one the broker returns stays parked.
	found, _, err := declarer.NewOrigins(q.Conn, nil, nil, time.Now).Exists(to)
	if err != nil {
		return fmt.Errorf("check queue %s: %w", to, err)
	}
	if !found {
		return usageError{fmt.Sprintf("--to %q: no such queue", to)}
	}
	return nil
}

// errorReportedAt says when an error was reported: "retry 3 (parked at
// 10: an earlier attempt's)".
func errorReportedAt(m parking.Message) string {
	switch {
	case !m.ErrorStamped:
		return "not recorded (set by the consumer, or before rebound stamped errors)"
	case m.ErrorRetry < 0:
		return "before the message was last replayed"
	case m.ErrorRetry == m.Retries:
		return fmt.Sprintf("retry %d, the failure that parked it", m.ErrorRetry)
	}
	return fmt.Sprintf("retry %d (parked at %d: an earlier attempt's; the group is its origin's and reason's)", m.ErrorRetry, m.Retries)
}

// firstDeath shows why and where a task was first dead-lettered:
// "expired in orders".
func firstDeath(reason, queue string) string {
	switch {
	case reason == "" && queue == "":
		return "-"
	case queue == "":
		return reason
	}
	return orDash(reason) + " in " + queue
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
