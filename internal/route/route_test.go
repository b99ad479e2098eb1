package route

import (
	"maps"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/calendar"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
)

func TestPlan(t *testing.T) {
	r := testRouter(nil)
	topo, codec := r.Topology, r.Codec
	n := codec.Names
	label := r.Policies.Default().Label()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	started := now.Add(-time.Hour)
	died := now.Add(-time.Second)

	// failed is a message as the inbox delivers it after the orders queue
	// rejected it once more: it has been retried twice, the last time
	// through the 2s delay queue, and it carries every routing header and
	// dead-letter header a producer, an earlier rebound or the broker may
	// have put on it.
	failed := func() amqp.Delivery {
		return amqp.Delivery{
			Headers: amqp.Table{
				"tenant":              "acme",
				n.Error:               "timeout",
				n.RetryCount:          int64(2),
				n.TaskStartedAt:       started.UnixMilli(),
				n.LastDelay:           int64(2000),
				n.OriginQueue:         "orders",
				"CC":                  []any{"billing"},
				"BCC":                 []any{"audit"},
				"rebound-delay-ms":    int64(2000),
				"x-first-death-queue": "orders", "x-first-death-reason": "rejected", "x-first-death-exchange": "",
				"x-last-death-queue": "orders", "x-last-death-reason": "rejected", "x-last-death-exchange": "",
				headers.XDeath: []any{
					amqp.Table{"queue": "orders", "reason": "rejected", "count": int64(3), "exchange": "", "routing-keys": []any{"orders"}, "time": died},
					amqp.Table{"queue": "rebound.delay.2000", "reason": "expired", "count": int64(1), "exchange": "rebound.delay.2000",
						"routing-keys": []any{"orders"}, "time": died.Add(-2 * time.Second)},
				},
			},
			ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: amqp.Persistent, Priority: 4,
			CorrelationId: "c-1", ReplyTo: "replies", Expiration: "60000", MessageId: "m-1", Timestamp: started,
			Type: "order.created", UserId: "orders-service", AppId: "orders", Body: []byte(`{"id":1}`),
		}
	}
	// leftover is failed with the parked headers a producer copied from a
	// parked message.
	leftover := func() amqp.Delivery {
		d := failed()
		d.Headers[n.ParkedReason] = "max-retries"
		d.Headers[n.ParkedAt] = started.UnixMilli()
		return d
	}
	// bare is a message published straight into the inbox with no header
	// and no property.
	bare := func() amqp.Delivery { return amqp.Delivery{MessageId: "m-2", Body: []byte("?")} }

	for _, tc := range []struct {
		name     string
		d        amqp.Delivery
		decision policy.Decision
		dest     topology.Destination
		headers  map[string]any // expected values; nil: absent
	}{
		{
			name: "park after max retries", d: failed(), decision: policy.Decision{Reason: policy.MaxRetries},
			dest: topology.Direct(topo.ParkingQueue),
			headers: map[string]any{
				n.ParkedReason: "max-retries", n.ParkedAt: now.UnixMilli(), n.RetryCount: int64(2),
				n.TaskStartedAt: started.UnixMilli(), n.LastDelay: int64(2000), n.OriginQueue: "orders",
				n.FirstDeathReason: "rejected", n.FirstDeathQueue: "orders", n.Policy: label, n.DueAt: nil,
			},
		},
		{
			name: "park with no origin", d: bare(), decision: policy.Decision{Reason: policy.UnknownOrigin},
			dest: topology.Direct(topo.ParkingQueue),
			headers: map[string]any{
				n.ParkedReason: "unknown-origin", n.ParkedAt: now.UnixMilli(), n.RetryCount: int64(0),
				n.TaskStartedAt: now.UnixMilli(), n.OriginQueue: nil, n.LastDelay: nil,
				n.FirstDeathReason: nil, n.FirstDeathQueue: nil, n.Policy: label,
			},
		},
		{
			name: "retry at once", d: failed(), decision: policy.Decision{Retry: true},
			dest: topology.Direct("orders"),
			headers: map[string]any{
				n.RetryCount: int64(3), n.LastDelay: int64(0), n.TaskStartedAt: started.UnixMilli(), n.OriginQueue: "orders",
				n.FirstDeathReason: "rejected", n.FirstDeathQueue: "orders", n.ParkedReason: nil, n.ParkedAt: nil,
				n.Policy: label, n.DueAt: nil,
			},
		},
		{
			// The delay queue holds the rounded delay; the header carries the
			// delay as drawn, which decorrelated jitter grows the next from.
			name: "retry after a delay", d: failed(), decision: policy.Decision{Retry: true, Delay: 1500 * time.Millisecond, Drawn: 1534 * time.Millisecond},
			dest: topo.Delayed(1500 * time.Millisecond),
			headers: map[string]any{
				n.RetryCount: int64(3), n.LastDelay: int64(1534), n.TaskStartedAt: started.UnixMilli(), n.OriginQueue: "orders",
				n.FirstDeathReason: "rejected", n.FirstDeathQueue: "orders", n.ParkedReason: nil, n.ParkedAt: nil,
				n.Policy: label, n.DueAt: now.Add(1500 * time.Millisecond).UnixMilli(),
			},
		},
		{
			name: "retry drops parked headers", d: leftover(), decision: policy.Decision{Retry: true, Delay: 1500 * time.Millisecond},
			dest: topo.Delayed(1500 * time.Millisecond),
			headers: map[string]any{
				n.RetryCount: int64(3), n.ParkedReason: nil, n.ParkedAt: nil,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			original := maps.Clone(tc.d.Headers)
			state, _ := codec.Decode(tc.d.Headers, tc.d.Timestamp, now, nil)
			rt := Route{Origin: r.CheckOrigin(state.Origin, state.ClaimedOrigin), Policy: r.Policies.Default(), Decision: tc.decision}
			dest, msg := r.Plan(tc.d, state, rt, now)

			if dest != tc.dest {
				t.Errorf("destination %+v, want %+v", dest, tc.dest)
			}
			for name, want := range tc.headers {
				got, ok := msg.Headers[name]
				switch {
				case want == nil && ok:
					t.Errorf("header %s = %#v, want absent", name, got)
				case want != nil && !reflect.DeepEqual(got, want):
					t.Errorf("header %s = %#v, want %#v", name, got, want)
				}
			}
			// Never carried: routing headers (a copy is routed by its
			// destination alone) and the broker's dead-letter headers.
			for _, name := range []string{"CC", "BCC", "rebound-delay-ms", headers.XDeath, "x-first-death-queue", "x-first-death-reason",
				"x-first-death-exchange", "x-last-death-queue", "x-last-death-reason", "x-last-death-exchange"} {
				if v, ok := msg.Headers[name]; ok {
					t.Errorf("header %s = %#v, want it stripped", name, v)
				}
			}
			// Application headers are kept.
			for name, v := range tc.d.Headers {
				if name == "tenant" || name == n.Error {
					if !reflect.DeepEqual(msg.Headers[name], v) {
						t.Errorf("application header %s = %#v, want %#v kept", name, msg.Headers[name], v)
					}
				}
			}
			if err := msg.Headers.Validate(); err != nil {
				t.Errorf("headers do not validate as an AMQP table: %v", err)
			}
			// Properties are kept, but expiration and user id.
			want := amqp.Publishing{
				ContentType: tc.d.ContentType, ContentEncoding: tc.d.ContentEncoding, DeliveryMode: tc.d.DeliveryMode,
				Priority: tc.d.Priority, CorrelationId: tc.d.CorrelationId, ReplyTo: tc.d.ReplyTo, MessageId: tc.d.MessageId,
				Timestamp: tc.d.Timestamp, Type: tc.d.Type, AppId: tc.d.AppId, Body: tc.d.Body,
			}
			got := msg
			got.Headers = nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("properties\n got %+v\nwant %+v", got, want)
			}
			// The delivery's own table is left as it was.
			if !reflect.DeepEqual(tc.d.Headers, original) {
				t.Errorf("Plan changed the delivery's headers:\n got %#v\nwant %#v", tc.d.Headers, original)
			}
		})
	}
}

