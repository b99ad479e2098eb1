package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/dialer"
	"github.com/rebound-mq/rebound/internal/eventstest"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/policy"
)

// Tests of Sidecar.Run against the broker under test: messages go through
// the whole loop (application queue, dead-letter exchange, inbox, delay
// queue, back), and the sidecar's sessions start, end and drain.

var names = headers.DefaultNames()

// TestRunRetriesThenParks follows one message through the loop: the
// application rejects it, rebound sends it straight back (the immediate
// retry), then back after the 50ms delay, then parks it once the two
// retries are spent.
func TestRunRetriesThenParks(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType)
		e.start(e.options("REBOUND_IMMEDIATE_RETRIES", "1", "REBOUND_MAX_RETRIES", "2"))
		// The gauge follows Ready a moment later (refreshReadyGauge).
		e.eventually("rebound_ready = 1 while consuming", func() bool { return e.metric("rebound_ready") == 1 })
		consuming := e.logged("consuming")
		u, _ := url.Parse(e.b.URL)
		if len(consuming) != 1 || consuming[0].ContextMap()["inbox"] != e.topo.InboxQueue || consuming[0].ContextMap()["broker"] != u.Host {
			t.Errorf("consuming log lines: %v, want one naming inbox %s and broker %s", consuming, e.topo.InboxQueue, u.Host)
		}

		e.Publish(e.app, amqp.Publishing{
			MessageId: "m1", ContentType: "text/plain", Expiration: "600000",
			Headers: amqp.Table{"tenant": "acme"}, Body: []byte("order 1"),
		})
		e.reject(e.app)
		back := e.get(e.app)
		checkCopy(t, "immediate retry", back, map[string]any{names.RetryCount: int64(1), names.LastDelay: int64(0), names.OriginQueue: e.app})

		if err := back.Nack(false, false); err != nil {
			t.Fatal(err)
		}
		rejected := time.Now()
		back = e.get(e.app)
		if waited := time.Since(rejected); waited < 45*time.Millisecond {
			t.Errorf("the delayed retry came back after %s, want the 50ms delay", waited)
		}
		checkCopy(t, "delayed retry", back, map[string]any{names.RetryCount: int64(2), names.LastDelay: int64(50), names.OriginQueue: e.app})
		delayQueue, _ := e.topo.DelayQueue(50 * time.Millisecond)
		if n := e.QueueLen(delayQueue.Name); n != 0 {
			t.Errorf("delay queue %s holds %d, want 0 once the copy went back", delayQueue.Name, n)
		}

		if err := back.Nack(false, false); err != nil {
			t.Fatal(err)
		}
		parked := e.take(e.topo.ParkingQueue)
		checkCopy(t, "parked", parked, map[string]any{
			names.ParkedReason: "max-retries", names.RetryCount: int64(2), names.OriginQueue: e.app,
			names.FirstDeathReason: "rejected", names.FirstDeathQueue: e.app,
		})

		e.eventually("every outcome is counted", func() bool {
			return e.metric("rebound_messages_parked_total", "reason", "max-retries") == 1 && e.metric("rebound_inflight_deliveries") == 0
		})
		for _, c := range []struct {
			name   string
			labels []string
			want   float64
		}{
			// The delayed copy comes back through the inbox once more.
			{"rebound_messages_received_total", nil, 4},
			{"rebound_messages_returned_total", nil, 1},
			{"rebound_messages_retried_total", []string{"kind", "immediate"}, 1},
			{"rebound_messages_retried_total", []string{"kind", "delayed"}, 1},
			{"rebound_retry_delay_seconds", nil, 1},
			{"rebound_confirm_latency_seconds", nil, 4},
			{"rebound_publish_failures_total", []string{"kind", "nack"}, 0},
			{"rebound_redelivered_total", nil, 0},
		} {
			if got := e.metric(c.name, c.labels...); got != c.want {
				t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
			}
		}
	})
}

// checkCopy checks what every copy keeps (body, properties, application
// headers), that it carries no expiration, and the given headers.
func checkCopy(t *testing.T, what string, d amqp.Delivery, want map[string]any) {
	t.Helper()
	if d.MessageId != "m1" || string(d.Body) != "order 1" || d.ContentType != "text/plain" || d.Headers["tenant"] != "acme" {
		t.Errorf("%s: id %q body %q content type %q tenant %v; want the original's", what, d.MessageId, d.Body, d.ContentType, d.Headers["tenant"])
	}
	if d.Expiration != "" {
		t.Errorf("%s: expiration %q, want none", what, d.Expiration)
	}
	for name, v := range want {
		if d.Headers[name] != v {
			t.Errorf("%s: %s = %#v, want %#v", what, name, d.Headers[name], v)
		}
	}
}

