package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/cli"
)

// Tests of `rebound parked` against a real RabbitMQ. Parked messages are
// seeded straight into the parking queue with the headers rebound's Park
// writes, so no sidecar has to run.

// parkedSeed is one message to put in the parking queue.
type parkedSeed struct {
	id       string
	origin   string // "" = no origin header
	reason   string
	parkedAt time.Time // zero = now
	retries  int64
	errText  string
	body     []byte
}

// seedParked publishes the messages to the env's parking queue, declaring
// it as rebound does, and waits for the broker's confirms.
func (e *testEnv) seedParked(seeds ...parkedSeed) {
	e.t.Helper()
	ch, err := e.Conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	defer ch.Close()
	queue := e.Vars["REBOUND_PARKING_QUEUE"]
	// Declared as a classic queue unless rebound (or the test) declared it.
	if !e.queueExists(queue) {
		if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{}); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := ch.Confirm(false); err != nil {
		e.t.Fatal(err)
	}
	msgs := make([]amqp.Publishing, 0, len(seeds))
	for _, s := range seeds {
		at := s.parkedAt
		if at.IsZero() {
			at = time.Now()
		}
		h := amqp.Table{
			"x-retry-count":         s.retries,
			"x-task-started-at":     at.Add(-time.Hour).UnixMilli(),
			"x-retry-last-delay-ms": int64(1000),
			"x-retry-parked-reason": s.reason,
			"x-retry-parked-at":     at.UnixMilli(),
			"tenant":                "acme",
		}
		if s.origin != "" {
			h["x-retry-origin-queue"] = s.origin
		}
		if s.errText != "" {
			h["x-retry-error"] = s.errText
		}
		body := s.body
		if body == nil {
			body = []byte("body of " + s.id)
		}
		msgs = append(msgs, amqp.Publishing{
			MessageId: s.id, DeliveryMode: amqp.Persistent, ContentType: "text/plain", Headers: h, Body: body,
		})
	}
	brokertest.PublishConfirmed(e.t, ch, queue, msgs...)
}

// parkedList is what the tests read of `parked list --format json`. The
// names are the command's public output, spelled here again so that a
// renamed field fails a test.
type parkedList struct {
	Scanned  int             `json:"scanned"`
	Matched  int             `json:"matched"`
	Messages []parkedMessage `json:"messages"`
	ByReason map[string]int  `json:"by_reason"`
	ByOrigin map[string]int  `json:"by_origin"`
	Limited  bool            `json:"limited"`
	Unread   int             `json:"unread"`
}

// parkedMessage is one message of parkedList.
type parkedMessage struct {
	ID         string     `json:"id"`
	Origin     string     `json:"origin"`
	Reason     string     `json:"reason"`
	RetryCount int        `json:"retry_count"`
	ParkedAt   *time.Time `json:"parked_at"`
	TaskAgeMs  int64      `json:"task_age_ms"`
	Error      string     `json:"error"`
	BodyBytes  int        `json:"body_bytes"`
}

// parkedGroups is what the tests read of `parked groups --format json`.
type parkedGroups struct {
	By     string `json:"group_by"`
	Groups []struct {
		Key    string `json:"key"`
		Count  int    `json:"count"`
		Origin string `json:"origin"`
		Reason string `json:"reason"`
		Error  string `json:"error"`
	} `json:"groups"`
	Matched int `json:"matched"`
}

func (e *testEnv) listJSON(args ...string) parkedList {
	e.t.Helper()
	out, stderr, err := e.cli(append([]string{"parked", "list", "--format", "json"}, args...)...)
	if err != nil {
		e.t.Fatalf("parked list %v: %v\n%s", args, err, stderr)
	}
	var doc parkedList
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		e.t.Fatalf("parked list output is not JSON: %v\n%s", err, out)
	}
	return doc
}

