package parking

import (
	"context"
	"errors"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/policy"
	"github.com/rebound-mq/rebound/republisher"
)

// Tests of List, Purge and Replay against the broker under test, on a
// parking queue declared as rebound declares it and seeded as the sidecar
// parks messages.

// seedFive parks five messages: three from the application queue, one
// from other, one with no origin; two of them parked three hours ago.
func (e *env) seedFive(now time.Time, other string) {
	e.t.Helper()
	e.seed(now,
		parked{id: "a1", origin: e.App, reason: policy.MaxRetries, age: 10 * time.Minute, retries: 10, errText: "timeout"},
		parked{id: "a2", origin: e.App, reason: policy.MaxRetries, age: 3 * time.Hour, retries: 10},
		parked{id: "a3", origin: e.App, reason: "max-duration", age: 10 * time.Minute, retries: 4},
		parked{id: "o1", origin: other, reason: policy.NonRetryable, age: 3 * time.Hour},
		parked{id: "u1", reason: policy.UnknownOrigin, age: 10 * time.Minute},
	)
}

// newFiveEnv is newEnv on queueType with seedFive's messages parked as of
// now, o1 from a queue of its own, other.
func newFiveEnv(t *testing.T, queueType string) (e *env, other string, now time.Time) {
	t.Helper()
	e = newEnv(t, queueType == "quorum")
	other = e.queue("other", nil)
	now = time.Now()
	e.seedFive(now, other)
	return e, other, now
}

func TestList(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e, other, now := newFiveEnv(t, queueType)
		ctx := context.Background()

		for _, tc := range []struct {
			name               string
			f                  Filter
			ids                []string
			byReason, byOrigin map[string]int
		}{
			{"every message", Filter{}, []string{"a1", "a2", "a3", "o1", "u1"},
				map[string]int{"max-retries": 2, "max-duration": 1, "non-retryable": 1, "unknown-origin": 1},
				map[string]int{e.App: 3, other: 1, "": 1}},
			{"reason", Filter{Reason: "max-retries"}, []string{"a1", "a2"},
				map[string]int{"max-retries": 2}, map[string]int{e.App: 2}},
			{"origin", Filter{Origin: other}, []string{"o1"},
				map[string]int{"non-retryable": 1}, map[string]int{other: 1}},
			{"older than", Filter{OlderThan: time.Hour}, []string{"a2", "o1"},
				map[string]int{"max-retries": 1, "non-retryable": 1}, map[string]int{e.App: 1, other: 1}},
			{"id", Filter{ID: "a3"}, []string{"a3"},
				map[string]int{"max-duration": 1}, map[string]int{e.App: 1}},
			{"reason and age", Filter{Reason: "max-retries", OlderThan: time.Hour}, []string{"a2"},
				map[string]int{"max-retries": 1}, map[string]int{e.App: 1}},
			{"no match", Filter{Reason: "no-such-reason"}, []string{}, map[string]int{}, map[string]int{}},
		} {
			e.settled(5)
			l, err := e.q.List(ctx, tc.f, now)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if l.Scanned != 5 || l.Matched != len(tc.ids) || !slices.Equal(ids(l.Messages), tc.ids) {
				t.Errorf("%s: scanned %d, matched %d, listed %v; want 5, %d, %v", tc.name, l.Scanned, l.Matched, ids(l.Messages), len(tc.ids), tc.ids)
			}
			if !maps.Equal(l.ByReason, tc.byReason) || !maps.Equal(l.ByOrigin, tc.byOrigin) {
				t.Errorf("%s: by reason %v, by origin %v; want %v, %v", tc.name, l.ByReason, l.ByOrigin, tc.byReason, tc.byOrigin)
			}
		}

		// A limit stops the reading at that many matches, and the counts
		// cover what was read.
		e.settled(5)
		l, err := e.q.List(ctx, Filter{Origin: e.App, Limit: 2}, now)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Messages) != 2 || l.Scanned != 2 || l.Matched != 2 || l.ByOrigin[e.App] != 2 || !l.Limited || l.Unread != 3 {
			t.Errorf("limit 2: listed %v, read %d, matched %d, by origin %v, limited %v, %d unread; want 2 read and counted, 3 unread",
				ids(l.Messages), l.Scanned, l.Matched, l.ByOrigin, l.Limited, l.Unread)
		}

		// What each message says, as rebound parked it.
		e.settled(5)
		l, err = e.q.List(ctx, Filter{ID: "a1"}, now)
		if err != nil || len(l.Messages) != 1 {
			t.Fatalf("list a1: %v, %v", l.Messages, err)
		}
		m := l.Messages[0]
		parkedAt := time.UnixMilli(now.Add(-10 * time.Minute).UnixMilli())
		if m.Reason != "max-retries" || m.Origin != e.App || m.Retries != 10 || m.Error != "timeout" ||
			!m.ParkedAt.Equal(parkedAt) || !m.StartedAt.Equal(parkedAt.Add(-time.Hour)) ||
			m.FirstDeathReason != "rejected" || m.FirstDeathQueue != e.App ||
			string(m.Delivery.Body) != "body of a1" || m.Delivery.Headers["tenant"] != "acme" {
			t.Errorf("a1 = %+v", m)
		}
	})
}

