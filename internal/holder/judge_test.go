package holder

import (
	"encoding/json"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
)

func testRules() Rules {
	topo := topology.Topology{InboxQueue: "rebound.inbox", DeadLetterExchange: "rebound.dlx", DelayExchange: "rebound.delay",
		DelayQueuePrefix: "rebound.delay.", ParkingQueue: "rebound.parked", Hold: true, OriginQueues: regexp.MustCompile(`^orders\.`)}
	p := policy.Policy{Backoff: policy.Constant, MinDelay: time.Second, MaxDelay: time.Hour, Jitter: policy.NoJitter, MaxRetries: 5, Deadline: "clamp"}
	return Rules{Topology: topo, Policies: policy.NewSet(p), Codec: headers.NewCodec(headers.DefaultNames()), Slice: 5 * time.Minute}
}

// TestJudge: a copy due is released, one not yet due is held until the
// sooner of its due time and a slice from now, a due time past the max
// delay is clamped, an unreadable one is due now, and a copy that would
// go where rebound may not send it is parked.
func TestJudge(t *testing.T) {
	r := testRules()
	now := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
	ms := func(d time.Duration) int64 { return now.Add(d).UnixMilli() }
	at := func(d time.Duration) time.Time { return time.UnixMilli(ms(d)) }
	copyTo := func(origin string, due any) heldCopy {
		c := heldCopy{Annotations: map[any]any{routingKeyAnnotation: origin}}
		if due != nil {
			c.Annotations["x-retry-due-at"] = due
		}
		return c
	}
	for _, tc := range []struct {
		name    string
		c       heldCopy
		want    verdict
		problem bool
	}{
		{"due in the past", copyTo("orders.created", ms(-time.Second)), verdict{Action: release, Origin: "orders.created", Due: at(-time.Second)}, false},
		{"due now", copyTo("orders.created", ms(0)), verdict{Action: release, Origin: "orders.created", Due: at(0)}, false},
		{"due within the slice", copyTo("orders.created", ms(time.Minute)), verdict{Action: hold, Origin: "orders.created", Due: at(time.Minute), Until: at(time.Minute)}, false},
		{"due past the slice", copyTo("orders.created", ms(20*time.Minute)), verdict{Action: hold, Origin: "orders.created", Due: at(20 * time.Minute), Until: at(5 * time.Minute)}, false},
		{"due past the max delay", copyTo("orders.created", ms(10*time.Hour)), verdict{Action: hold, Origin: "orders.created", Due: at(time.Hour), Until: at(5 * time.Minute)}, true},
		{"due as RFC 3339", copyTo("orders.created", now.Add(time.Minute).Format(time.RFC3339Nano)), verdict{Action: hold, Origin: "orders.created", Due: at(time.Minute), Until: at(time.Minute)}, false},
		{"due as an application property", heldCopy{Annotations: map[any]any{routingKeyAnnotation: "orders.created"}, Properties: map[string]any{"x-retry-due-at": ms(time.Minute)}},
			verdict{Action: hold, Origin: "orders.created", Due: at(time.Minute), Until: at(time.Minute)}, false},
		{"due unreadable", copyTo("orders.created", "tomorrow"), verdict{Action: release, Origin: "orders.created"}, true},
		{"no due time", copyTo("orders.created", nil), verdict{Action: release, Origin: "orders.created"}, true},
		{"no routing key", heldCopy{Annotations: map[any]any{"x-retry-due-at": ms(time.Minute)}}, verdict{Action: park, Reason: policy.UnknownOrigin}, true},
		{"routing key not a string", heldCopy{Annotations: map[any]any{routingKeyAnnotation: int64(7)}}, verdict{Action: park, Reason: policy.UnknownOrigin}, true},
		{"origin not allowed", copyTo("payments.capture", ms(0)), verdict{Action: park, Origin: "payments.capture", Reason: policy.OriginNotAllowed}, true},
		{"origin is the inbox", copyTo("rebound.inbox", ms(0)), verdict{Action: park, Origin: "rebound.inbox", Reason: policy.UnknownOrigin}, true},
		{"origin is the hold queue", copyTo("rebound.delay.hold", ms(0)), verdict{Action: park, Origin: "rebound.delay.hold", Reason: policy.UnknownOrigin}, true},
		{"origin is the parking queue", copyTo("rebound.parked", ms(0)), verdict{Action: park, Origin: "rebound.parked", Reason: policy.UnknownOrigin}, true},
		{"CC queues", heldCopy{Annotations: map[any]any{routingKeyAnnotation: "orders.created", ccAnnotation: []any{"orders.other"}, "x-retry-due-at": ms(0)}},
			verdict{Action: park, Origin: "orders.created", Reason: policy.OriginNotAllowed}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := r.judge(tc.c, now, nil)
			if (got.Problem != "") != tc.problem {
				t.Errorf("problem %q, want one: %v", got.Problem, tc.problem)
			}
			got.Problem = ""
			if !got.Due.Equal(tc.want.Due) || !got.Until.Equal(tc.want.Until) {
				t.Errorf("due %v until %v, want %v and %v", got.Due, got.Until, tc.want.Due, tc.want.Until)
			}
			got.Due, got.Until, tc.want.Due, tc.want.Until = time.Time{}, time.Time{}, time.Time{}, time.Time{}
			if got != tc.want {
				t.Errorf("judge = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// FuzzJudge: whatever a copy carries, judge never panics, never holds a
// copy past a slice or past its max delay, and never sends one home to a
// queue rebound may not write to.
func FuzzJudge(f *testing.F) {
	r := testRules()
	now := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
	f.Add("orders.created", int64(now.UnixMilli()+1000), "", false)
	f.Add("rebound.inbox", int64(0), "2026-11-27T04:00:00Z", true)
	f.Add("", int64(-5), "99999999999999999999", false)
	f.Fuzz(func(t *testing.T, origin string, dueMs int64, dueText string, cc bool) {
		c := heldCopy{Annotations: map[any]any{routingKeyAnnotation: origin}}
		if dueText != "" {
			c.Annotations["x-retry-due-at"] = dueText
		} else {
			c.Annotations["x-retry-due-at"] = dueMs
		}
		if cc {
			c.Annotations[ccAnnotation] = []any{"x"}
		}
		v := r.judge(c, now, nil)
		switch v.Action {
		case hold:
			if v.Until.After(now.Add(r.Slice)) || !v.Until.After(now) || v.Due.After(now.Add(time.Hour)) {
				t.Errorf("held until %v (due %v) as of %v", v.Until, v.Due, now)
			}
		case release:
			if v.Due.After(now) {
				t.Errorf("released before due %v", v.Due)
			}
		}
		if v.Action != park && (cc || r.Topology.Owns(origin) || !r.Topology.Allows(origin) || origin == "") {
			t.Errorf("copy to %q (cc %v) %s, want parked", origin, cc, v.Action)
		}
	})
}

// TestHeldGauge: the held gauge counts the holds of the last slice.
func TestHeldGauge(t *testing.T) {
	m := &metrics{}
	now := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
	slice := time.Minute
	for i := range 120 {
		m.held(now.Add(time.Duration(i)*time.Second), slice)
	}
	end := now.Add(119 * time.Second)
	if got := m.heldWithin(end, slice); got < 59 || got > 62 {
		t.Errorf("held within the last minute of 120 holds a second apart: %d, want about 60", got)
	}
	if got := m.heldWithin(end.Add(2*slice), slice); got != 0 {
		t.Errorf("held two slices later: %d, want 0", got)
	}
}

// TestJudgeCommands: a flush sends home now, and a cancel parks, a copy
// of a matching origin that entered the hold queue before the command was
// issued, while the command lasts (two slices and a minute); other
// origins, copies that entered after it, and commands past their time
// change nothing.
func TestJudgeCommands(t *testing.T) {
	r := testRules()
	issued := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
	flush := newCommand(opFlush, regexp.MustCompile(`^orders\.created$`), issued)
	cancel := newCommand(opCancel, regexp.MustCompile(`^orders\.`), issued)
	// held is a copy to origin published at entered with a delay of an hour.
	held := func(origin string, entered time.Time) heldCopy {
		return heldCopy{Annotations: map[any]any{routingKeyAnnotation: origin,
			"x-retry-due-at": entered.Add(time.Hour).UnixMilli(), "x-retry-last-delay-ms": time.Hour.Milliseconds()}}
	}
	before, after := issued.Add(-10*time.Minute), issued.Add(time.Second)
	for _, tc := range []struct {
		name   string
		c      heldCopy
		now    time.Time
		cmds   []command
		action action
		reason policy.Reason
	}{
		{"flush", held("orders.created", before), issued.Add(time.Minute), []command{flush}, release, ""},
		{"flush, last moment", held("orders.created", before), issued.Add(2*r.Slice + time.Minute - time.Millisecond), []command{flush}, release, ""},
		{"flush past its time", held("orders.created", before), issued.Add(2*r.Slice + time.Minute), []command{flush}, hold, ""},
		{"flush of another origin", held("orders.paid", before), issued.Add(time.Minute), []command{flush}, hold, ""},
		{"flush, copy entered after it", held("orders.created", after), issued.Add(time.Minute), []command{flush}, hold, ""},
		{"cancel", held("orders.paid", before), issued.Add(time.Minute), []command{flush, cancel}, park, policy.Cancelled},
		{"the first command that applies", held("orders.created", before), issued.Add(time.Minute), []command{cancel, flush}, park, policy.Cancelled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmds := make([]command, len(tc.cmds))
			for i, c := range tc.cmds {
				body, _ := json.Marshal(c)
				if cmds[i], _ = readCommand(body); cmds[i].origins == nil {
					t.Fatalf("command %+v does not read back", c)
				}
			}
			v := r.judge(tc.c, tc.now, cmds)
			if v.Action != tc.action || v.Reason != tc.reason {
				t.Errorf("judge = %s %q, want %s %q", v.Action, v.Reason, tc.action, tc.reason)
			}
		})
	}
	for _, body := range []string{`{"op":"purge","origin":"."}`, `{"op":"flush","origin":"("}`, `not json`} {
		if _, err := readCommand([]byte(body)); err == nil {
			t.Errorf("readCommand(%s) read", body)
		}
	}
}

// A queue's AMQP 1.0 address carries its name percent-encoded, so that a
// "/" or "%" in a prefix does not name another address.
func TestQueueAddress(t *testing.T) {
	for queue, want := range map[string]string{
		"rebound.delay.hold": "/queues/rebound.delay.hold",
		"team/a.delay.hold":  "/queues/team%2Fa.delay.hold",
		"50%.hold q":         "/queues/50%25.hold%20q",
	} {
		if got := queueAddress(queue); got != want {
			t.Errorf("queueAddress(%q) = %q, want %q", queue, got, want)
		}
	}
}

// TestCommandsLastTwoSlicesAndAMinute: a holder applies a flush or cancel
// for two slices and a minute after it was issued (every copy held then
// comes back within a slice, a late reader's at its next return), then
// forgets it.
func TestCommandsLastTwoSlicesAndAMinute(t *testing.T) {
	slice := 5 * time.Minute
	issued := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
	var cs commands
	early := newCommand(opFlush, regexp.MustCompile(`^orders$`), issued)
	late := newCommand(opCancel, regexp.MustCompile(`^payments$`), issued.Add(time.Minute))
	cs.add(early)
	cs.add(late)
	if until := early.until(slice); !until.Equal(issued.Add(11 * time.Minute)) {
		t.Errorf("Until = %v, want 11 minutes after it was issued", until)
	}
	for _, step := range []struct {
		at   time.Duration // after issued
		want []string      // the ops still applied
	}{
		{10 * time.Minute, []string{opFlush, opCancel}},
		{11*time.Minute - time.Millisecond, []string{opFlush, opCancel}},
		{11 * time.Minute, []string{opCancel}},
		{12 * time.Minute, nil},
	} {
		var ops []string
		for _, c := range cs.active(issued.Add(step.at), slice) {
			ops = append(ops, c.Op)
		}
		if !slices.Equal(ops, step.want) {
			t.Errorf("%s after the first was issued: %v active, want %v", step.at, ops, step.want)
		}
	}
}
