package consumer

import (
	"fmt"
	"regexp"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/policy"
)

func TestOriginLabels(t *testing.T) {
	if got := newOriginLabels(nil, 0).value("orders.new"); got != "" {
		t.Errorf("limit 0: %q, want no label", got)
	}
	var nilLabels *originLabels
	if got := nilLabels.value("orders.new"); got != "" {
		t.Errorf("nil: %q, want no label", got)
	}
	every := newOriginLabels(nil, 5)
	if got := every.value("payments.charge"); got != "payments.charge" {
		t.Errorf("no expression: %q, want every origin its own value", got)
	}
	const limit = 100
	o := newOriginLabels(regexp.MustCompile(`^orders\.`), limit)
	for _, tc := range []struct{ origin, want string }{
		{"orders.new", "orders.new"}, {"payments.charge", "other"}, {"", "other"}, {"orders.new", "orders.new"},
	} {
		if got := o.value(tc.origin); got != tc.want {
			t.Errorf("value(%q) = %q, want %q", tc.origin, got, tc.want)
		}
	}
	for i := range 2 * limit {
		o.value(fmt.Sprintf("orders.q%d", i))
	}
	if got := o.value("orders.q150"); got != "other" {
		t.Errorf("past the limit: %q, want other", got)
	}
	if got := o.value("orders.new"); got != "orders.new" {
		t.Errorf("an origin with its own value keeps it: %q", got)
	}
	if len(o.own) != limit {
		t.Errorf("%d origins with their own value, want the limit %d", len(o.own), limit)
	}
}

// TestOriginLabelBoundAcrossFiftyOrigins: 50 services' queues on one
// vhost, each with a message parked, with the origin label's default
// shape (every origin) and a limit of 20: the first 20 origins are
// counted under their own names, the other 30 under "other", none lost,
// and the parked counter's series stay within the bound.
func TestOriginLabelBoundAcrossFiftyOrigins(t *testing.T) {
	e := newEnv(t, "classic")
	const origins, limit = 50, 20
	opt := e.options("REBOUND_METRICS_ORIGIN_LIMIT", fmt.Sprint(limit))
	e.start(opt)
	for i := range origins {
		q := fmt.Sprintf("%sservice-%02d", e.prefix, i)
		e.Declare(q, nil)
		e.Publish(e.topo.InboxQueue, amqp.Publishing{MessageId: q, Headers: amqp.Table{names.OriginQueue: q, names.NonRetryable: true}})
	}
	e.eventually("every message is counted parked", func() bool {
		return e.metric("rebound_messages_parked_total", "reason", string(policy.NonRetryable)) == origins
	})
	own, other := 0, e.metric("rebound_messages_parked_total", "reason", string(policy.NonRetryable), "origin", otherOrigin)
	for i := range origins {
		if values := matching(t, e.reg, "rebound_messages_parked_total", "reason", string(policy.NonRetryable),
			"origin", fmt.Sprintf("%sservice-%02d", e.prefix, i)); len(values) == 1 && values[0] == 1 {
			own++
		}
	}
	if own != limit || other != origins-limit {
		t.Errorf("%d origins counted under their own name and %v under other, want %d and %d", own, other, limit, origins-limit)
	}
	series := len(matching(t, e.reg, "rebound_messages_parked_total"))
	// Per reason and policy: the zero series created at start (origin
	// empty), and at most limit+1 values counted.
	bound := len(policy.Reasons) * (1 + limit + 1)
	if series > bound {
		t.Errorf("rebound_messages_parked_total has %d series, over the bound %d", series, bound)
	}
	t.Logf("%d origins, limit %d: rebound_messages_parked_total has %d series (bound %d: %d reasons × (limit + other + the zero series))",
		origins, limit, series, bound, len(policy.Reasons))
}