func TestPurge(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e, _, now := newFiveEnv(t, queueType)
		ctx := context.Background()

		scanned, removed, err := e.q.Purge(ctx, Filter{Reason: "max-retries", Limit: 1}, now)
		if err != nil || removed != 1 || scanned != 1 {
			t.Errorf("purge max-retries, limit 1: scanned %d, removed %d, %v; want the first message only", scanned, removed, err)
		}
		e.wantParked(now, "after purging one max-retries message", "a2", "a3", "o1", "u1")
		e.settled(4)
		scanned, removed, err = e.q.Purge(ctx, Filter{Origin: e.App}, now)
		if err != nil || removed != 2 || scanned != 4 {
			t.Errorf("purge origin app: scanned %d, removed %d, %v; want 4, 2", scanned, removed, err)
		}
		e.settled(2)
		scanned, removed, err = e.q.Purge(ctx, Filter{Reason: "no-such-reason"}, now)
		if err != nil || removed != 0 || scanned != 2 {
			t.Errorf("purge matching nothing: scanned %d, removed %d, %v; want 2, 0", scanned, removed, err)
		}
		e.wantParked(now, "after the purges", "o1", "u1")
	})
}

func TestReplay(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType == "quorum")
		denied := e.queue("denied", nil)
		// Every queue but denied.
		e.q.Router.Topology.OriginQueues = regexp.MustCompile("^(" + regexp.QuoteMeta(e.App) + "|" + regexp.QuoteMeta(e.Prefix+"missing") + ")$")
		now := time.Now()
		e.seed(now,
			parked{id: "r1", origin: e.App, reason: policy.MaxRetries, retries: 10, errText: "boom"},
			parked{id: "r2", origin: e.App, reason: policy.MaxRetries, retries: 10},
			parked{id: "unknown", reason: policy.UnknownOrigin},
			parked{id: "own", origin: e.q.Router.Topology.InboxQueue, reason: policy.UnknownOrigin},
			parked{id: "denied", origin: denied, reason: policy.OriginNotAllowed},
			parked{id: "missing", origin: e.Prefix + "missing", reason: policy.MaxRetries},
		)
		wantKept := map[string]string{
			"unknown": "no origin queue in x-death or the origin headers", "own": "origin is one of rebound's own queues",
			"denied": "origin queue not allowed by REBOUND_ORIGIN_QUEUES", "missing": whyOriginMissing,
		}
		ctx := context.Background()

		res, err := e.q.replay(ctx, Filter{}, now, true)
		if err != nil || res.Scanned != 6 || res.Matched != 6 || res.Replayed != 2 || !maps.Equal(kept(res), wantKept) {
			t.Errorf("dry run: %+v, %v; want 2 of 6 replayable, kept %v", res, err, wantKept)
		}
		e.settled(6)
		if n := e.QueueLen(e.App); n != 0 {
			t.Fatalf("after the dry run the origin holds %d, want 0", n)
		}

		res, err = e.q.replay(ctx, Filter{Reason: "max-retries", Limit: 1}, now, false)
		if err != nil || res.Matched != 1 || res.Replayed != 1 || len(res.Kept) != 0 {
			t.Errorf("replay max-retries, limit 1: %+v, %v; want one replayed", res, err)
		}
		e.settled(5)
		if n := e.QueueLen(e.App); n != 1 {
			t.Errorf("after replaying one the origin holds %d, want 1", n)
		}

		replayedAt := now.Add(time.Minute)
		res, err = e.q.replay(ctx, Filter{}, replayedAt, false)
		if err != nil || res.Scanned != 5 || res.Matched != 5 || res.Replayed != 1 || !maps.Equal(kept(res), wantKept) {
			t.Errorf("replay: %+v, %v; want 1 replayed of 5, kept %v", res, err, wantKept)
		}
		e.wantParked(now, "after the replay", "denied", "missing", "own", "unknown")
		if n := e.QueueLen(denied); n != 0 {
			t.Errorf("the denied queue got %d messages", n)
		}

		back := e.Drain(e.App)
		if len(back) != 2 {
			t.Fatalf("the origin queue got %d messages, want r1 and r2", len(back))
		}
		n := e.q.Router.Codec.Names
		for _, d := range back {
			at := now
			if d.MessageId == "r2" {
				at = replayedAt
			}
			if string(d.Body) != "body of "+d.MessageId || d.ContentType != "text/plain" || d.DeliveryMode != amqp.Persistent {
				t.Errorf("%s: body %q, content type %q, delivery mode %d; want the parked message's", d.MessageId, d.Body, d.ContentType, d.DeliveryMode)
			}
			h := d.Headers
			if h[n.TaskStartedAt] != at.UnixMilli() || h[n.OriginQueue] != e.App || h["tenant"] != "acme" {
				t.Errorf("%s: task start %v, origin %v, tenant %v; want %d, %s, acme", d.MessageId, h[n.TaskStartedAt], h[n.OriginQueue], h["tenant"], at.UnixMilli(), e.App)
			}
			for _, gone := range []string{n.RetryCount, n.LastDelay, n.ParkedReason, n.ParkedAt, n.FirstDeathReason, n.FirstDeathQueue} {
				if v, ok := h[gone]; ok {
					t.Errorf("%s: %s = %v, want the retry state reset", d.MessageId, gone, v)
				}
			}
			if d.MessageId == "r1" && h[n.Error] != "boom" {
				t.Errorf("r1: %s = %v, want the application's boom kept", n.Error, h[n.Error])
			}
		}
	})
}