// TestRunParksWhatCannotGoBack sends rebound messages it must not send
// back: each is parked with its reason, and nothing reaches a queue.
func TestRunParksWhatCannotGoBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic")
	forbidden := e.prefix + "forbidden"
	e.Declare(forbidden, nil)
	opt := e.options()
	// Every queue but forbidden (RE2 has no negative lookahead: the
	// forbidden one is the only queue of the test named so).
	opt.Router.Topology.OriginQueues = regexp.MustCompile(`(app|missing)$`)
	e.start(opt)

	cases := []struct {
		id      string
		headers amqp.Table
		reason  policy.Reason
		log     string // "" for none
	}{
		{"no-origin", nil, policy.UnknownOrigin, "no origin queue in x-death or the origin headers; parking"},
		{"own-queue", amqp.Table{names.OriginQueue: e.topo.InboxQueue}, policy.UnknownOrigin, "origin is one of rebound's own queues; parking"},
		{"missing", amqp.Table{names.OriginQueue: e.prefix + "missing"}, policy.UnknownOrigin, "origin queue does not exist; parking"},
		{"not-allowed", amqp.Table{names.OriginQueue: forbidden}, policy.OriginNotAllowed, "origin queue not allowed by REBOUND_ORIGIN_QUEUES; parking"},
		{"non-retryable", amqp.Table{names.OriginQueue: e.app, names.NonRetryable: true}, policy.NonRetryable, ""},
	}
	for _, c := range cases {
		e.Publish(e.topo.InboxQueue, amqp.Publishing{MessageId: c.id, Headers: c.headers})
	}
	e.eventually("every message is parked", func() bool { return e.QueueLen(e.topo.ParkingQueue) == len(cases) })
	parked := e.drain(e.topo.ParkingQueue)
	for _, c := range cases {
		if got := parked[c.id].Headers[names.ParkedReason]; got != string(c.reason) {
			t.Errorf("%s: parked reason %v, want %s", c.id, got, c.reason)
		}
		if c.log != "" && len(e.loggedFor(c.log, c.id)) != 1 {
			t.Errorf("%s: no log line %q with its message id", c.id, c.log)
		}
	}
	e.eventually("every parked copy is counted", func() bool {
		return e.metric("rebound_messages_parked_total", "reason", string(policy.UnknownOrigin)) == 3 &&
			e.metric("rebound_messages_parked_total", "reason", string(policy.OriginNotAllowed)) == 1 &&
			e.metric("rebound_messages_parked_total", "reason", string(policy.NonRetryable)) == 1
	})
	for _, q := range []string{forbidden, e.app, e.topo.InboxQueue} {
		if n := e.QueueLen(q); n != 0 {
			t.Errorf("queue %s holds %d messages, want none", q, n)
		}
	}
}

// TestRunPublishesAParkEvent: with REBOUND_EVENTS_EXCHANGE set, a
// subscriber bound to parked.<reason>.# hears of each park once its copy
// is parked: which message, from which origin, why, under which policy
// and failure group, with the consumer's error; never the body. By
// default as a CloudEvent that the published schema accepts; with
// REBOUND_EVENTS_FORMAT=schema1, in the form before it.
func TestRunPublishesAParkEvent(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"cloudevents", "schema1"} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, "classic")
			exchange, subscriber := e.prefix+"events", e.prefix+"subscriber"
			if err := e.Ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			e.Declare(subscriber, nil)
			if err := e.Ch.QueueBind(subscriber, "parked.non-retryable.#", exchange, false, nil); err != nil {
				t.Fatal(err)
			}
			e.start(e.options("REBOUND_EVENTS_EXCHANGE", exchange, "REBOUND_EVENTS_FORMAT", format))

			e.Publish(e.app, amqp.Publishing{MessageId: "m1", Body: []byte("secret body"),
				Headers: amqp.Table{names.NonRetryable: true, names.Error: "card 4242 declined"}})
			e.reject(e.app)
			event := e.take(subscriber)
			parked := e.take(e.topo.ParkingQueue)
			want := map[string]any{"message_id": "m1", "origin": e.app, "reason": "non-retryable", "policy": "default",
				"group": parked.Headers[names.Group], "error": "card 4242 declined", "retry_count": 0.0}
			var got map[string]any
			if format == "schema1" {
				want["schema"] = 1.0
				if err := json.Unmarshal(event.Body, &got); err != nil {
					t.Fatalf("event %s: %v", event.Body, err)
				}
			} else {
				if err := eventstest.Validate(event.Body); err != nil {
					t.Error(err)
				}
				var ce struct {
					Type, Subject string
					Data          map[string]any
				}
				if err := json.Unmarshal(event.Body, &ce); err != nil {
					t.Fatalf("event %s: %v", event.Body, err)
				}
				if ce.Type != "io.github.rebound-mq.parked.non-retryable" || ce.Subject != e.app {
					t.Errorf("CloudEvent type %q, subject %q", ce.Type, ce.Subject)
				}
				got = ce.Data
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("event's %s = %v, want %v", k, got[k], v)
				}
			}
			if len(got) != len(want)+1 { // and parked_at
				t.Errorf("event's fields %v, want exactly %d", got, len(want)+1)
			}
			if event.RoutingKey != "parked.non-retryable."+e.app || strings.Contains(string(event.Body), "secret") {
				t.Errorf("event with routing key %s: %s; want parked.non-retryable.%s, without the body", event.RoutingKey, event.Body, e.app)
			}
			e.eventually("the event is counted published", func() bool { return e.metric("rebound_events_total", "outcome", "published") == 1 })
		})
	}
}

