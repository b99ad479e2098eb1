package e2e

import (
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// Hold mode (REBOUND_DELAY_MODE=hold): every delayed retry waits in one
// quorum hold queue, held by the replicas' holders over AMQP 1.0.

// holdBroker requires a broker that can hold, or skips: TestHoldRefused
// covers the others.
func holdBroker(t *testing.T) {
	t.Helper()
	if b := brokertest.Require(t); !b.AtLeast(4, 3) {
		t.Skipf("RabbitMQ %s cannot hold: TestHoldRefused checks that rebound refuses it", b.Version())
	}
}

// TestHoldRefused: on a broker that cannot hold, `rebound run` in hold
// mode stops at start with an error naming the mode and the reason, and
// declares nothing that would take copies.
func TestHoldRefused(t *testing.T) {
	b := brokertest.Require(t)
	if b.AtLeast(4, 3) {
		t.Skipf("RabbitMQ %s can hold", b.Version())
	}
	e := newTestEnv(t, map[string]string{"REBOUND_DELAY_MODE": "hold"})
	_, _, err := e.cli("run")
	if err == nil || !strings.Contains(err.Error(), "REBOUND_DELAY_MODE=hold") || !strings.Contains(err.Error(), "cannot hold") {
		t.Fatalf("rebound run in hold mode on RabbitMQ %s: %v, want a refusal naming the mode and the reason", b.Version(), err)
	}
	if e.queueExists(e.Vars["REBOUND_DELAY_QUEUE_PREFIX"] + "hold") {
		t.Error("the hold queue was declared by a refused start")
	}
}

// TestNoLossWhenReplicaKilledHold is TestNoLossWhenReplicaKilled in hold
// mode: 1500 messages through three replicas, one SIGKILLed five times,
// mid-hold and mid-return; every message is accounted for.
func TestNoLossWhenReplicaKilledHold(t *testing.T) {
	t.Parallel()
	holdBroker(t)
	killRepeatedly(t, "quorum", 3, 1500, 0, map[string]string{"REBOUND_DELAY_MODE": "hold", "REBOUND_MIN_DELAY": "300ms"})
}

// TestHoldLoopAndCommands: in hold mode a rejected message comes back
// through the hold queue with its headers (and x-opt-delivery-time);
// `rebound delayed` shows the hold queue; `delayed flush` sends a held
// copy home within a slice and `delayed cancel` parks one, cancelled,
// with its table and array headers.
func TestHoldLoopAndCommands(t *testing.T) {
	holdBroker(t)
	e := newTestEnv(t, map[string]string{"REBOUND_DELAY_MODE": "hold", "REBOUND_HOLD_SLICE": "2s",
		"REBOUND_MIN_DELAY": "1s", "REBOUND_MAX_DELAY": "1h", "REBOUND_BACKOFF": "constant"})
	stopQuick := e.startInProcess()
	e.Publish(e.App, amqp.Publishing{MessageId: "quick", Headers: amqp.Table{"tenant": amqp.Table{"tags": []any{"a", "b"}}}})
	e.Reject(e.App, 10*time.Second)
	back := e.Get(e.App, 30*time.Second)
	if back.MessageId != "quick" || back.Headers["x-retry-count"] != int64(1) || back.Headers["x-opt-delivery-time"] == nil && back.Headers["x-retry-due-at"] == nil {
		t.Fatalf("back from the hold queue: %s %v", back.MessageId, back.Headers)
	}
	if tenant, _ := back.Headers["tenant"].(amqp.Table); tenant == nil {
		t.Errorf("nested header lost: %v", back.Headers)
	}
	if err := back.Ack(false); err != nil {
		t.Fatal(err)
	}

	if err := stopQuick(); err != nil {
		t.Fatal(err)
	}
	e.Vars["REBOUND_MIN_DELAY"] = "30m" // for the commands: the copies wait far longer than the test
	e.startInProcess()
	e.Publish(e.App, amqp.Publishing{MessageId: "flushed"})
	out, _, err := e.cli("delayed")
	if err != nil || !strings.Contains(out, "hold queue "+e.Vars["REBOUND_DELAY_QUEUE_PREFIX"]+"hold") {
		t.Fatalf("rebound delayed: %v\n%s", err, out)
	}
	e.Reject(e.App, 10*time.Second)
	if !brokertest.Await(30*time.Second, func() bool { return e.heldAtLeast(1) }) {
		t.Fatal("the first copy was not held")
	}
	out, _, err = e.cli("delayed", "flush", "--origin", "^"+regexp.QuoteMeta(e.App)+"$", "--yes")
	if err != nil || !strings.Contains(out, "recorded in") {
		t.Fatalf("rebound delayed flush: %v\n%s", err, out)
	}
	if m := e.Get(e.App, 30*time.Second); m.MessageId != "flushed" {
		t.Fatalf("after the flush %s came back, want flushed", m.MessageId)
	} else if err := m.Ack(false); err != nil {
		t.Fatal(err)
	}
	// The flush lasts two slices: the next copy entered the hold queue
	// after it, which leaves it alone, and is cancelled.
	nested := amqp.Table{"tenant": amqp.Table{"tags": []any{"a", "b"}}, "arr": []any{int64(1), amqp.Table{"k": "v"}}, "x-nested": amqp.Table{"k": "v"}}
	e.Publish(e.App, amqp.Publishing{MessageId: "cancelled", Headers: nested})
	e.Reject(e.App, 10*time.Second)
	if !brokertest.Await(30*time.Second, func() bool { return e.heldAtLeast(2) }) {
		t.Fatal("the second copy was not held")
	}
	if _, _, err = e.cli("delayed", "cancel", "--origin", "^"+regexp.QuoteMeta(e.App)+"$", "--yes"); err != nil {
		t.Fatal(err)
	}
	parked := e.Get(e.Vars["REBOUND_PARKING_QUEUE"], 30*time.Second)
	if parked.MessageId != "cancelled" || parked.Headers["x-retry-parked-reason"] != "cancelled" {
		t.Fatalf("parked %s, reason %v; want cancelled, cancelled", parked.MessageId, parked.Headers["x-retry-parked-reason"])
	}
	for k, v := range nested {
		if !reflect.DeepEqual(parked.Headers[k], v) {
			t.Errorf("parked by a holder: header %s = %#v, want %#v", k, parked.Headers[k], v)
		}
	}
}

// heldAtLeast reports whether rebound has held at least n copies since it
// last started.
func (e *testEnv) heldAtLeast(n float64) bool {
	v, err := strconv.ParseFloat(e.metric(`rebound_hold_settlements_total{outcome="held"}`), 64)
	return err == nil && v >= n
}