func TestParkedListLeavesQueueIntact(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	other := e.extraQueue("other")
	old := time.Now().Add(-3 * time.Hour)
	e.seedParked(
		parkedSeed{id: "a1", origin: e.App, reason: "max-retries", retries: 10, errText: "timeout"},
		parkedSeed{id: "a2", origin: e.App, reason: "max-retries", retries: 10, parkedAt: old},
		parkedSeed{id: "a3", origin: e.App, reason: "max-duration", retries: 4},
		parkedSeed{id: "o1", origin: other, reason: "non-retryable", parkedAt: old},
		parkedSeed{id: "u1", reason: "unknown-origin", body: []byte{0, 1, 2, 255}},
	)
	parkedQ := e.Vars["REBOUND_PARKING_QUEUE"]

	all := e.listJSON()
	if all.Scanned != 5 || all.Matched != 5 || len(all.Messages) != 5 {
		t.Fatalf("list: scanned %d matched %d messages %d, want 5 each", all.Scanned, all.Matched, len(all.Messages))
	}
	if n := e.QueueLen(parkedQ); n != 5 {
		t.Fatalf("after list the parking queue holds %d, want 5", n)
	}
	byID := map[string]parkedMessage{}
	for _, m := range all.Messages {
		byID[m.ID] = m
	}
	a1 := byID["a1"]
	if a1.Origin != e.App || a1.Reason != "max-retries" || a1.RetryCount != 10 || a1.Error != "timeout" ||
		a1.BodyBytes != len("body of a1") || a1.ParkedAt == nil || a1.TaskAgeMs < time.Hour.Milliseconds() {
		t.Errorf("a1 = %+v", a1)
	}
	if all.ByReason["max-retries"] != 2 || all.ByOrigin[e.App] != 3 || all.ByOrigin["-"] != 1 {
		t.Errorf("summary by reason %v, by origin %v", all.ByReason, all.ByOrigin)
	}

	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--reason", "max-retries"}, []string{"a1", "a2"}},
		{[]string{"--origin", other}, []string{"o1"}},
		{[]string{"--older-than", "1h"}, []string{"a2", "o1"}},
		{[]string{"--reason", "max-retries", "--older-than", "1h"}, []string{"a2"}},
		{[]string{"--reason", "delivery-limit"}, nil},
	} {
		doc := e.listJSON(tc.args...)
		var got []string
		for _, m := range doc.Messages {
			got = append(got, m.ID)
		}
		if strings.Join(slices.Sorted(slices.Values(got)), ",") != strings.Join(tc.want, ",") || doc.Scanned != 5 {
			t.Errorf("list %v: got %v (scanned %d), want %v", tc.args, got, doc.Scanned, tc.want)
		}
	}
	// A reason rebound never writes is a mistake, not an empty match.
	if _, _, err := e.cli("parked", "list", "--reason", "nothing-like-this"); cli.ExitCode(err, io.Discard) != 2 {
		t.Errorf("--reason nothing-like-this: %v, want a usage error", err)
	}
	// --limit stops the reading: what it counts is what it read.
	if doc := e.listJSON("--origin", e.App, "--limit", "2"); len(doc.Messages) != 2 || doc.Matched != 2 || !doc.Limited || doc.Scanned+doc.Unread != 5 {
		t.Errorf("--limit 2: %d shown, %d matched, %d read, %d unread, limited %v; want 2 shown and matched, limited, the 5 read or unread",
			len(doc.Messages), doc.Matched, doc.Scanned, doc.Unread, doc.Limited)
	}

	table, _, err := e.cli("parked", "list")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ID", "ORIGIN", "REASON", "a1", "timeout", "5 shown, 5 matching", "by reason: max-retries=2"} {
		if !strings.Contains(table, want) {
			t.Errorf("table output lacks %q:\n%s", want, table)
		}
	}

	shown, _, err := e.cli("parked", "show", "a1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"message id:", "a1", `"acme"`, "body (10 bytes, text):\nbody of a1"} {
		if !strings.Contains(shown, want) {
			t.Errorf("show a1 lacks %q:\n%s", want, shown)
		}
	}
	binary, _, err := e.cli("parked", "show", "u1")
	if err != nil || !strings.Contains(binary, "binary, base64):\nAAEC/w==") {
		t.Errorf("show u1 (%v):\n%s", err, binary)
	}
	if _, _, err := e.cli("parked", "show", "no-such-id"); err == nil {
		t.Error("show of a missing id succeeded")
	}
	if n := e.QueueLen(parkedQ); n != 5 {
		t.Fatalf("after list and show the parking queue holds %d, want 5", n)
	}
}