// TestReplayKeepsWhatTheBrokerRefuses: the origin queue is full and
// refuses the copy (basic.nack): the parked message stays.
func TestReplayKeepsWhatTheBrokerRefuses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	full := e.queue("full", amqp.Table{"x-max-length": int64(1), "x-overflow": "reject-publish"})
	e.Publish(full, amqp.Publishing{MessageId: "filler"})
	now := time.Now()
	e.seed(now, parked{id: "r1", origin: full, reason: policy.MaxRetries})
	res, err := e.q.replay(context.Background(), Filter{}, now, false)
	if err != nil {
		t.Fatal(err)
	}
	e.wantKeptAlone(now, "the replay into a full queue", res, 0, "r1", republisher.Nacked.Why())
	if n := e.QueueLen(full); n != 1 {
		t.Errorf("the full queue holds %d, want its filler alone", n)
	}
}

// wantKeptAlone checks that a replay sent replayed copies and kept the
// message id parked for why, and that it alone is parked after what.
func (e *env) wantKeptAlone(now time.Time, what string, res ReplayResult, replayed int, id, why string) {
	e.t.Helper()
	if res.Replayed != replayed || !maps.Equal(kept(res), map[string]string{id: why}) {
		e.t.Errorf("%s: %d replayed, kept %v; want %d, %s kept: %s", what, res.Replayed, kept(res), replayed, id, why)
	}
	e.wantParked(now, "after "+what, id)
}

