package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/internal/cli"
	"github.com/rebound-mq/rebound/internal/group"
)

// Tests of `rebound parked groups`, `--group`, `replay --to` and
// `parked expire` as an operator runs them, on messages parked by a
// rebound before groups (no group header: the commands compute it).

func TestParkedGroupsCommands(t *testing.T) {
	e := newTestEnv(t, nil)
	repair := e.extraQueue("repair")
	old := time.Now().Add(-48 * time.Hour)
	e.seedParked(
		parkedSeed{id: "t1", origin: e.App, reason: "max-retries", retries: 10, errText: "timeout after 3012 ms on 10.1.2.3", parkedAt: old},
		parkedSeed{id: "t2", origin: e.App, reason: "max-duration", retries: 4, errText: "timeout after 2990 ms on 10.1.2.4"},
		parkedSeed{id: "s1", origin: e.App, reason: "non-retryable", errText: `schema error: field "amount" missing`},
	)
	timeouts := group.Of(e.App, "timeout after 1 ms on 10.0.0.1", "")

	out, stderr, err := e.cli("parked", "groups")
	if err != nil {
		t.Fatalf("parked groups: %v\n%s", err, stderr)
	}
	if !strings.Contains(out, timeouts) || !strings.Contains(out, "max-duration (+1)") || !strings.Contains(out, "2 groups by group, 3 matching, 3 parked read") {
		t.Errorf("parked groups printed:\n%s", out)
	}
	e.WaitQueueLen(e.Vars["REBOUND_PARKING_QUEUE"], 3, 10*time.Second)
	out, stderr, err = e.cli("parked", "list", "--group-by", "error", "--format", "json")
	if err != nil {
		t.Fatalf("parked list --group-by error: %v\n%s", err, stderr)
	}
	var doc parkedGroups
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.By != "error" || len(doc.Groups) != 2 || doc.Groups[0].Key != "timeout after <n> ms on <ip>" || doc.Groups[0].Count != 2 {
		t.Errorf("by error: %s", out)
	}

	// parked list --group-by group is parked groups; show --group shows
	// one group's messages.
	e.WaitQueueLen(e.Vars["REBOUND_PARKING_QUEUE"], 3, 10*time.Second)
	groupsJSON, stderr, err := e.cli("parked", "groups", "--format", "json")
	if err != nil {
		t.Fatalf("parked groups --format json: %v\n%s", err, stderr)
	}
	e.WaitQueueLen(e.Vars["REBOUND_PARKING_QUEUE"], 3, 10*time.Second)
	out, stderr, err = e.cli("parked", "list", "--group-by", "group", "--format", "json")
	if err != nil || out != groupsJSON {
		t.Errorf("parked list --group-by group (%v, %s):\n%s\nwant what parked groups printed:\n%s", err, stderr, out, groupsJSON)
	}
	e.WaitQueueLen(e.Vars["REBOUND_PARKING_QUEUE"], 3, 10*time.Second)
	out, stderr, err = e.cli("parked", "show", "--group", timeouts, "--limit", "1")
	if err != nil || !strings.Contains(out, "1 parked messages of group "+timeouts+" shown") || !strings.Contains(out, "timeout after") {
		t.Errorf("parked show --group %s --limit 1 (%v, %s):\n%s", timeouts, err, stderr, out)
	}

	// --to must be a queue rebound may send to, and exist: refused
	// before anything moves.
	for _, to := range []string{e.Vars["REBOUND_INBOX_QUEUE"], e.Prefix + "no-such-queue"} {
		_, stderr, err := e.cli("parked", "replay", "--group", timeouts, "--to", to)
		if code := cli.ExitCode(err, &strings.Builder{}); code != 2 {
			t.Errorf("replay --to %s: exit %d (%v, %s), want 2", to, code, err, stderr)
		}
	}
	// An existing queue that REBOUND_ORIGIN_QUEUES does not allow.
	e.Vars["REBOUND_ORIGIN_QUEUES"] = "^" + regexp.QuoteMeta(e.App) + "$"
	_, stderr, err = e.cli("parked", "replay", "--group", timeouts, "--to", repair)
	if code := cli.ExitCode(err, &strings.Builder{}); code != 2 || err == nil || !strings.Contains(err.Error(), "not allowed by REBOUND_ORIGIN_QUEUES") {
		t.Errorf("replay --to %s outside REBOUND_ORIGIN_QUEUES: exit %d (%v, %s), want 2 naming the variable", repair, code, err, stderr)
	}
	delete(e.Vars, "REBOUND_ORIGIN_QUEUES")
	e.WaitQueueLen(e.Vars["REBOUND_PARKING_QUEUE"], 3, 10*time.Second)
	out, stderr, err = e.cli("parked", "replay", "--group", timeouts, "--to", repair)
	if err != nil || !strings.Contains(out, "replayed 2 of 2 matching messages") {
		t.Fatalf("replay --to: %v\n%s%s", err, out, stderr)
	}
	for _, d := range e.Drain(repair) {
		if d.Headers["x-retry-redirected-from"] != e.App || d.Headers["x-retry-origin-queue"] != repair {
			t.Errorf("%s: redirected from %v, origin %v", d.MessageId, d.Headers["x-retry-redirected-from"], d.Headers["x-retry-origin-queue"])
		}
	}

	// Expire: refused without a retention; with one, exports then
	// removes what is older.
	e.seedParked(parkedSeed{id: "t3", origin: e.App, reason: "max-retries", errText: "timeout after 7 ms on 10.1.2.3", parkedAt: old})
	e.WaitQueueLen(e.Vars["REBOUND_PARKING_QUEUE"], 2, 10*time.Second)
	if _, _, err := e.cli("parked", "expire", "--yes"); cli.ExitCode(err, &strings.Builder{}) != 2 {
		t.Errorf("expire without a retention: %v, want exit 2", err)
	}
	e.Vars["REBOUND_PARKED_RETENTION"] = "24h"
	export := filepath.Join(t.TempDir(), "parked.jsonl")
	e.WaitQueueLen(e.Vars["REBOUND_PARKING_QUEUE"], 2, 10*time.Second)
	out, stderr, err = e.cli("parked", "expire", "--yes", "--export", export)
	if err != nil || !strings.Contains(out, "expired 1 messages parked more than 24h ago") {
		t.Fatalf("expire: %v\n%s%s", err, out, stderr)
	}
	f, err := os.Open(export)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The export's lines, of which the test reads three fields (public
	// output: the names are the command's).
	type exportLine struct {
		ID    string `json:"id"`
		Group string `json:"group"`
		Body  string `json:"body"`
	}
	var lines []exportLine
	for sc := bufio.NewScanner(f); sc.Scan(); {
		var j exportLine
		if err := json.Unmarshal(sc.Bytes(), &j); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, j)
	}
	if len(lines) != 1 || lines[0].ID != "t3" || lines[0].Group != timeouts || lines[0].Body != "Ym9keSBvZiB0Mw==" {
		t.Errorf("export = %+v", lines)
	}
	e.WaitQueueLen(e.Vars["REBOUND_PARKING_QUEUE"], 1, 10*time.Second)
	if l := e.listJSON(); len(l.Messages) != 1 || l.Messages[0].ID != "s1" {
		t.Errorf("left parked: %+v", l.Messages)
	}

	// purge --group removes that group only.
	e.seedParked(parkedSeed{id: "t4", origin: e.App, reason: "max-retries", errText: "timeout after 9 ms on 10.1.2.5"})
	e.WaitQueueLen(e.Vars["REBOUND_PARKING_QUEUE"], 2, 10*time.Second)
	out, stderr, err = e.cli("parked", "purge", "--group", timeouts, "--yes")
	if err != nil || !strings.Contains(out, "purged 1 messages (2 parked read)") {
		t.Fatalf("purge --group %s: %v\n%s%s", timeouts, err, out, stderr)
	}
	e.WaitQueueLen(e.Vars["REBOUND_PARKING_QUEUE"], 1, 10*time.Second)
	if l := e.listJSON(); len(l.Messages) != 1 || l.Messages[0].ID != "s1" {
		t.Errorf("left parked after purge --group: %+v", l.Messages)
	}
}