// TestRunTrustsTheBrokersRecordOverTheOriginHeader: a producer names
// another queue in the origin header of a message the application
// rejects. rebound sends it back where the broker's x-death says it died,
// and counts and logs the disagreement.
func TestRunTrustsTheBrokersRecordOverTheOriginHeader(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic")
	victim := e.prefix + "victim"
	e.Declare(victim, nil)
	e.start(e.options())

	e.Publish(e.app, amqp.Publishing{MessageId: "m1", Headers: amqp.Table{names.OriginQueue: victim}})
	e.reject(e.app)
	back := e.take(e.app)
	if back.MessageId != "m1" || back.Headers[names.OriginQueue] != e.app {
		t.Errorf("copy %q back in the application queue with origin header %v, want m1 with %s", back.MessageId, back.Headers[names.OriginQueue], e.app)
	}
	if n := e.metric("rebound_origin_mismatch_total"); n != 1 {
		t.Errorf("rebound_origin_mismatch_total = %v, want 1", n)
	}
	logged := e.loggedFor("origin header disagrees with the broker's x-death record; using the record", "m1")
	if len(logged) != 1 || logged[0].ContextMap()["header"] != strconv.Quote(victim) || logged[0].ContextMap()["origin"] != e.app {
		t.Errorf("mismatch log lines %v, want one with header %q and origin %s", logged, victim, e.app)
	}
	if n := e.QueueLen(victim); n != 0 {
		t.Errorf("the queue the header named holds %d messages, want none", n)
	}
}

// TestRunCountsAPolicyConflict: a message whose policy header names this
// replica's policy with another fingerprint (a replica configured
// differently decided its last retry) is decided by this replica's
// policy, counted in rebound_policy_conflicts_total and logged once, so
// that an operator finds replicas that disagree.
func TestRunCountsAPolicyConflict(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic")
	opt := e.options()
	e.start(opt)
	mine := opt.Router.Policies.Default()
	back := e.retryThroughInbox("m1", amqp.Table{names.Policy: "default:0badf00d"})
	if back.Headers[names.Policy] != mine.Label() || back.Headers[names.RetryCount] != int64(1) {
		t.Errorf("copy back with policy %v, retry count %v; want this replica's %s, 1", back.Headers[names.Policy], back.Headers[names.RetryCount], mine.Label())
	}
	if n := e.metric("rebound_policy_conflicts_total", "policy", "default"); n != 1 {
		t.Errorf("rebound_policy_conflicts_total{policy=default} = %v, want 1", n)
	}
	e.loggedOnce("policy header disagrees with this replica's policies; deciding with this replica's", "m1", "conflict", mine.Fingerprint)
}

// retryThroughInbox sends a message from the application queue with
// headers h into the inbox, as the broker dead-letters it, and takes its
// copy back from the application queue.
func (e *env) retryThroughInbox(id string, h amqp.Table) amqp.Delivery {
	e.t.Helper()
	all := amqp.Table{names.OriginQueue: e.app}
	for k, v := range h {
		all[k] = v
	}
	e.Publish(e.topo.InboxQueue, amqp.Publishing{MessageId: id, Headers: all})
	return e.take(e.app)
}

