package e2e

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/delayqueue"
	"github.com/rebound-mq/rebound/internal/topology"
)

// Messages dead-lettered for every reason, and rebound's own quorum queues
// under delivery limits: the losses RabbitMQ 3.10 and 4.x each showed.

// TestEveryDeadLetterReasonIsRetried: an application queue dead-letters a
// message because it expired (message TTL), overflowed (x-max-length,
// drop-head) or crossed a quorum delivery limit, not only because its
// consumer rejected it. Each is retried until parked, none lost. RabbitMQ
// 3.10 dropped every such copy as a dead-letter cycle when its delay ended
// while copies carried the broker's x-death (which names the origin with
// no "rejected" entry).
func TestEveryDeadLetterReasonIsRetried(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		reason string
		args   amqp.Table // the application queue's, besides dead-lettering
		drive  func(e *testEnv, n int)
	}{
		// Nobody consumes: every message expires after 200 ms.
		{"expired", amqp.Table{"x-message-ttl": int64(200)}, func(e *testEnv, n int) { e.publishNumbered(n) }},
		// Room for one: each message pushes the one before out.
		{"maxlen", amqp.Table{"x-max-length": int64(1), "x-overflow": "drop-head"}, func(e *testEnv, n int) {
			e.publishNumbered(n)
			e.publishNumberedFrom(n, 1) // pushes the last of them out too
		}},
		// A consumer that dies holding each message: a quorum queue
		// dead-letters it past one delivery.
		{"delivery_limit", amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(1)}, func(e *testEnv, n int) {
			e.crashingConsumer(e.App)
			e.publishNumbered(n)
		}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			t.Parallel()
			e := newTestEnv(t, fastLoop)
			args := amqp.Table{"x-dead-letter-exchange": e.Vars["REBOUND_DEAD_LETTER_EXCHANGE"]}
			for k, v := range tc.args {
				args[k] = v
			}
			if _, err := e.Ch.QueueDelete(e.App, false, false, false); err != nil {
				t.Fatal(err)
			}
			if _, err := e.Ch.QueueDeclare(e.App, true, false, false, false, args); err != nil {
				t.Fatal(err)
			}
			e.startInProcess()
			const n = 20
			tc.drive(e, n)
			total, inApp := n, 0
			if tc.reason == "maxlen" {
				// The message that pushed the last one out is retried
				// too, and one of them stays in the application queue.
				total, inApp = n+1, 1
			}
			parked := e.parkedAll(total, inApp, time.Minute)
			for id, d := range parked {
				if d.Headers["x-retry-parked-reason"] != "max-retries" || d.Headers["x-retry-count"] != int64(2) {
					t.Errorf("%s parked as %v after %v retries, want max-retries after 2", id, d.Headers["x-retry-parked-reason"], d.Headers["x-retry-count"])
				}
				if d.Headers["x-retry-first-death-reason"] != tc.reason || d.Headers["x-retry-first-death-queue"] != e.App {
					t.Errorf("%s: first death %v in %v, want %s in %s", id, d.Headers["x-retry-first-death-reason"],
						d.Headers["x-retry-first-death-queue"], tc.reason, e.App)
				}
			}
		})
	}
}

// parkedAll waits until every one of total numbered messages (ids
// 0..total-1) is accounted for: parked, or inApp of them still in the
// application queue. Each message is in one place at a time, so once the
// parking queue and the application queue hold them all, none is still
// on its way. It fails the test for every message missing at the
// timeout and returns the parked ones by id.
func (e *testEnv) parkedAll(total, inApp int, timeout time.Duration) map[string]amqp.Delivery {
	e.t.Helper()
	parked := map[string]amqp.Delivery{}
	brokertest.Await(timeout, func() bool {
		for _, d := range e.Drain(e.Vars["REBOUND_PARKING_QUEUE"]) {
			parked[d.MessageId] = d
		}
		return len(parked) >= total-inApp && len(parked)+e.QueueLenOr(e.App, 0) >= total
	})
	waiting := map[string]bool{}
	for _, d := range e.Drain(e.App) {
		waiting[d.MessageId] = true
	}
	lost := 0
	for i := range total {
		id := strconv.Itoa(i)
		if _, ok := parked[id]; !ok && !waiting[id] {
			e.t.Errorf("message %s lost: neither parked nor in the application queue", id)
			lost++
		}
	}
	e.t.Logf("%d of %d parked, %d waiting in the application queue", len(parked), total, len(waiting))
	e.logAccount(total, lost, 0, 0, "-", 0)
	return parked
}