// TestPlanHold: in hold mode a retry, at once or after a delay, and a
// copy a delay queue sent back (after a switch from queues mode) go to
// the hold exchange with their origin as routing key and their due time
// (now for one at once); a parked message goes through the parking
// queue's own exchange: nothing through the default exchange. The hold
// queue's delivery time left on a message by the broker is dropped.
func TestPlanHold(t *testing.T) {
	r := testRouter(nil)
	r.Topology.Hold = true
	n := r.Codec.Names
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	d := amqp.Delivery{MessageId: "m", Headers: amqp.Table{
		headers.XOptDeliveryTime: now.Add(-time.Minute).UnixMilli(), "tenant": "acme",
		headers.XDeath: []any{amqp.Table{"queue": "orders", "reason": "rejected", "count": int64(1), "exchange": "", "routing-keys": []any{"orders"}}},
	}}
	for _, tc := range []struct {
		name      string
		decision  policy.Decision
		returning bool
		dest      topology.Destination
		due       any
	}{
		{"retry at once", policy.Decision{Retry: true}, false, r.Topology.Held("orders"), now.UnixMilli()},
		{"retry after a delay", policy.Decision{Retry: true, Delay: 90 * time.Second, Drawn: 90 * time.Second}, false, r.Topology.Held("orders"), now.Add(90 * time.Second).UnixMilli()},
		{"returning from a delay queue", policy.Decision{Retry: true}, true, r.Topology.Held("orders"), now.UnixMilli()},
		{"park", policy.Decision{Reason: policy.MaxRetries}, false, topology.Destination{Exchange: r.Topology.ParkingQueue, RoutingKey: r.Topology.ParkingQueue}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, _ := r.Codec.Decode(d.Headers, d.Timestamp, now, nil)
			rt := Route{Origin: r.CheckOrigin(state.Origin, state.ClaimedOrigin), Policy: r.Policies.Default(), Decision: tc.decision, Returning: tc.returning}
			dest, msg := r.Plan(d, state, rt, now)
			if dest != tc.dest {
				t.Errorf("destination %+v, want %+v", dest, tc.dest)
			}
			if got := msg.Headers[n.DueAt]; !reflect.DeepEqual(got, tc.due) {
				t.Errorf("due at %#v, want %#v", got, tc.due)
			}
			if v, ok := msg.Headers[headers.XOptDeliveryTime]; ok {
				t.Errorf("the copy carries %s = %v", headers.XOptDeliveryTime, v)
			}
			if msg.Headers["tenant"] != "acme" {
				t.Errorf("application header lost: %v", msg.Headers)
			}
		})
	}
	if dest := r.Topology.Held("orders"); dest.Exchange != r.Topology.DelayExchange+".hold" || dest.Delay != 0 {
		t.Errorf("Held: %+v, want the hold exchange and no delay queue", dest)
	}
}

