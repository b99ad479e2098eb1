package parking

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/group"
	"github.com/rebound-mq/rebound/policy"
)

// Tests of Groups, and of the operations on one group, against the broker
// under test.

// seedGroups parks eight messages of three failure groups: four timeouts
// of the application queue (one parked by a rebound before groups, one
// for max-duration: one cause is one group), two schema errors, and two
// with no error of their failure (one never reported one, one carries an
// earlier attempt's).
func (e *env) seedGroups(now time.Time) (timeouts, schema, none string) {
	e.t.Helper()
	e.seed(now,
		parked{id: "t1", origin: e.App, reason: policy.MaxRetries, age: 50 * time.Minute, retries: 3, errText: "timeout after 3012 ms on 10.1.2.3"},
		parked{id: "t2", origin: e.App, reason: policy.MaxRetries, age: 40 * time.Minute, retries: 3, errText: "timeout after 2990 ms on 10.1.2.4"},
		parked{id: "t3", origin: e.App, reason: "max-duration", age: 30 * time.Minute, retries: 2, errText: "timeout after 15 ms on 10.1.2.4"},
		parked{id: "t4", origin: e.App, reason: policy.MaxRetries, age: 20 * time.Minute, retries: 3, errText: "timeout after 1 ms on 10.9.9.9", legacy: true},
		parked{id: "s1", origin: e.App, reason: policy.NonRetryable, age: 10 * time.Minute, errText: `schema error: field "amount" missing`},
		parked{id: "s2", origin: e.App, reason: policy.NonRetryable, age: 5 * time.Minute, errText: `schema error: field "currency" missing`},
		parked{id: "n1", origin: e.App, reason: policy.MaxRetries, age: 3 * time.Minute, retries: 3},
		parked{id: "n2", origin: e.App, reason: policy.MaxRetries, age: 2 * time.Minute, retries: 3, errText: "an old cause", errAt: 1, stale: true},
	)
	return group.Of(e.App, "timeout after 1 ms on 10.1.2.3", ""), group.Of(e.App, `schema error: field "x" missing`, ""),
		group.Of(e.App, "", string(policy.MaxRetries))
}

func TestGroups(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType == "quorum")
		now := time.Now()
		timeouts, schema, none := e.seedGroups(now)
		ctx := context.Background()

		e.settled(8)
		l, err := e.q.Groups(ctx, Filter{}, ByGroup, now)
		if err != nil {
			t.Fatal(err)
		}
		if l.Scanned != 8 || l.Matched != 8 || len(l.Groups) != 3 {
			t.Fatalf("groups: read %d, matched %d, %d groups: %+v; want 8, 8, 3", l.Scanned, l.Matched, len(l.Groups), l.Groups)
		}
		type wantGroup struct {
			key         string
			count       int
			reasons     map[string]int
			sample      string
			first, last time.Duration // parked this long before now
		}
		want := []wantGroup{
			{timeouts, 4, map[string]int{"max-retries": 3, "max-duration": 1}, "timeout after 3012 ms on 10.1.2.3", 50 * time.Minute, 20 * time.Minute},
			{none, 2, map[string]int{"max-retries": 2}, "", 3 * time.Minute, 2 * time.Minute},
			{schema, 2, map[string]int{"non-retryable": 2}, `schema error: field "amount" missing`, 10 * time.Minute, 5 * time.Minute},
		}
		// Largest first, then by key.
		slices.SortFunc(want[1:], func(a, b wantGroup) int { return strings.Compare(a.key, b.key) })
		for i, w := range want {
			g := l.Groups[i]
			first, last := time.UnixMilli(now.Add(-w.first).UnixMilli()), time.UnixMilli(now.Add(-w.last).UnixMilli())
			if g.Key != w.key || g.Count != w.count || !maps.Equal(g.Reasons, w.reasons) || g.Error != w.sample ||
				!maps.Equal(g.Origins, map[string]int{e.App: w.count}) || !g.First.Equal(first) || !g.Last.Equal(last) {
				t.Errorf("group %d = %+v; want key %s, %d messages, reasons %v, sample %q, parked %v to %v", i, g, w.key, w.count, w.reasons, w.sample, first, last)
			}
		}

		// Other keys.
		for _, tc := range []struct {
			by   GroupBy
			want map[string]int
		}{
			{byReason, map[string]int{"max-retries": 5, "max-duration": 1, "non-retryable": 2}},
			{byOrigin, map[string]int{e.App: 8}},
			{byError, map[string]int{"timeout after <n> ms on <ip>": 4, "schema error: field <q> missing": 2, "": 2}},
			{byPolicy, map[string]int{e.q.Router.Policies.Default().Label(): 8}},
		} {
			e.settled(8)
			l, err := e.q.Groups(ctx, Filter{}, tc.by, now)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int{}
			for _, g := range l.Groups {
				got[g.Key] = g.Count
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("by %s: %v, want %v", tc.by, got, tc.want)
			}
		}

		// A group's messages, then a purge of one group.
		e.settled(8)
		gl, err := e.q.groupMessages(ctx, timeouts, 0, now)
		if err != nil || !slices.Equal(ids(gl.Messages), []string{"t1", "t2", "t3", "t4"}) {
			t.Errorf("the timeouts' messages: %v, %v", ids(gl.Messages), err)
		}
		e.settled(8)
		if _, removed, err := e.q.Purge(ctx, Filter{Group: schema}, now); err != nil || removed != 2 {
			t.Errorf("purge the schema group: removed %d, %v; want 2", removed, err)
		}
		e.wantParked(now, "after purging the schema group", "n1", "n2", "t1", "t2", "t3", "t4")
	})
}