// TestReplayKeepsWhatTheBrokerReturns: the origin queue is deleted while
// a replay runs. The replay saw it exist, and the broker returns the
// copies sent to it afterwards: their parked messages stay.
//
// The queue goes as soon as the first copy reaches it; the last copy to
// it is sent a thousand messages later, in another batch.
func TestReplayKeepsWhatTheBrokerReturns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	gone, others := e.queue("gone", nil), e.queue("others", nil)
	now := time.Now()
	seeds := []parked{{id: "first", origin: gone, reason: policy.MaxRetries}}
	for i := range 1000 {
		seeds = append(seeds, parked{id: "other" + strconv.Itoa(i), origin: others, reason: policy.MaxRetries})
	}
	seeds = append(seeds, parked{id: "last", origin: gone, reason: policy.MaxRetries})
	e.seed(now, seeds...)

	ch, err := e.Broker.Dial(t, e.Broker.URL).Channel()
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(gone, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	deleted := make(chan error, 1)
	go func() {
		d, ok := <-deliveries
		if !ok || d.MessageId != "first" {
			deleted <- errors.New("the first copy did not arrive")
			return
		}
		_, err := ch.QueueDelete(gone, false, false, false)
		deleted <- err
	}()

	res, err := e.q.replay(context.Background(), Filter{}, now, false)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-deleted:
		if err != nil {
			t.Fatalf("delete %s: %v", gone, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first copy never reached its queue")
	}
	e.wantKeptAlone(now, "the replay into a deleted queue", res, 1001, "last", republisher.Returned.Why())
	if n := e.QueueLen(others); n != 1000 {
		t.Errorf("the other origin holds %d, want 1000", n)
	}
}

// TestReplayDryRunWithoutPermissionOnTheOrigin: RabbitMQ 4.2.6 and later
// refuse a passive declaration of a queue the user has no permission on,
// as rebound's user has none on application queues (deploy/rabbitmq).
// A dry run cannot tell whether such an origin exists: it counts the
// message as replayable and says it could not check; 3.10 answers the
// declaration, so there everything is checked.
func TestReplayDryRunWithoutPermissionOnTheOrigin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	now := time.Now()
	e.seed(now,
		parked{id: "unchecked", origin: e.App, reason: policy.MaxRetries},
		parked{id: "missing", origin: e.Prefix + "missing", reason: policy.MaxRetries},
	)
	// Reading the parking queue and publishing to the default exchange:
	// nothing on the application queues.
	_, url := e.Broker.User(t, e.Broker.URL, "pw", "^$", `^amq\.default$`, "^"+regexp.QuoteMeta(e.q.Name())+"$")
	q := e.q
	q.Conn = e.Broker.Dial(t, url)

	res, err := q.replay(context.Background(), Filter{}, now, true)
	if err != nil {
		t.Fatal(err)
	}
	if e.Broker.AtLeast(4, 2) {
		// Neither queue can be checked: both count, unchecked.
		if res.Replayed != 2 || res.Unchecked != 2 || len(res.Kept) != 0 {
			t.Errorf("dry run on RabbitMQ %s: %+v; want 2 replayable, both unchecked", e.Broker.Version(), res)
		}
	} else if res.Replayed != 1 || res.Unchecked != 0 || !maps.Equal(kept(res), map[string]string{"missing": whyOriginMissing}) {
		t.Errorf("dry run on RabbitMQ %s: %+v; want 1 replayable, none unchecked, missing kept", e.Broker.Version(), res)
	}
	e.settled(2)
}

// TestDeliveryLimitParkedByTheBroker: a message rebound could not settle
// within the quorum inbox's delivery limit is moved to the parking queue
// by the broker, with no header of rebound's. It lists with reason
// delivery-limit and the application queue it failed in as origin, and
// replays there.
func TestDeliveryLimitParkedByTheBroker(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	topo := e.q.Router.Topology
	// The inbox as rebound declares it, with a delivery limit of 1 (4.x's
	// default is 20) so the test need not deliver it 21 times.
	inbox := topo.Queues()[0]
	if _, err := e.Ch.QueueDelete(inbox.Name, false, false, false); err != nil {
		t.Fatal(err)
	}
	args := maps.Clone(inbox.Args)
	args["x-delivery-limit"] = int64(1)
	e.queue(inbox.Name[len(e.Prefix):], args)
	if err := e.Ch.QueueBind(inbox.Name, "", topo.DeadLetterExchange, false, nil); err != nil {
		t.Fatal(err)
	}
	orders := e.queue("orders", amqp.Table{"x-dead-letter-exchange": topo.DeadLetterExchange})

	before := time.Now().Add(-time.Second)
	e.Publish(orders, amqp.Publishing{MessageId: "m1", Body: []byte("order")})
	d, ok, err := e.Ch.Get(orders, false)
	if err != nil || !ok {
		t.Fatalf("get from %s: %v, %v", orders, ok, err)
	}
	if err := d.Nack(false, false); err != nil { // the application rejects it
		t.Fatal(err)
	}
	// rebound takes it and dies before settling it, twice.
	for deadline := time.Now().Add(15 * time.Second); e.QueueLen(e.q.Name()) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the broker did not move the message to the parking queue")
		}
		ch, err := e.q.Conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := ch.Get(inbox.Name, false); err != nil {
			t.Fatal(err)
		}
		ch.Close()
	}

	now := time.Now()
	l, err := e.q.List(context.Background(), Filter{Reason: string(policy.DeliveryLimit)}, now)
	if err != nil || len(l.Messages) != 1 {
		t.Fatalf("list delivery-limit: %v, %v; want the message", l.Messages, err)
	}
	m := l.Messages[0]
	if m.ID() != "m1" || m.Origin != orders || m.ParkedAt.Before(before) || m.ParkedAt.After(now) ||
		m.FirstDeathReason != "rejected" || m.FirstDeathQueue != orders {
		t.Errorf("decoded %+v; want m1 from %s, parked between %v and %v, first rejected there", m, orders, before, now)
	}
	e.settled(1)
	res, err := e.q.replay(context.Background(), Filter{ID: "m1"}, now, false)
	if err != nil || res.Replayed != 1 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	back := e.Drain(orders)
	if len(back) != 1 || back[0].MessageId != "m1" || back[0].Headers[e.q.Router.Codec.Names.OriginQueue] != orders {
		t.Errorf("the application queue got %v, want m1 with its origin header", back)
	}
}