func TestDecide(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	constant := func(d time.Duration, retries int) policy.Policy {
		return policy.Policy{Backoff: policy.Constant, MinDelay: d, MaxDelay: d, Jitter: policy.NoJitter, MaxRetries: retries, Deadline: "clamp"}
	}
	r := testRouter(regexp.MustCompile(`^(orders|payments|mail)\.`))
	r.Policies = policy.NewSet(constant(time.Second, 3),
		policy.Named{Name: "payments", Queues: regexp.MustCompile(`^payments\.`), Policy: constant(time.Minute, 20)},
		policy.Named{Name: "mail", Queues: regexp.MustCompile(`^mail\.`), Policy: constant(time.Hour, 50)},
		// Never chosen for mail.*: the first match decides.
		policy.Named{Name: "everything", Queues: regexp.MustCompile(`.`), Policy: constant(2*time.Second, 1)},
	)
	payments, _ := r.Policies.Lookup("payments")
	everything, _ := r.Policies.Lookup("everything")
	for _, tc := range []struct {
		name     string
		origin   string // the broker's record
		retries  int
		label    string // the message's policy header
		exists   bool
		policy   string
		decision policy.Decision
		why      string
		conflict bool
	}{
		{name: "a named policy", origin: "payments.capture", exists: true, policy: "payments",
			decision: policy.Decision{Retry: true, Delay: time.Minute, Drawn: time.Minute}},
		{name: "its own budget", origin: "payments.capture", retries: 19, exists: true, policy: "payments",
			decision: policy.Decision{Retry: true, Delay: time.Minute, Drawn: time.Minute}},
		{name: "spent", origin: "payments.capture", retries: 20, exists: true, policy: "payments",
			decision: policy.Decision{Reason: policy.MaxRetries}},
		{name: "first match wins", origin: "mail.send", exists: true, policy: "mail",
			decision: policy.Decision{Retry: true, Delay: time.Hour, Drawn: time.Hour}},
		{name: "a catch-all before the default", origin: "orders.created", exists: true, policy: "everything",
			decision: policy.Decision{Retry: true, Delay: 2 * time.Second, Drawn: 2 * time.Second}},
		{name: "unknown origin: the default policy, parked", origin: "", exists: true, policy: "default",
			decision: policy.Decision{Reason: policy.UnknownOrigin}, why: "no origin queue in x-death or the origin headers"},
		{name: "not allowed: parked under its origin's policy", origin: "payroll.run", exists: true, policy: "everything",
			decision: policy.Decision{Reason: policy.OriginNotAllowed}, why: "origin queue not allowed by REBOUND_ORIGIN_QUEUES"},
		{name: "gone: parked", origin: "payments.capture", exists: false, policy: "payments",
			decision: policy.Decision{Reason: policy.UnknownOrigin}, why: "origin queue does not exist"},
		{name: "agreeing label", origin: "payments.capture", label: payments.Label(), exists: true, policy: "payments",
			decision: policy.Decision{Retry: true, Delay: time.Minute, Drawn: time.Minute}},
		{name: "the chosen policy configured otherwise elsewhere", origin: "payments.capture", label: "payments:00000000", exists: true,
			policy: "payments", decision: policy.Decision{Retry: true, Delay: time.Minute, Drawn: time.Minute}, conflict: true},
		{name: "a policy this replica lacks", origin: "payments.capture", label: "refunds:1234abcd", exists: true,
			policy: "payments", decision: policy.Decision{Retry: true, Delay: time.Minute, Drawn: time.Minute}, conflict: true},
		{name: "another policy of this replica's", origin: "orders.created", label: payments.Label(), exists: true,
			policy: "everything", decision: policy.Decision{Retry: true, Delay: 2 * time.Second, Drawn: 2 * time.Second}, conflict: true},
		{name: "a forged label decides nothing", origin: "orders.created", label: strings.Repeat("x", 255), exists: true,
			policy: "everything", decision: policy.Decision{Retry: true, Delay: 2 * time.Second, Drawn: 2 * time.Second}, conflict: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := headers.State{State: policy.State{Retries: tc.retries, StartedAt: now}, Origin: tc.origin, Policy: tc.label}
			o := r.CheckOrigin(s.Origin, s.ClaimedOrigin)
			rt := r.Decide(s, o, tc.exists, now, nil)
			if rt.Policy.Name != tc.policy || rt.Decision != tc.decision || rt.Why != tc.why || (rt.Conflict != "") != tc.conflict {
				t.Errorf("Decide = policy %s, %+v, why %q, conflict %q; want %s, %+v, %q, conflict %v",
					rt.Policy.Name, rt.Decision, rt.Why, rt.Conflict, tc.policy, tc.decision, tc.why, tc.conflict)
			}
		})
	}
	if everything.Label() == payments.Label() {
		t.Errorf("two policies with other parameters share the label %s", payments.Label())
	}
}