// TestReplayGroupTo: a group redirected to another queue, which records
// where the messages came from; the rest stay parked.
func TestReplayGroupTo(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType == "quorum")
		repair := e.queue("repair", nil)
		now := time.Now()
		timeouts, _, _ := e.seedGroups(now)
		e.settled(8)
		res, err := e.q.ReplayWith(context.Background(), Filter{Group: timeouts}, now, ReplayOptions{To: repair})
		if err != nil || res.Replayed != 4 || len(res.Kept) != 0 {
			t.Fatalf("replay the timeouts to %s: %+v, %v", repair, res, err)
		}
		e.wantParked(now, "after the redirect", "n1", "n2", "s1", "s2")
		if n := e.QueueLen(e.App); n != 0 {
			t.Errorf("the origin got %d messages", n)
		}
		n := e.q.Router.Codec.Names
		got := e.Drain(repair)
		if len(got) != 4 {
			t.Fatalf("%s got %d messages, want 4", repair, len(got))
		}
		for _, d := range got {
			h := d.Headers
			if h[n.RedirectedFrom] != e.App || h[n.OriginQueue] != repair || h[n.Group] != nil || h[n.RetryCount] != nil || h[n.Error] == nil {
				t.Errorf("%s: redirected from %v, origin %v, group %v, count %v, error %v", d.MessageId, h[n.RedirectedFrom], h[n.OriginQueue],
					h[n.Group], h[n.RetryCount], h[n.Error])
			}
		}

		// Not to one of rebound's own queues.
		e.settled(4)
		res, err = e.q.ReplayWith(context.Background(), Filter{}, now, ReplayOptions{To: e.q.Name()})
		if err != nil || res.Replayed != 0 || len(res.Kept) != 4 {
			t.Errorf("replay to the parking queue: %+v, %v; want every message kept", res, err)
		}
	})
}

// TestReplayGroupInterrupted: a replay of one group cancelled half-way
// loses nothing: every message of the group is in the origin queue or
// still parked, some perhaps in both (counted), and the other groups are
// untouched.
func TestReplayGroupInterrupted(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType == "quorum")
		const n, others = 3000, 50
		now := time.Now()
		c := e.q.Router.Codec
		msgs := make([]amqp.Publishing, 0, n+others)
		for i := range n + others {
			text, id := fmt.Sprintf("timeout after %d ms", i), fmt.Sprintf("g%d", i)
			if i >= n {
				text, id = "schema error", fmt.Sprintf("o%d", i)
			}
			s := headers.State{State: policy.State{Retries: 3, StartedAt: now.Add(-time.Hour)}, Origin: e.App,
				Error: text, ErrorCurrent: true, Group: group.Of(e.App, text, "max-retries")}
			msgs = append(msgs, amqp.Publishing{MessageId: id, Headers: c.Park(amqp.Table{c.Names.Error: text}, s, policy.MaxRetries, now), Body: []byte(id)})
		}
		for chunk := range slices.Chunk(msgs, 500) {
			e.Publish(e.q.Name(), chunk...)
		}
		e.settled(n + others)
		target := group.Of(e.App, "timeout after 1 ms", "")

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var done atomic.Bool
		go func() {
			// Cancel once a good part, not all, of the group is back.
			brokertest.Await(time.Minute, func() bool { return done.Load() || e.QueueLen(e.App) >= n/4 })
			cancel()
		}()
		res, err := e.q.ReplayWith(ctx, Filter{Group: target}, now, ReplayOptions{Rate: 2000})
		done.Store(true)
		if err == nil {
			t.Logf("the replay ended before the cancel: %+v", res)
		}
		e.WaitQueueLen(e.App, res.Replayed, 30*time.Second)

		seen := map[string]int{}
		for _, d := range e.Drain(e.App) {
			seen[d.MessageId]++
		}
		origin := len(seen)
		// Every message not confirmed back is parked still, once the
		// broker has taken back what the replay read (a quorum queue does
		// a moment after the replay returns).
		e.settled(n + others - res.Replayed)
		l, lerr := e.q.List(context.Background(), Filter{}, now)
		if lerr != nil {
			t.Fatal(lerr)
		}
		for _, m := range l.Messages {
			seen[m.ID()]++
		}
		dups := 0
		for i := range n + others {
			id := fmt.Sprintf("g%d", i)
			if i >= n {
				id = fmt.Sprintf("o%d", i)
			}
			switch k := seen[id]; {
			case k == 0:
				t.Errorf("%s lost", id)
			case k > 1:
				dups += k - 1
			}
			if i >= n && seen[id] != 1 {
				t.Errorf("%s of another group moved: seen %d times", id, seen[id])
			}
		}
		if origin == 0 || origin == n {
			t.Errorf("the cancel did not land mid-replay: %d of %d replayed", origin, n)
		}
		t.Logf("%s: cancelled after %d of %d replayed (%d confirmed and removed); %d still parked; %d duplicates", queueType, origin, n,
			res.Replayed, len(l.Messages), dups)
	})
}