// crashingConsumer takes every message from queue and dies holding it
// (closes its channel without acking), again and again, until cleanup.
func (e *testEnv) crashingConsumer(queue string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := amqp.Dial(e.URL())
		if err != nil {
			return
		}
		defer conn.Close()
		for ctx.Err() == nil {
			ch, err := conn.Channel()
			if err != nil {
				return
			}
			_, ok, err := ch.Get(queue, false)
			ch.Close()
			if err != nil {
				return
			}
			if !ok {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	e.t.Cleanup(func() { cancel(); <-done })
}

// TestInboxDeliveryLimitParksInsteadOfDropping: a message rebound keeps in
// flight (its copy refused by the broker: its origin queue and the delay
// queues it would wait in for the origin, see refuseWaits, so that it
// never leaves the inbox) while rebound is killed again
// and again counts one delivery per kill that finds it in rebound's hands.
// Not every kill does: rebound requeues the refused delivery (basic.nack),
// and a kill between that nack and the redelivery finds the message in
// the queue (on 4.x the nack itself counts no delivery). So rebound is
// killed until the message is parked, at most twice the limit plus two
// times. Past a quorum queue's delivery
// limit (20 by default on RabbitMQ 4.x, none on 3.x) the broker drops it
// unless the queue dead-letters: rebound's inbox dead-letters to the
// parking queue, at least once, so the message is parked, and `rebound
// parked list` shows it with reason delivery-limit and its origin.
//
// Variants: the inbox as rebound declares it now; as an earlier rebound
// declared it (no dead-lettering), with the policy `rebound topology print`
// and setup.sh give; and, on RabbitMQ 4.0 and later, with the broker's own
// default limit. The first two lower the limit to 3 with a test policy so
// they run quickly on every broker.
func TestInboxDeliveryLimitParksInsteadOfDropping(t *testing.T) {
	t.Parallel()
	for _, variant := range []string{"declared", "earlier-rebound-with-policy", "default-limit"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			inboxDeliveryLimit(t, variant)
		})
	}
}