// TestErrNoQueue: every operation on a parking queue that does not exist
// says so, and the connection stays usable.
func TestErrNoQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	missing := e.q
	missing.Router.Topology.ParkingQueue = e.Prefix + "no-such-queue"
	ctx, now := context.Background(), time.Now()
	if _, err := missing.List(ctx, Filter{}, now); !errors.Is(err, republisher.ErrNoQueue) {
		t.Errorf("List: %v, want republisher.ErrNoQueue", err)
	}
	if _, _, err := missing.Purge(ctx, Filter{}, now); !errors.Is(err, republisher.ErrNoQueue) {
		t.Errorf("Purge: %v, want republisher.ErrNoQueue", err)
	}
	for _, dryRun := range []bool{true, false} {
		if _, err := missing.replay(ctx, Filter{}, now, dryRun); !errors.Is(err, republisher.ErrNoQueue) {
			t.Errorf("Replay (dry run %v): %v, want republisher.ErrNoQueue", dryRun, err)
		}
	}
	if _, err := e.q.List(ctx, Filter{}, now); err != nil {
		t.Errorf("List on the real parking queue afterwards: %v", err)
	}
}

// TestCancelledOperationsLeaveTheQueue: an operation whose context is
// done reads nothing, changes nothing and says why.
func TestCancelledOperationsLeaveTheQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	now := time.Now()
	e.seedFive(now, e.App)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if l, err := e.q.List(ctx, Filter{}, now); !errors.Is(err, context.Canceled) || l.Scanned != 0 {
		t.Errorf("List: scanned %d, %v; want 0, context.Canceled", l.Scanned, err)
	}
	if _, removed, err := e.q.Purge(ctx, Filter{}, now); !errors.Is(err, context.Canceled) || removed != 0 {
		t.Errorf("Purge: removed %d, %v; want 0, context.Canceled", removed, err)
	}
	if res, err := e.q.replay(ctx, Filter{}, now, false); !errors.Is(err, context.Canceled) || res.Replayed != 0 {
		t.Errorf("Replay: %+v, %v; want nothing replayed, context.Canceled", res, err)
	}
	e.settled(5)
	if n := e.QueueLen(e.App); n != 0 {
		t.Errorf("the origin holds %d, want 0", n)
	}
}

// TestOperationRightAfterAnotherReadsEveryMessage: the messages one
// operation leaves parked are back in the queue when it returns (a
// basic.get has them at once), and the next operation must read them all.
//
// On quorum parking queues, on RabbitMQ 3.10 and 4.3, for a few
// milliseconds after the returns, queue.declare-ok reports fewer messages
// than the queue holds (0 here). Operations bounded their run by that
// count, and a List, Purge or Replay run right after another one, or a
// command started just after one was interrupted, silently acted on fewer
// messages, or none; they now take the count from the first basic.get.
func TestOperationRightAfterAnotherReadsEveryMessage(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType == "quorum")
		now := time.Now()
		e.seedFive(now, e.App)
		e.settled(5)
		for i := range 10 {
			l, err := e.q.List(context.Background(), Filter{}, now)
			if err != nil || l.Scanned != 5 {
				t.Errorf("list %d of 10 in a row: scanned %d, %v; want all 5 parked messages", i+1, l.Scanned, err)
			}
		}
	})
}