func TestParkedReplayMovesOnlyMatches(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	e.seedParked(
		parkedSeed{id: "r1", origin: e.App, reason: "max-retries", retries: 10, errText: "boom"},
		parkedSeed{id: "r2", origin: e.App, reason: "max-retries", retries: 10},
		parkedSeed{id: "r3", origin: e.App, reason: "max-retries", retries: 10},
		parkedSeed{id: "d1", origin: e.App, reason: "max-duration", retries: 3},
		parkedSeed{id: "d2", origin: e.App, reason: "max-duration", retries: 3},
	)
	dry, _, err := e.cli("parked", "replay", "--reason", "max-retries", "--dry-run")
	if err != nil || !strings.Contains(dry, "would replay 3 of 3") {
		t.Fatalf("dry run (%v): %s", err, dry)
	}
	if n := e.QueueLen(e.App); n != 0 {
		t.Fatalf("dry run put %d messages in the origin queue", n)
	}
	bound := regexp.MustCompile(`to replay exactly these, and none parked since: add --parked-before (\S+) --limit (\d+)`).FindStringSubmatch(dry)
	if bound == nil || bound[2] != "3" {
		t.Fatalf("the dry run prints no bound for exactly what it counted:\n%s", dry)
	}
	// Parked after the dry run: the replay it bounds leaves it parked.
	e.seedParked(parkedSeed{id: "late", origin: e.App, reason: "max-retries", retries: 10})
	e.WaitQueueLen(e.Vars["REBOUND_PARKING_QUEUE"], 6, 10*time.Second)

	before := time.Now().Add(-time.Second)
	out, stderr, err := e.cli("parked", "replay", "--reason", "max-retries", "--parked-before", bound[1], "--limit", bound[2])
	if err != nil {
		t.Fatalf("replay: %v\n%s%s", err, out, stderr)
	}
	if !strings.Contains(out, "replayed 3 of 3 matching messages") || !strings.Contains(out, "0 stay parked") {
		t.Errorf("replay output: %s", out)
	}
	back := e.Drain(e.App)
	if len(back) != 3 {
		t.Fatalf("origin queue got %d messages, want 3", len(back))
	}
	for _, d := range back {
		if !strings.HasPrefix(d.MessageId, "r") || string(d.Body) != "body of "+d.MessageId || d.ContentType != "text/plain" {
			t.Errorf("replayed %q: body %q content type %q", d.MessageId, d.Body, d.ContentType)
		}
		h := d.Headers
		if c, ok := h["x-retry-count"]; ok && c != int64(0) {
			t.Errorf("%s: x-retry-count = %v, want absent or 0", d.MessageId, c)
		}
		started, _ := h["x-task-started-at"].(int64)
		if time.UnixMilli(started).Before(before) {
			t.Errorf("%s: x-task-started-at = %v, want a fresh start", d.MessageId, h["x-task-started-at"])
		}
		for _, gone := range []string{"x-retry-parked-reason", "x-retry-parked-at", "x-retry-last-delay-ms"} {
			if _, ok := h[gone]; ok {
				t.Errorf("%s: %s still set: %v", d.MessageId, gone, h[gone])
			}
		}
		if h["x-retry-origin-queue"] != e.App || h["tenant"] != "acme" {
			t.Errorf("%s: headers not kept: %v", d.MessageId, h)
		}
	}
	left := e.Drain(e.Vars["REBOUND_PARKING_QUEUE"])
	if len(left) != 3 {
		t.Fatalf("parking queue holds %d, want the 2 max-duration messages and the one parked after the dry run", len(left))
	}
	for _, d := range left {
		if d.Headers["x-retry-parked-reason"] != "max-duration" && d.MessageId != "late" {
			t.Errorf("left parked: %s with reason %v", d.MessageId, d.Headers["x-retry-parked-reason"])
		}
	}
}

func TestParkedReplayKeepsUnknownOrigin(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	e.seedParked(
		parkedSeed{id: "good", origin: e.App, reason: "max-retries"},
		parkedSeed{id: "nowhere", reason: "unknown-origin"},
		parkedSeed{id: "gone", origin: e.Prefix + "deleted", reason: "max-retries"},
	)
	out, _, err := e.cli("parked", "replay")
	if err == nil || cli.ExitCode(err, io.Discard) != 1 {
		t.Errorf("replay with unreplayable messages: err %v, want exit status 1", err)
	}
	for _, want := range []string{
		"replayed 1 of 3", "2 stay parked",
		"1 stay parked: no origin queue in x-death or the origin headers", "id nowhere",
		"1 stay parked: origin queue does not exist", "id gone origin " + e.Prefix + "deleted",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("replay output lacks %q:\n%s", want, out)
		}
	}
	if back := e.Drain(e.App); len(back) != 1 || back[0].MessageId != "good" {
		t.Errorf("origin queue got %d messages, want only good", len(back))
	}
	left := map[string]bool{}
	for _, d := range e.Drain(e.Vars["REBOUND_PARKING_QUEUE"]) {
		left[d.MessageId] = true
	}
	if len(left) != 2 || !left["nowhere"] || !left["gone"] {
		t.Errorf("left parked: %v, want nowhere and gone", left)
	}
}

