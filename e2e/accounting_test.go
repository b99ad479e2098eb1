package e2e

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Message accounting for the no-loss tests: N uniquely numbered messages
// are driven through the loop to the parking queue while a fault is
// injected; at the end every id must be parked. Duplicates are allowed and
// reported, and so is, for every fault that ends, how long rebound took to
// move messages again.

// publishNumbered publishes messages with ids 0..n-1 to the application
// queue and waits for the broker's confirms.
func (e *testEnv) publishNumbered(n int) { e.publishNumberedFrom(0, n) }

// publishNumberedFrom publishes ids first..first+n-1.
func (e *testEnv) publishNumberedFrom(first, n int) {
	e.t.Helper()
	if err := e.tryPublishNumbered(first, n); err != nil {
		e.t.Fatal(err)
	}
}

// tryPublishNumbered is publishNumberedFrom returning its error instead of
// failing the test, so that a goroutine may call it.
func (e *testEnv) tryPublishNumbered(first, n int) error {
	conn, err := amqp.Dial(e.URL())
	if err != nil {
		return fmt.Errorf("connect to publish: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel to publish: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("enable confirms to publish: %w", err)
	}
	body := make([]byte, cmp.Or(e.body, 512))
	var confirms []*amqp.DeferredConfirmation
	for i := first; i < first+n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", e.App, false, false, amqp.Publishing{
			MessageId: strconv.Itoa(i), DeliveryMode: amqp.Persistent, Body: body,
			Headers: amqp.Table{"app": "orders", "seq": int64(i)},
		})
		if err != nil {
			return fmt.Errorf("publish %d: %w", i, err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			return fmt.Errorf("test publish not confirmed: %v", err)
		}
	}
	return nil
}