// TestExpire: messages parked longer ago than the retention are exported
// (the file holds each, body included) and removed; the rest stay; a dry
// run removes nothing.
func TestExpire(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e, _, now := newFiveEnv(t, queueType) // a2 and o1 parked 3h ago, the rest 10 minutes ago
		ctx := context.Background()

		var dry bytes.Buffer
		res, err := e.q.Expire(ctx, time.Hour, Filter{}, now, NewJSONLines(&dry, nil, time.Now), true)
		if err != nil || res.Matched != 2 || res.Removed != 0 || res.Exported != 2 {
			t.Errorf("dry run: %+v, %v; want 2 matched and exported, none removed", res, err)
		}
		e.settled(5)
		var out bytes.Buffer
		syncs := 0
		res, err = e.q.Expire(ctx, time.Hour, Filter{}, now, NewJSONLines(&out, func() error { syncs++; return nil }, time.Now), false)
		if err != nil || res.Scanned != 5 || res.Matched != 2 || res.Removed != 2 || res.Exported != 2 || syncs != 1 {
			t.Errorf("expire: %+v, %v, %d syncs; want 2 of 5 exported, synced once, removed", res, err, syncs)
		}
		e.wantParked(now, "after the expiry", "a1", "a3", "u1")
		var lines []exportJSON
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var j exportJSON
			if err := json.Unmarshal([]byte(line), &j); err != nil {
				t.Fatalf("export line %q: %v", line, err)
			}
			lines = append(lines, j)
		}
		slices.SortFunc(lines, func(a, b exportJSON) int { return strings.Compare(a.ID, b.ID) })
		if len(lines) != 2 || lines[0].ID != "a2" || lines[1].ID != "o1" || lines[0].Body != "Ym9keSBvZiBhMg==" || lines[0].Headers["tenant"] != "acme" ||
			lines[0].Reason != "max-retries" || lines[0].Group == "" || lines[0].ParkedAt == nil {
			t.Errorf("export = %+v", lines)
		}
		if _, err := e.q.Expire(ctx, 0, Filter{}, now, nil, false); err == nil {
			t.Error("expire with no retention ran")
		}
	})
}

// TestGroupsPastTheUnackedCap reads `rebound parked groups` on 2 500
// parked messages of 5 causes (numbers and addresses varying in each), on
// a classic and a quorum parking queue (which on RabbitMQ 3.x hands one
// consumer at most 2000 unacked messages, so the reading must go past
// that), and checks that each of three readings in a row finds every
// message and the 5 groups; the times are logged (run with -v), not
// asserted. REBOUND_MEASURE_N=10000 measures docs/failure-groups.md's
// 10 000.
func TestGroupsPastTheUnackedCap(t *testing.T) {
	if testing.Short() {
		t.Skip("thousands of messages: not in -short")
	}
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType == "quorum")
		n := brokertest.MeasureCount("REBOUND_MEASURE_N", 2500)
		n -= n % len(brokertest.ErrorCauses) // as many of each cause
		causes := brokertest.ErrorCauses
		now := time.Now()
		c := e.q.Router.Codec
		msgs := make([]amqp.Publishing, 0, n)
		for i := range n {
			text := brokertest.ErrorText(i)
			s := headers.State{State: policy.State{Retries: 10, StartedAt: now.Add(-time.Hour)}, Origin: e.App,
				Error: text, ErrorCurrent: true, Group: group.Of(e.App, text, "max-retries")}
			h := amqp.Table{c.Names.Error: text}
			if i%10 == 0 {
				s.Group = "" // parked before groups: computed by the command
			}
			msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprint(i), Headers: c.Park(h, s, policy.MaxRetries, now), Body: make([]byte, 200)})
		}
		for chunk := range slices.Chunk(msgs, 1000) {
			e.Publish(e.q.Name(), chunk...)
		}
		for run := range 3 {
			e.settled(n)
			start := time.Now()
			l, err := e.q.Groups(context.Background(), Filter{}, ByGroup, time.Now())
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if l.Scanned != n || len(l.Groups) != len(causes) {
				t.Fatalf("read %d, %d groups: %+v; want %d and %d", l.Scanned, len(l.Groups), l.Groups, n, len(causes))
			}
			for _, g := range l.Groups {
				if g.Count != n/len(causes) {
					t.Errorf("group %s: %d messages, want %d", g.Key, g.Count, n/len(causes))
				}
			}
			t.Logf("parked groups on %d messages of %d causes, %s queue, RabbitMQ %s, run %d: %d groups in %s",
				n, len(causes), queueType, brokertest.Require(t).Version(), run+1, len(l.Groups), took.Round(time.Millisecond))
		}
	})
}