// loggedOnce checks that msg was logged once about message id, its field
// saying want.
func (e *env) loggedOnce(msg, id, field, want string) {
	e.t.Helper()
	logged := e.loggedFor(msg, id)
	if len(logged) != 1 || !strings.Contains(fmt.Sprint(logged[0].ContextMap()[field]), want) {
		e.t.Errorf("%q logged about %s: %v; want once, its %s saying %s", msg, id, logged, field, want)
	}
}

// TestRunCountsUnreadableHeaders: a retry count rebound cannot read is
// treated as absent, counted, logged once with the message id, and the
// copy carries a valid count.
func TestRunCountsUnreadableHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic")
	e.start(e.options())
	back := e.retryThroughInbox("m1", amqp.Table{names.RetryCount: "many"})
	if back.Headers[names.RetryCount] != int64(1) {
		t.Errorf("copy's %s = %#v, want 1 (the unreadable count taken as 0)", names.RetryCount, back.Headers[names.RetryCount])
	}
	if n := e.metric("rebound_invalid_headers_total", "header", names.RetryCount); n != 1 {
		t.Errorf("rebound_invalid_headers_total{header=%s} = %v, want 1", names.RetryCount, n)
	}
	e.loggedOnce("unreadable headers treated as absent", "m1", "problems", names.RetryCount)
}

// TestRunDrainsOnShutdown stops the sidecar while it works through a
// backlog: Run returns nil once every copy it published is confirmed and
// its delivery acked, so each message is either in its origin queue or
// still in the inbox, never both, never neither. The origin is a quorum
// queue, whose confirms wait for the disk: copies are in flight when the
// sidecar is stopped.
func TestRunDrainsOnShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic")
	origin := e.prefix + "orders"
	e.Declare(origin, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	opt := e.options("REBOUND_IMMEDIATE_RETRIES", "1", "REBOUND_PREFETCH", "128")
	conn := e.b.Dial(t, e.b.URL)
	if _, err := declarer.Declare(conn, e.topo.ForServer(conn.Properties)); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	var confirms []*amqp.DeferredConfirmation
	for i := range n {
		dc, err := e.Ch.PublishWithDeferredConfirmWithContext(context.Background(), "", e.topo.InboxQueue, true, false,
			amqp.Publishing{MessageId: strconv.Itoa(i), Headers: amqp.Table{names.OriginQueue: origin}})
		if err != nil {
			t.Fatal(err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			t.Fatalf("backlog not confirmed: %v", err)
		}
	}

	s, stop := e.start(opt)
	e.eventually("copies in flight", func() bool {
		confirmed := e.metric("rebound_messages_retried_total", "kind", "immediate")
		return confirmed >= 50 && e.metric("rebound_messages_received_total")-confirmed >= 10
	})
	if err := stop(); err != nil {
		t.Fatalf("Run after cancel: %v, want nil", err)
	}
	if s.Ready() || e.metric("rebound_ready") != 0 {
		t.Errorf("after Run returned: Ready %v, rebound_ready %v; want false, 0", s.Ready(), e.metric("rebound_ready"))
	}
	if len(e.logged("drained: every published copy confirmed and acked")) != 1 || len(e.logged("stopped")) != 1 {
		t.Errorf("no drained and stopped log lines")
	}
	if n := e.metric("rebound_inflight_deliveries"); n != 0 {
		t.Errorf("rebound_inflight_deliveries = %v after the drain, want 0", n)
	}

	confirmed := int(e.metric("rebound_messages_retried_total", "kind", "immediate"))
	if confirmed == n {
		t.Fatalf("the sidecar handled all %d messages before it was stopped", n)
	}
	// The deliveries rebound had not settled are requeued when its
	// connection closes, a moment after Run returns.
	total := func() int { return e.QueueLen(origin) + e.QueueLen(e.topo.InboxQueue) }
	e.eventually("every message is back in a queue", func() bool { return total() >= n })
	time.Sleep(200 * time.Millisecond)
	back, left := e.QueueLen(origin), e.QueueLen(e.topo.InboxQueue)
	if back != confirmed {
		t.Errorf("the origin queue holds %d copies, the sidecar counted %d confirmed", back, confirmed)
	}
	if back+left != n {
		t.Errorf("%d copies back and %d left in the inbox, want %d in all (more: a confirmed copy's delivery was not acked; fewer: a message was lost)", back, left, n)
	}
}

// TestRunReconnectsAfterTheInboxIsDeleted: the broker cancels rebound's
// consumer when the inbox goes. The session ends, a new one declares the
// topology again, and messages flow.
func TestRunReconnectsAfterTheInboxIsDeleted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic")
	s, _ := e.start(e.options())
	if _, err := e.Ch.QueueDelete(e.topo.InboxQueue, false, false, false); err != nil {
		t.Fatal(err)
	}
	e.eventually("a new session is ready", func() bool { return e.metric("rebound_reconnects_total") == 1 && s.Ready() })
	ended := e.logged("session ended; reconnecting")
	if len(ended) != 1 || ended[0].ContextMap()["error"] == nil {
		t.Errorf("session-ended log lines %v, want one with the error", ended)
	}

	e.Publish(e.app, amqp.Publishing{MessageId: "after"})
	e.reject(e.app)
	if back := e.take(e.app); back.MessageId != "after" || back.Headers[names.RetryCount] != int64(1) {
		t.Errorf("after the reconnect the application queue got %q with count %v, want the retried message", back.MessageId, back.Headers[names.RetryCount])
	}
}