// publishCanary puts message id straight into rebound's inbox, as if
// dead-lettered from the application queue. Published as a fault ends, it
// makes sure rebound has something to move then, even when the scenario's
// own messages are all parked already; it is counted like them. It returns
// an error rather than failing the test, so that a goroutine may call it.
func (e *testEnv) publishCanary(id int) error {
	conn, err := amqp.Dial(e.URL())
	if err != nil {
		return fmt.Errorf("canary %d: %w", id, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("canary %d: %w", id, err)
	}
	inbox := e.Vars["REBOUND_INBOX_QUEUE"]
	if _, err := ch.QueueDeclarePassive(inbox, true, false, false, false, nil); err != nil {
		return fmt.Errorf("canary %d: %w", id, err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("canary %d: %w", id, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", inbox, false, false, amqp.Publishing{
		MessageId: strconv.Itoa(id), DeliveryMode: amqp.Persistent, Headers: amqp.Table{"x-retry-origin-queue": e.App},
	})
	if err != nil {
		return fmt.Errorf("canary %d: %w", id, err)
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		return fmt.Errorf("canary %d not confirmed: %v", id, err)
	}
	return nil
}

// account takes parked messages off the parking queue until want distinct
// ids are there (then a little longer, for duplicates) or timeout passes
// with no new one parked, and fails the test for every id that is
// missing. The timeout bounds a stall, not the machine's speed: while
// messages keep arriving, or the replica keeps moving copies, it waits
// on, up to five timeouts in all. It uses
// its own connections, so it survives faults injected into the broker.
func (e *testEnv) account(n, operatorLost int, timeout time.Duration) (duplicates int) {
	e.t.Helper()
	return e.accountRecovered(n, operatorLost, nil, timeout)
}

// accountRecovered is account for a scenario whose faults end: it also
// reports the worst of their times to recover.
func (e *testEnv) accountRecovered(n, operatorLost int, faults []recovery, timeout time.Duration) (duplicates int) {
	e.t.Helper()
	seen := map[string]int{}
	total := 0
	want := n - operatorLost
	deadline, limit := time.Now().Add(timeout), time.Now().Add(5*timeout)
	var settled, looked time.Time
	lastMoved := -1.0
	for time.Now().Before(deadline) {
		before := len(seen)
		got := e.takeParked(seen)
		total += got
		// Progress: a new id parked, or the replica moved copies since
		// the last look (once a second; a restarted replica counts from
		// 0 again, so any change counts).
		moving := len(seen) > before
		if time.Since(looked) >= time.Second {
			looked = time.Now()
			if p, ok := e.progress(); ok && p.moved != lastMoved {
				moving, lastMoved = moving || lastMoved >= 0, p.moved
			}
		}
		if next := time.Now().Add(timeout); moving && next.After(deadline) {
			deadline = next
			if deadline.After(limit) {
				deadline = limit
			}
		}
		if len(seen) >= want {
			if settled.IsZero() {
				settled = time.Now()
			}
			if time.Since(settled) > time.Second {
				break
			}
		}
		if got == 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	duplicates = total - len(seen)
	if bound, ok := e.duplicateBound(faults); ok && duplicates > bound {
		e.t.Errorf("%d duplicates after %d faults, more than the in-flight window per fault allows (%d)", duplicates, len(faults), bound)
	}
	worst := "-" // no fault with an end
	if len(faults) > 0 {
		worst = seconds(slices.MaxFunc(faults, func(a, b recovery) int { return cmp.Compare(a.recover, b.recover) }).recover)
	}
	// One line per scenario; scripts/chaos.sh turns these into a table.
	e.logAccount(n, max(0, want-len(seen)), duplicates, operatorLost, worst, len(faults))
	if len(seen) < want {
		var missing []int
		for i := range n {
			if seen[strconv.Itoa(i)] == 0 {
				missing = append(missing, i)
			}
		}
		e.t.Errorf("%d ids not parked (operator loss allowance %d), first %v; app queue holds %d, inbox %d",
			len(missing), operatorLost, missing[:min(len(missing), 20)], e.QueueLenOr(e.App, -1), e.QueueLenOr(e.Vars["REBOUND_INBOX_QUEUE"], -1))
		e.logCensus()
	}
	return duplicates
}

// logAccount writes the scenario's line for scripts/chaos.sh, which turns
// them into docs/RELIABILITY.md's table.
func (e *testEnv) logAccount(n, lost, duplicates, operatorLost int, recover string, faults int) {
	e.t.Logf("ACCOUNT scenario=%s broker=%s queues=%s N=%d lost=%d duplicates=%d operator-lost=%d elapsed=%s recover=%s faults=%d",
		e.t.Name(), e.Broker.Version(), e.queueType(), n, lost, duplicates, operatorLost,
		time.Since(e.started).Round(100*time.Millisecond), recover, faults)
}

// queueType is the env's REBOUND_QUEUE_TYPE.
func (e *testEnv) queueType() string {
	if qt := e.Vars["REBOUND_QUEUE_TYPE"]; qt != "" {
		return qt
	}
	return "classic"
}

// duplicateBound is the most duplicates faults may cause: one in-flight
// window (REBOUND_PREFETCH) each. A fault that ends a rebound process or its
// connections does so at worst while a whole window of deliveries is unacked
// and every copy of them confirmed; each such delivery then comes back once
// and makes one extra copy, wherever in the loop it was. A fault that ends
// neither (a memory alarm) hands nothing back and makes none. There is no
// bound (ok is false) without faults recorded, nor with a broker restart:
// the broker's own at-least-once dead-lettering may hand on again what it
// held, which no window of rebound's limits.
func (e *testEnv) duplicateBound(faults []recovery) (bound int, ok bool) {
	if len(faults) == 0 {
		return 0, false
	}
	cfg := e.Config()
	for _, f := range faults {
		if strings.HasPrefix(f.fault, "broker-") {
			return 0, false
		}
	}
	// What a fault hands back is what rebound held unacked: its window, at
	// most REBOUND_PREFETCH, or two windows while the window changes.
	return len(faults) * 2 * cfg.Prefetch, true
}

func (e *testEnv) takeParked(seen map[string]int) int {
	conn, err := amqp.Dial(e.URL())
	if err != nil {
		return 0
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0
	}
	got := 0
	for {
		d, ok, err := ch.Get(e.Vars["REBOUND_PARKING_QUEUE"], true)
		if err != nil || !ok {
			return got
		}
		seen[d.MessageId]++
		got++
	}
}

// recovery is one fault that ends, as a test measured it.
type recovery struct {
	fault   string        // what was done, one word: broker-SIGKILL, rebound-SIGTERM, ...
	outage  time.Duration // from the fault's start to its end
	recover time.Duration // from the fault's end to rebound moving messages again
}

// progress is what rebound shows of itself over HTTP.
type progress struct {
	ready      bool    // /readyz answered 200
	moved      float64 // copies the broker confirmed: every rebound_messages_retried_total and rebound_messages_parked_total series
	reconnects float64 // rebound_reconnects_total
	received   float64 // rebound_messages_received_total
}

var probeClient = &http.Client{Timeout: time.Second}

// progress reads rebound's /readyz and /metrics; ok is false when rebound
// does not answer. It never fails the test, so a goroutine may call it.
func (e *testEnv) progress() (p progress, ok bool) {
	resp, err := probeClient.Get("http://" + e.http + "/readyz")
	if err != nil {
		return p, false
	}
	resp.Body.Close()
	p.ready = resp.StatusCode == http.StatusOK
	resp, err = probeClient.Get("http://" + e.http + "/metrics")
	if err != nil {
		return p, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return p, false
	}
	for _, line := range strings.Split(string(body), "\n") {
		series, value, _ := strings.Cut(line, " ")
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(series, "rebound_messages_retried_total{"), strings.HasPrefix(series, "rebound_messages_parked_total{"):
			p.moved += v
		case series == "rebound_reconnects_total":
			p.reconnects = v
		case series == "rebound_messages_received_total":
			p.received = v
		}
	}
	return p, true
}

// watchRecovery polls rebound every 20 ms, from now on, until it moves
// messages again: /readyz answers 200 and the broker has confirmed a copy
// (a retry or a parked message) not counted in base. With newSession (the
// fault drops rebound's connections) only a session begun after base
// counts. The channel gets the moment that was first seen, or the zero
// time after timeout. Start it before the fault, so that a recovery
// faster than the test's own view of the fault's end is seen too.
func (e *testEnv) watchRecovery(base progress, newSession bool, timeout time.Duration) <-chan time.Time {
	seen := make(chan time.Time, 1)
	go func() {
		moved := base.moved
		for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			at := time.Now()
			p, ok := e.progress()
			switch {
			case !ok:
			case newSession && p.reconnects <= base.reconnects:
				moved = p.moved // the session the fault is to end still runs
			case p.ready && p.moved > moved:
				seen <- at
				return
			}
		}
		seen <- time.Time{}
	}()
	return seen
}

// recovered records a fault that started at start and ended at end, once
// moving (from watchRecovery) says when rebound moved messages again.
func (e *testEnv) recovered(fault string, start, end time.Time, moving <-chan time.Time) recovery {
	e.t.Helper()
	at := <-moving
	if at.IsZero() {
		// Where the copies wait, and what rebound says of itself, tell a
		// stalled rebound from a broker that hands nothing over.
		p, ok := e.progress()
		e.logCensus()
		e.t.Fatalf("%s: rebound did not move messages again after the fault ended (answers %v: ready %v, %v reconnects, %v received, %v moved)",
			fault, ok, p.ready, p.reconnects, p.received, p.moved)
	}
	r := recovery{fault: fault, outage: end.Sub(start), recover: max(0, at.Sub(end))}
	// scripts/chaos.sh lists these lines under the table.
	e.t.Logf("RECOVER scenario=%s broker=%s queues=%s fault=%s outage=%s recover=%s", e.t.Name(), e.Broker.Version(), e.queueType(),
		fault, seconds(r.outage), seconds(r.recover))
	return r
}

// seconds formats d for the reliability tables: 0.31s, 12.40s.
func seconds(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

// feedUntil publishes a canary at once and then every 200 ms until moving
// reports, and passes the report on. No canary is published after that.
// A canary that fails is logged, not counted, and the next one is tried:
// if none gets through, moving reports that rebound did not move again.
func feedUntil(moving <-chan time.Time, canary func() error, logf func(format string, args ...any)) <-chan time.Time {
	out := make(chan time.Time, 1)
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			if err := canary(); err != nil {
				logf("%v", err)
			}
			select {
			case at := <-moving:
				out <- at
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// logCensus logs, one CENSUS line per queue of the test's prefix, what
// the broker holds there, the copies a quorum queue holds for
// dead-lettering included (messages_dlx, which no consumer sees): where
// missing ones wait, in the output CI keeps (the Makefile filters the
// disruptive tests' output).
func (e *testEnv) logCensus() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := e.Broker.Ctl(ctx, nil, "eval", fmt.Sprintf(`[io:format("~ts ~w~n", [element(4, amqqueue:get_name(Q)),
		catch rabbit_amqqueue:info(Q, [type, messages, messages_ready, messages_unacknowledged] ++ [messages_dlx || amqqueue:get_type(Q) =:= rabbit_quorum_queue])])
		|| Q <- rabbit_amqqueue:list(), binary:match(element(4, amqqueue:get_name(Q)), <<%q>>) =/= nomatch], ok.`, e.Prefix))
	if err != nil {
		e.t.Logf("CENSUS unavailable: %v", err)
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line != "ok" {
			e.t.Logf("CENSUS %s", line)
		}
	}
}