func TestParkedPurgeNeedsYes(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	e.seedParked(
		parkedSeed{id: "p1", origin: e.App, reason: "non-retryable"},
		parkedSeed{id: "p2", origin: e.App, reason: "non-retryable"},
		parkedSeed{id: "k1", origin: e.App, reason: "max-retries"},
	)
	_, _, err := e.cli("parked", "purge", "--reason", "non-retryable")
	if cli.ExitCode(err, io.Discard) != 2 || !strings.Contains(err.Error(), "--yes") {
		t.Fatalf("purge without --yes: %v, want a usage error (exit 2) asking for --yes", err)
	}
	if n := e.QueueLen(e.Vars["REBOUND_PARKING_QUEUE"]); n != 3 {
		t.Fatalf("purge without --yes left %d messages, want 3", n)
	}
	out, _, err := e.cli("parked", "purge", "--reason", "non-retryable", "--dry-run")
	if err != nil || !strings.Contains(out, "would purge 2 messages (3 parked read); nothing changed") {
		t.Fatalf("purge --dry-run (%v): %s", err, out)
	}
	bound := regexp.MustCompile(`add --yes --parked-before (\S+) --limit (\d+)`).FindStringSubmatch(out)
	if bound == nil || bound[2] != "2" {
		t.Fatalf("purge --dry-run prints no bound for exactly what it counted:\n%s", out)
	}
	if n := e.QueueLen(e.Vars["REBOUND_PARKING_QUEUE"]); n != 3 {
		t.Fatalf("purge --dry-run left %d messages, want 3", n)
	}
	// Parked after the dry run: the purge it bounds leaves it.
	e.seedParked(parkedSeed{id: "p3", origin: e.App, reason: "non-retryable"})
	e.WaitQueueLen(e.Vars["REBOUND_PARKING_QUEUE"], 4, 10*time.Second)
	out, _, err = e.cli("parked", "purge", "--reason", "non-retryable", "--yes", "--parked-before", bound[1], "--limit", bound[2])
	// It stops at the limit: p1 and p2 lie before k1 and p3 in the queue.
	if err != nil || !strings.Contains(out, "purged 2 messages (2 parked read)") {
		t.Fatalf("purge --yes (%v): %s", err, out)
	}
	left := map[string]bool{}
	for _, d := range e.Drain(e.Vars["REBOUND_PARKING_QUEUE"]) {
		left[d.MessageId] = true
	}
	if len(left) != 2 || !left["k1"] || !left["p3"] {
		t.Errorf("after purge %v left, want k1 and p3", left)
	}
}

func TestParkedReplayKilledLosesNothing(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	// Paced (--rate), the replay takes at least n/rate = 3s, still
	// running when the test kills it at 600 whatever the broker's speed
	// (the test fails if it was not); unpaced, that took 10 000 messages.
	const n, rate = 3000, 1000
	seeds := make([]parkedSeed, n)
	for i := range seeds {
		seeds[i] = parkedSeed{id: strconv.Itoa(i), origin: e.App, reason: "max-retries", body: make([]byte, 256)}
	}
	e.seedParked(seeds...)

	cmd := exec.Command(binary(t), "parked", "replay", "--rate", strconv.Itoa(rate))
	cmd.Env = append(os.Environ(), e.Environ()...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Kill it once a few batches have reached the origin queue: parked
	// originals of confirmed copies have been acked, later ones are in
	// flight or still unacked.
	deadline := time.Now().Add(30 * time.Second)
	for e.QueueLenOr(e.App, 0) < 600 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-exited:
		t.Fatalf("the replay ended (%v) before the test killed it: the fault was not injected\n%s", err, logs.String())
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited

	seen := map[string]int{}
	origin := 0
	for _, d := range e.Drain(e.App) {
		seen[d.MessageId]++
		origin++
	}
	if origin >= n {
		t.Fatalf("all %d messages were replayed before the kill: the fault was not injected", n)
	}
	// The broker requeues the killed connection's unacked deliveries; give
	// it a moment to notice the connection is gone.
	var parked int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if parked = e.QueueLenOr(e.Vars["REBOUND_PARKING_QUEUE"], 0); parked+origin >= n {
			break
		}
	}
	for _, d := range e.Drain(e.Vars["REBOUND_PARKING_QUEUE"]) {
		seen[d.MessageId]++
	}
	t.Logf("after SIGKILL: %d in the origin queue, %d still parked, %d distinct of %d, %d both", origin, parked, len(seen), n, origin+parked-len(seen))
	for i := range n {
		if seen[strconv.Itoa(i)] == 0 {
			t.Errorf("message %d lost: neither parked nor back in the origin queue", i)
		}
	}
}