// TestRunRetriesWhileTheTopologyIsRefused: a classic inbox where quorum
// queues are configured cannot be declared. Each session ends with that
// error and Run keeps trying, never ready, until cancelled.
func TestRunRetriesWhileTheTopologyIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "quorum")
	e.Declare(e.topo.InboxQueue, nil)
	s, stop := e.run(e.options())
	e.eventually("two sessions failed", func() bool { return e.metric("rebound_reconnects_total") >= 2 })
	if s.Ready() {
		t.Error("ready without its topology")
	}
	if err := stop(); err != nil {
		t.Errorf("Run = %v, want nil after cancel", err)
	}
	ended := e.logged("session ended; reconnecting")
	if len(ended) < 2 {
		t.Fatalf("%d session-ended log lines, want at least 2", len(ended))
	}
	if msg, _ := ended[0].ContextMap()["error"].(string); !strings.Contains(msg, "declare topology") || !strings.Contains(msg, e.topo.InboxQueue) {
		t.Errorf("session ended with %q, want the inbox's declaration refused", msg)
	}
}

// TestRunNoticesAnEarlierReboundsQuorumInbox: an inbox declared by a
// rebound that did not dead-letter it to the parking queue is used as it
// is, and the log says what it lacks and the policy that applies it.
func TestRunNoticesAnEarlierReboundsQuorumInbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "quorum")
	e.Declare(e.topo.InboxQueue, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	e.start(e.options())
	notices := e.logged("topology")
	if len(notices) != 1 {
		t.Fatalf("topology notices %v, want one", notices)
	}
	notice, _ := notices[0].ContextMap()["notice"].(string)
	for _, want := range []string{e.topo.InboxQueue, "earlier rebound", "x-dead-letter-exchange", "rebound-inbox-dead-letter"} {
		if !strings.Contains(notice, want) {
			t.Errorf("notice %q does not say %q", notice, want)
		}
	}
}

// TestRunDeletesIdleDelayQueues: a delay queue with no publish for
// REBOUND_DELAY_QUEUE_IDLE is deleted once empty.
func TestRunDeletesIdleDelayQueues(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic")
	e.start(e.options("REBOUND_DELAY_QUEUE_IDLE", "100ms"))
	e.Publish(e.app, amqp.Publishing{MessageId: "m1"})
	e.reject(e.app)
	e.take(e.app)
	delayQueue, _ := e.topo.DelayQueue(50 * time.Millisecond)
	e.eventually("the idle delay queue is deleted", func() bool {
		_, err := brokertest.QueueLen(e.b.URL, delayQueue.Name)
		return err != nil
	})
	// The broker deletes the queue before the sweep that asked for it
	// returns and logs it.
	e.eventually("the deletion is logged", func() bool { return len(e.logged("deleted idle empty delay queues")) > 0 })
	logged := e.logged("deleted idle empty delay queues")
	if len(logged) != 1 || !strings.Contains(fmt.Sprint(logged[0].ContextMap()["queues"]), delayQueue.Name) {
		t.Errorf("log lines %v, want one naming %s", logged, delayQueue.Name)
	}
}