// TestBudgetIsWhatPlanPublishes: under a retry rate of one copy a second,
// three retries decided in the same second come due one a second, and
// the copy Plan returns goes through the delay queue the budget chose and
// says so in its due time; a park passes the budget as it is.
func TestBudgetIsWhatPlanPublishes(t *testing.T) {
	r := testRouter(nil)
	p := r.Policies.Default()
	p.RetryRate = 1
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	cal := calendar.New()
	sh := calendar.Share{Replicas: 1}
	st := headers.State{State: policy.State{StartedAt: now}}
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second} {
		rt := Route{Origin: Origin{Queue: "orders"}, Policy: p, Decision: policy.Decision{Retry: true, Delay: time.Second, Drawn: time.Second}}
		rt = r.Budget(rt, st, now, cal, sh)
		if rt.Decision.Delay != want || rt.Added != want-time.Second || (rt.Budget == calendar.Deferred) != (i > 0) {
			t.Fatalf("retry %d: delay %v, added %v, %v; want %v", i, rt.Decision.Delay, rt.Added, rt.Budget, want)
		}
		dest, msg := r.Plan(amqp.Delivery{}, st, rt, now)
		wantDest := r.Topology.Delayed(want)
		if dest != wantDest {
			t.Errorf("retry %d: planned to %+v, want %+v", i, dest, wantDest)
		}
		if due := msg.Headers[r.Codec.Names.DueAt]; due != now.Add(want).UnixMilli() {
			t.Errorf("retry %d: due at %v, want %v", i, due, now.Add(want).UnixMilli())
		}
	}
	park := Route{Origin: Origin{Queue: "orders"}, Policy: p, Decision: policy.Decision{Reason: policy.MaxRetries}}
	if got := r.Budget(park, st, now, cal, sh); !reflect.DeepEqual(got, park) {
		t.Errorf("a park through the budget: %+v, want it as it was", got)
	}
}