func inboxDeliveryLimit(t *testing.T, variant string) {
	e := newTestEnv(t, map[string]string{
		"REBOUND_QUEUE_TYPE": "quorum", "REBOUND_IMMEDIATE_RETRIES": "1000000",
		"REBOUND_MAX_RETRIES": "0", "REBOUND_MAX_DURATION": "1h",
	})
	limit := 3
	if variant == "default-limit" {
		if !e.Broker.AtLeast(4, 0) {
			t.Skipf("RabbitMQ %s has no default delivery limit", e.Broker.Version())
		}
		limit = 20
	}
	// Every copy is refused: the origin queue takes no message.
	if _, err := e.Ch.QueueDelete(e.App, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Ch.QueueDeclare(e.App, true, false, false, false, amqp.Table{"x-max-length": int64(0), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	cfg := e.Config()
	topo := cfg.Topology().ForServer(e.Conn.Properties)
	inbox := topo.InboxQueue
	policy := amqp.Table{}
	switch variant {
	case "earlier-rebound-with-policy":
		// As rebound declared its inbox before it dead-lettered: quorum,
		// nothing else. Declaring it again cannot change that.
		if _, err := e.Ch.QueueDeclare(inbox, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
		for _, p := range topo.Policies(e.vhost()) {
			if p.Name == "rebound-inbox-dead-letter" {
				policy = p.Definition
			}
		}
		if len(policy) == 0 {
			t.Fatalf("no %s policy in %+v", "rebound-inbox-dead-letter", topo.Policies(e.vhost()))
		}
		fallthrough
	case "declared":
		policy["delivery-limit"] = int64(limit)
		def, _ := json.Marshal(policy)
		name := e.Prefix + "inbox-policy"
		e.Broker.MustCtl(t, "-q", "set_policy", "-p", e.vhost(), "--apply-to", "queues", "--priority", "20", name, "^"+strings.ReplaceAll(inbox, ".", `\.`)+"$", string(def))
		t.Cleanup(func() { _, _ = e.Broker.Ctl(context.Background(), nil, "-q", "clear_policy", "-p", e.vhost(), name) })
	}

	e.refuseWaits(topo)

	p := e.startBinary()
	// Logged before it is ready, but read from its stderr by a goroutine
	// that may not have got there yet (a loaded CI saw the line 90 ms
	// after the check).
	if variant == "earlier-rebound-with-policy" && !brokertest.Await(30*time.Second, func() bool {
		return strings.Contains(p.logs.String(), "was declared by an earlier rebound without")
	}) {
		t.Errorf("no notice about the earlier rebound's inbox in the log:\n%s", p.logs.String())
	}
	e.PublishTo(inbox, amqp.Publishing{MessageId: "in-flight", DeliveryMode: amqp.Persistent, Headers: amqp.Table{"x-retry-origin-queue": e.App}})
	parking := e.Vars["REBOUND_PARKING_QUEUE"]
	maxKills, kills := 2*limit+2, 0
	for kills < maxKills {
		// Killed once the message has reached it, until the broker
		// takes it away past its delivery limit. On a loaded machine a
		// restarted rebound can take long to receive it: wait for one
		// or the other, not for a fixed time.
		if !e.waitReceivedOrParked(2*time.Minute, parking) {
			break
		}
		if err := p.signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		kills++
		if _, exited := p.wait(10 * time.Second); !exited {
			t.Fatalf("rebound (pid %d) still runs 10s after SIGKILL", p.cmd.Process.Pid)
		}
		if kills < maxKills {
			p = e.startBinary()
		}
	}
	t.Logf("rebound killed %d times under a delivery limit of %d", kills, limit)
	var parked []amqp.Delivery
	for deadline := time.Now().Add(30 * time.Second); len(parked) == 0 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if doc := e.listJSON(); doc.Matched > 0 {
			if m := doc.Messages[0]; m.ID != "in-flight" || m.Reason != "delivery-limit" || m.Origin != e.App {
				t.Errorf("parked list shows %+v, want in-flight, reason delivery-limit, origin %s", m, e.App)
			}
			parked = e.Drain(e.Vars["REBOUND_PARKING_QUEUE"])
		}
	}
	if len(parked) != 1 {
		if waiting := e.QueueLenOr(inbox, -1); waiting == 1 {
			t.Fatalf("after %d kills the message still waits in the inbox, not parked, under a delivery limit of %d", kills, limit)
		}
		e.logAccount(1, 1, 0, 0, "-", kills)
		t.Fatalf("after %d kills the message is neither parked nor in the inbox: lost", kills)
	}
	e.logAccount(1, 0, 0, 0, "-", kills)
	if reason := firstDeathReason(parked[0]); reason != "delivery_limit" {
		t.Errorf("x-death reason %q, want delivery_limit", reason)
	}
}

// refuseWaits makes every delay queue in which rebound has a copy wait
// for its refusing origin (250 ms doubled up to 30 s,
// docs/origin-refused.md) refuse every copy, so that the delivery stays
// the same message in the inbox. A policy of max-length 0 is not enough
// alone: a quorum queue refuses a message only once it holds more than
// its limit, so it takes one. Each queue is therefore given fillers until
// it refuses one; a filler dead-letters, when it expires, to e.App, which
// refuses it too, and it stays in the queue's at-least-once dead-letter
// state, where it counts against the limit (probed on 3.10 and 4.3).
func (e *testEnv) refuseWaits(topo topology.Topology) {
	t := e.t
	t.Helper()
	full := e.Prefix + "delay-full"
	e.Broker.MustCtl(t, "-q", "set_policy", "-p", e.vhost(), "--apply-to", "queues", "--priority", "30", full,
		"^"+strings.ReplaceAll(topo.DelayQueuePrefix, ".", `\.`)+`\d+$`, `{"max-length":0}`)
	t.Cleanup(func() { _, _ = e.Broker.Ctl(context.Background(), nil, "-q", "clear_policy", "-p", e.vhost(), full) })

	delays, err := delayqueue.New(e.Conn, topo, nil, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	defer delays.Close()
	ch, err := e.Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	const first, longest = 250 * time.Millisecond, 30 * time.Second
	for wait := first; ; wait = min(2*wait, longest) {
		used, err := delays.Ensure(wait)
		if err != nil {
			t.Fatal(err)
		}
		exchange := topo.DelayExchangeFor(used).Name
		refused := func() bool {
			c, err := ch.PublishWithDeferredConfirm(exchange, e.App, true, false,
				amqp.Publishing{MessageId: "filler", DeliveryMode: amqp.Persistent})
			if err != nil {
				t.Fatalf("publish a filler into %s: %v", exchange, err)
			}
			return !c.Wait()
		}
		if !brokertest.Await(time.Minute, refused) {
			t.Fatalf("delay queue of %s still takes copies after a minute of fillers", used)
		}
		if wait == longest {
			return
		}
	}
}

// waitReceivedOrParked waits until the rebound process listening on e's
// HTTP address has received a message since it started (true), or a
// message waits in the parking queue (false), or timeout passes (false).
func (e *testEnv) waitReceivedOrParked(timeout time.Duration, parking string) bool {
	for turn, deadline := 0, time.Now().Add(timeout); time.Now().Before(deadline); turn++ {
		if got, ok := e.progress(); ok && got.received > 0 {
			return true
		}
		// Each look at the parking queue opens a connection: once a
		// second.
		if turn%20 == 19 && e.QueueLenOr(parking, 0) > 0 {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func firstDeathReason(d amqp.Delivery) string {
	deaths, _ := d.Headers["x-death"].([]any)
	if len(deaths) == 0 {
		return ""
	}
	entry, _ := deaths[0].(amqp.Table)
	reason, _ := entry["reason"].(string)
	return reason
}

// TestParkingQueueSurvivesKilledReaders: `rebound parked` holds the
// messages it reads unacked; killed, its channel closes and each counts a
// delivery. RabbitMQ 4.x would drop a parked message after 20 such kills
// from a quorum parking queue with the default delivery limit: rebound
// declares it without one.
//
// A closed channel's deliveries go back to a quorum queue through Raft,
// after the channel's close-ok: each reader waits until every message is
// back (a message that never comes back is a message dropped).
func TestParkingQueueSurvivesKilledReaders(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, map[string]string{"REBOUND_QUEUE_TYPE": "quorum"})
	if _, stderr, err := e.cli("topology", "declare"); err != nil {
		t.Fatalf("topology declare: %v\n%s", err, stderr)
	}
	const n, readers = 5, 25
	seeds := make([]parkedSeed, n)
	for i := range seeds {
		seeds[i] = parkedSeed{id: strconv.Itoa(i), origin: e.App, reason: "max-retries"}
	}
	e.seedParked(seeds...)
	parking := e.Vars["REBOUND_PARKING_QUEUE"]
	for reader := range readers {
		e.waitParked(parking, n, reader)
		ch, err := e.Conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			if _, ok, err := ch.Get(parking, false); err != nil || !ok {
				t.Fatalf("reader %d: get from the parking queue, which holds %d ready messages: %v, %v", reader, n, ok, err)
			}
		}
		ch.Close() // as a killed `rebound parked` leaves them
	}
	e.waitParked(parking, n, readers)
	got := len(e.Drain(parking))
	if got != n {
		t.Errorf("%d of %d parked messages left after %d killed readers on RabbitMQ %s", got, n, readers, e.Broker.Version())
	}
	e.logAccount(n, n-got, 0, 0, "-", readers)
}

// waitParked waits until the parking queue holds n ready messages again
// after killed readers, and fails the test, naming the reader, when
// they do not all come back: the broker dropped one.
func (e *testEnv) waitParked(parking string, n, killed int) {
	e.t.Helper()
	got := 0
	if !brokertest.Await(30*time.Second, func() bool {
		got = e.QueueLenOr(parking, -1)
		return got == n
	}) {
		e.logAccount(n, n-max(got, 0), 0, 0, "-", killed)
		e.t.Fatalf("after %d killed readers the parking queue holds %d of %d messages on RabbitMQ %s", killed, got, n, e.Broker.Version())
	}
}

// TestUpgradeFromHeadersExchange: an earlier rebound routed delayed copies
// through one shared headers exchange, on a header its delay queues were
// bound on. The new rebound gives each delay queue an exchange of its own
// and leaves the old one alone. The copies already waiting in delay
// queues come back to their origin as before (their routing key is the
// origin), and so does a copy an old replica still publishes the old way
// during a rolling upgrade.
func TestUpgradeFromHeadersExchange(t *testing.T) {
	t.Parallel()
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newTestEnv(t, with(fastLoop, "REBOUND_QUEUE_TYPE", queueType, "REBOUND_MIN_DELAY", "100ms"))
		cfg := e.Config()
		topo := cfg.Topology().ForServer(e.Conn.Properties)
		// The earlier topology: a headers exchange, and a 3 s delay queue
		// bound on rebound-delay-ms, holding copies as the earlier rebound
		// published them.
		const waitMs = 3000
		exchange := e.Vars["REBOUND_DELAY_EXCHANGE"]
		if err := e.Ch.ExchangeDeclare(exchange, amqp.ExchangeHeaders, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		old, _ := topo.DelayQueue(waitMs * time.Millisecond)
		if _, err := e.Ch.QueueDeclare(old.Name, true, false, false, false, old.Args); err != nil {
			t.Fatal(err)
		}
		if err := e.Ch.QueueBind(old.Name, "", exchange, false, amqp.Table{"x-match": "all", "rebound-delay-ms": int64(waitMs)}); err != nil {
			t.Fatal(err)
		}
		oldCopy := func(ch *amqp.Channel, id int) {
			t.Helper()
			if err := ch.PublishWithContext(context.Background(), exchange, e.App, true, false, amqp.Publishing{
				MessageId: strconv.Itoa(id), DeliveryMode: amqp.Persistent,
				Headers: amqp.Table{"rebound-delay-ms": int64(waitMs), "x-retry-count": int64(1), "x-retry-origin-queue": e.App},
			}); err != nil {
				t.Fatal(err)
			}
		}
		const n = 200
		for i := range n {
			oldCopy(e.Ch, i)
		}
		for deadline := time.Now().Add(10 * time.Second); e.QueueLenOr(old.Name, 0) < n; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d old copies in the delay queue", e.QueueLenOr(old.Name, -1), n)
			}
		}
		// rebound first: the old copies may expire while it starts, and a
		// copy rejected before rebound has bound its inbox to the
		// dead-letter exchange would be dropped by the broker. Until the
		// rejector starts, an expired copy waits in the application queue.
		stop := e.startInProcess()
		e.rejectAll(e.App)
		// An old replica still running publishes the old way, after the
		// new one declared its topology: its copy must be routed as before.
		oldReplica, err := e.Broker.Dial(t, e.URL()).Channel()
		if err != nil {
			t.Fatal(err)
		}
		returns := oldReplica.NotifyReturn(make(chan amqp.Return, 1))
		oldCopy(oldReplica, n)
		e.account(n+1, 0, time.Minute)
		select {
		case r := <-returns:
			t.Errorf("the old replica's copy %s was returned: the upgrade broke its routing", r.MessageId)
		default:
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		// The old exchange is still there, and still of type headers.
		if err := e.Ch.ExchangeDeclarePassive(exchange, amqp.ExchangeHeaders, true, false, false, false, nil); err != nil {
			t.Errorf("the old exchange %s did not survive the upgrade: %v", exchange, err)
		}
	})
}