// TestRunLogsASummary: the periodic summary lines add up to what the
// sidecar did.
func TestRunLogsASummary(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic")
	opt := e.options()
	opt.SummaryEvery = 50 * time.Millisecond
	e.start(opt)
	for i := range 3 {
		e.Publish(e.topo.InboxQueue, amqp.Publishing{MessageId: strconv.Itoa(i)}) // no origin: parked
	}
	var received, parked, retried int64
	var ready bool
	e.eventually("the summaries count the 3 parked messages", func() bool {
		received, parked, retried, ready = 0, 0, 0, false
		for _, l := range e.logged("summary") {
			m := l.ContextMap()
			received += m["received"].(int64)
			parked += m["parked"].(int64)
			retried += m["retried"].(int64)
			ready = ready || m["ready"] == true
			if m["period"] != 50*time.Millisecond {
				t.Fatalf("summary period %v, want 50ms", m["period"])
			}
		}
		return received >= 3 && parked >= 3
	})
	if received != 3 || parked != 3 || retried != 0 || !ready {
		t.Errorf("summaries add up to received %d, parked %d, retried %d, ready %v; want 3, 3, 0, true", received, parked, retried, ready)
	}
}

// TestRunKeepsReconnectingUntilCancelled runs the sidecar against a port
// nothing listens on: it keeps trying, every attempt is a sign of life
// for Healthy, and cancelling ends Run with nil.
func TestRunKeepsReconnectingUntilCancelled(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zap.InfoLevel)
	var skew atomic.Int64 // added to the sidecar's clock
	s := New(Options{
		Dialer: dialer.New([]string{brokertest.RefusingURL(t)}, nil, dialer.Client{Name: "rebound test"}), Logger: zap.New(core), Metrics: NewMetrics(reg, route.Router{}), ConfirmTimeout: time.Second,
		Now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) },
		Reconnect: policy.Policy{Backoff: policy.Constant, MinDelay: 10 * time.Millisecond, MaxDelay: 10 * time.Millisecond,
			Jitter: policy.NoJitter, Deadline: policy.Lenient},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer cancel()
	reconnects := func() float64 { return metricValue(t, reg, "rebound_reconnects_total") }
	waitFor := func(n float64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); reconnects() < n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%v reconnects after 10s, want %v", reconnects(), n)
			}
		}
	}
	waitFor(2)
	// Three minutes pass with the broker down: the attempts made since
	// keep the sidecar healthy.
	skew.Store(int64(3 * time.Minute))
	waitFor(reconnects() + 2)
	if err := s.Healthy(); err != nil {
		t.Errorf("Healthy while reconnecting = %v, want nil: reconnect attempts are signs of life", err)
	}
	if s.Ready() {
		t.Error("ready with no broker")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil after cancel", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of cancel")
	}
	ended := logs.FilterMessage("session ended; reconnecting").All()
	if len(ended) < 4 {
		t.Fatalf("%d session-ended log lines, want at least 4", len(ended))
	}
	for _, l := range ended {
		msg, _ := l.ContextMap()["error"].(string)
		if !strings.Contains(msg, "connection refused") || strings.Contains(msg, brokertest.RefusingPassword) {
			t.Errorf("session ended with %q, want connection refused and no password", msg)
		}
	}
	if all := logs.All(); all[len(all)-1].Message != "stopped" {
		t.Errorf("last log line %q, want stopped", all[len(all)-1].Message)
	}
}

// TestHealthFailsWhenEverySessionDiesOnConnect: a message whose headers
// the broker's x-death pushes past frame_max ends every session as soon as
// it is delivered (amqp091-go refuses the frame and closes the
// connection), so rebound reconnects forever; that is not a sign of life,
// and /healthz must say so, where before it answered 200.
func TestHealthFailsWhenEverySessionDiesOnConnect(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic")
	s, _ := e.start(e.options())
	if err := s.Healthy(); err != nil {
		t.Fatalf("healthy before: %v", err)
	}
	// Under the 128 KiB frame_max as published, over it with x-death.
	e.Publish(e.app, amqp.Publishing{MessageId: "huge-headers", Headers: amqp.Table{"pad": strings.Repeat("x", 131072-400)}})
	e.reject(e.app)
	var err error
	e.within(time.Minute, "/healthz fails while every session dies on its first delivery", func() bool {
		err = s.Healthy()
		return err != nil
	})
	if !strings.Contains(err.Error(), "sessions in a row ended") {
		t.Errorf("Healthy: %v, want it to name the reconnect loop", err)
	}
	if n := len(e.logged("session ended; reconnecting")); n < churnLimit {
		t.Errorf("%d reconnects logged, want at least %d", n, churnLimit)
	}
}
