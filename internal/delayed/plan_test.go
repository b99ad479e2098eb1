package delayed

import (
	"regexp"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
)

// TestPlan: what becomes of each copy a flush or a cancel reads.
func TestPlan(t *testing.T) {
	r := route.Router{
		Topology: topology.Topology{InboxQueue: "in", DeadLetterExchange: "dlx", DelayExchange: "delay", DelayQueuePrefix: "delay.",
			ParkingQueue: "parked", OriginQueues: regexp.MustCompile(`^(orders|payments)$`)},
		Policies: policy.NewSet(policy.Policy{Backoff: policy.Constant, MinDelay: time.Second, MaxDelay: time.Hour, Jitter: policy.NoJitter,
			MaxRetries: 3, Deadline: "clamp"}),
		Codec: headers.NewCodec(headers.DefaultNames()),
	}
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	q := Queue{Name: "delay.600000", Delay: 10 * time.Minute}
	// copyOf is a copy waiting in q as the sidecar wrote it, going back to
	// origin (its routing key), due at due (zero: no due header).
	copyOf := func(origin string, due time.Time) amqp.Delivery {
		h := amqp.Table{"tenant": "acme", "x-retry-count": int64(3), "x-retry-origin-queue": origin, "x-task-started-at": now.Add(-time.Hour).UnixMilli()}
		if !due.IsZero() {
			h["x-retry-due-at"] = due.UnixMilli()
		}
		return amqp.Delivery{RoutingKey: origin, MessageId: "m", Headers: h, Body: []byte("b")}
	}
	due := now.Add(4*time.Minute + 35*time.Second)
	flush := Options{Op: Flush, Origins: regexp.MustCompile(`^orders$|^rogue$|^in$`)}
	cancel := Options{Op: Cancel, Origins: regexp.MustCompile(`^orders$|^rogue$`)}
	for _, tc := range []struct {
		name   string
		d      amqp.Delivery
		opt    Options
		action action
		dest   topology.Destination
		due    any // the copy's due header; nil: absent
		why    string
	}{
		{"flush: back now", copyOf("orders", due), flush, toOrigin, topology.Direct("orders"), nil, ""},
		{"flush: an older rebound's copy too", copyOf("orders", time.Time{}), flush, toOrigin, topology.Direct("orders"), nil, ""},
		{"flush: not allowed", copyOf("rogue", due), flush, keep, topology.Destination{}, nil, "origin queue not allowed by REBOUND_ORIGIN_QUEUES"},
		{"flush: one of rebound's own", copyOf("in", due), flush, keep, topology.Destination{}, nil, "origin is one of rebound's own queues"},
		{"cancel: parked", copyOf("orders", due), cancel, toParking, topology.Direct("parked"), nil, ""},
		{"cancel: parked, allowed or not", copyOf("rogue", due), cancel, toParking, topology.Direct("parked"), nil, ""},
		{"others: their remaining time, rounded up", copyOf("payments", due), flush, redelay,
			r.Topology.Delayed(280 * time.Second), due.UnixMilli(), ""},
		{"others: never past their own queue's delay", copyOf("payments", now.Add(time.Hour)), cancel, redelay,
			r.Topology.Delayed(10 * time.Minute), now.Add(time.Hour).UnixMilli(), ""},
		{"others: no due time, left in place", copyOf("payments", time.Time{}), flush, leave, topology.Destination{}, nil, whyNoDueTime},
		{"others: due, left in place", copyOf("payments", now.Add(-time.Second)), flush, leave, topology.Destination{}, nil, whyDue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := plan(r, q, tc.d, tc.opt, now)
			if st.action != tc.action || st.dest != tc.dest || st.why != tc.why {
				t.Fatalf("plan = action %d to %+v (%q), want %d to %+v (%q)", st.action, st.dest, st.why, tc.action, tc.dest, tc.why)
			}
			if st.action == leave || st.action == keep {
				return
			}
			h := st.msg.Headers
			if h["x-retry-due-at"] != tc.due || h["tenant"] != "acme" || string(st.msg.Body) != "b" || st.msg.MessageId != "m" {
				t.Errorf("copy %+v: want due %v, the rest kept", st.msg, tc.due)
			}
			reason := h["x-retry-parked-reason"]
			if (st.action == toParking) != (reason == "cancelled") {
				t.Errorf("parked reason %v for action %d", reason, st.action)
			}
			if st.action != toParking && h["x-retry-count"] != int64(3) {
				t.Errorf("retry count %v, want 3 as it was", h["x-retry-count"])
			}
		})
	}
}

// TestPlanFollowsTheRoutingKey: a copy goes back where the broker would
// send it, its routing key, whatever its origin header says.
func TestPlanFollowsTheRoutingKey(t *testing.T) {
	r := route.Router{
		Topology: topology.Topology{InboxQueue: "in", DelayExchange: "delay", DelayQueuePrefix: "delay.", ParkingQueue: "parked"},
		Policies: policy.NewSet(policy.Policy{Backoff: policy.Constant, MinDelay: time.Second, MaxDelay: time.Hour, Jitter: policy.NoJitter, MaxRetries: 3}),
		Codec:    headers.NewCodec(headers.DefaultNames()),
	}
	d := amqp.Delivery{RoutingKey: "orders", Headers: amqp.Table{"x-retry-origin-queue": "payments"}}
	st := plan(r, Queue{Delay: time.Minute}, d, Options{Op: Flush, Origins: regexp.MustCompile(`.`)}, time.Now())
	if st.action != toOrigin || st.dest != topology.Direct("orders") {
		t.Errorf("plan = %d to %+v, want straight to orders", st.action, st.dest)
	}
}

// TestLongestCoversWhatTheRateBudgetDefers: the delay queues the commands
// look in reach the largest REBOUND_MAX_DELAY of any policy, and, where a
// policy caps its retry rate, as far as the budget can defer a copy
// (calendar.Horizon and a second, rounded up to the policy's digits): a
// copy deferred there is found by flush and cancel like any other.
func TestLongestCoversWhatTheRateBudgetDefers(t *testing.T) {
	short := policy.Policy{MaxDelay: time.Minute}
	long := policy.Policy{MaxDelay: 2 * time.Hour}
	capped := policy.Policy{MaxDelay: time.Minute, RetryRate: 10}
	named := func(name string, p policy.Policy) policy.Named {
		return policy.Named{Name: name, Queues: regexp.MustCompile(name), Policy: p}
	}
	for _, tc := range []struct {
		name string
		set  policy.Set
		want time.Duration
	}{
		{"the default alone", policy.NewSet(short), time.Minute},
		{"a named policy's longer max delay", policy.NewSet(short, named("slow", long)), 2 * time.Hour},
		{"a rate budget, two digits", policy.NewSet(short, named("capped", capped)), 3_700 * time.Second},
		{"a rate budget, three digits", policy.NewSet(func() policy.Policy { p := capped; p.DelayDigits = 3; return p }()), 3_610 * time.Second},
		{"a max delay past the budget's reach", policy.NewSet(capped, named("slow", long)), 2 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Longest(tc.set); got != tc.want {
				t.Errorf("Longest = %s, want %s", got, tc.want)
			}
		})
	}
}
