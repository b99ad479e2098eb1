package topology

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func testTopology(quorum, deliveryLimits bool) Topology {
	return Topology{
		InboxQueue: "in", DeadLetterExchange: "dlx", DelayExchange: "delay",
		DelayQueuePrefix: "delay.", ParkingQueue: "parked", Quorum: quorum, DeliveryLimits: deliveryLimits,
	}
}

func TestDelayQueueAndExchange(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		topo := testTopology(quorum, false)
		q, b := topo.DelayQueue(1500 * time.Millisecond)
		if q.Name != "delay.1500" || b.Queue != q.Name || b.Exchange != "delay.1500" || b.Key != "" || b.Args != nil {
			t.Errorf("quorum=%v: queue %+v binding %+v", quorum, q, b)
		}
		want := amqp.Table{"x-message-ttl": int64(1500), "x-dead-letter-exchange": ""}
		if quorum {
			want["x-queue-type"] = "quorum"
			want["x-dead-letter-strategy"] = "at-least-once"
			want["x-overflow"] = "reject-publish"
		}
		if got, _ := json.Marshal(q.Args); string(got) != mustJSON(t, want) {
			t.Errorf("quorum=%v: delay queue arguments %s, want %s", quorum, got, mustJSON(t, want))
		}
		if x := topo.DelayExchangeFor(1500 * time.Millisecond); x != (Exchange{Name: "delay.1500", Kind: "fanout"}) {
			t.Errorf("DelayExchangeFor = %+v", x)
		}
		if d := topo.Delayed(1500 * time.Millisecond); d != (Destination{Exchange: "delay.1500", RoutingKey: topo.InboxQueue, Delay: 1500 * time.Millisecond}) {
			t.Errorf("Delayed = %+v", d)
		}
	}
	topo := testTopology(false, false)
	for name, want := range map[string]int64{"delay.1500": 1500, "delay.": 0, "delay.15x": 0, "delay": 0, "delay.0": 0, "other.1500": 0, "delayx1500": 0} {
		ms, ok := topo.DelayOfExchange(name)
		if ms != want || ok != (want > 0) {
			t.Errorf("DelayOfExchange(%q) = %d, %v; want %d", name, ms, ok, want)
		}
	}
}

func TestFixedQueues(t *testing.T) {
	for _, tc := range []struct {
		quorum, limits bool
		inbox, parked  string
	}{
		{false, false, `{}`, `{}`},
		{false, true, `{}`, `{}`},
		{true, false,
			`{"x-dead-letter-exchange":"","x-dead-letter-routing-key":"parked","x-dead-letter-strategy":"at-least-once","x-overflow":"reject-publish","x-queue-type":"quorum"}`,
			`{"x-queue-type":"quorum"}`},
		{true, true,
			`{"x-dead-letter-exchange":"","x-dead-letter-routing-key":"parked","x-dead-letter-strategy":"at-least-once","x-overflow":"reject-publish","x-queue-type":"quorum"}`,
			`{"x-delivery-limit":-1,"x-queue-type":"quorum"}`},
	} {
		qs := testTopology(tc.quorum, tc.limits).Queues()
		if qs[0].Name != "in" || mustJSON(t, qs[0].Args) != tc.inbox || qs[1].Name != "parked" || mustJSON(t, qs[1].Args) != tc.parked {
			t.Errorf("quorum=%v limits=%v: %s %s, %s %s; want %s, %s", tc.quorum, tc.limits,
				qs[0].Name, mustJSON(t, qs[0].Args), qs[1].Name, mustJSON(t, qs[1].Args), tc.inbox, tc.parked)
		}
	}
}

func TestForServer(t *testing.T) {
	for version, want := range map[string]bool{"3.10.8": false, "3.13.7": false, "4.0.5": true, "4.3.6": true, "10.0.0": true, "": false, "x.y": false} {
		if got := testTopology(true, false).ForServer(amqp.Table{"version": version}).DeliveryLimits; got != want {
			t.Errorf("version %q: DeliveryLimits %v, want %v", version, got, want)
		}
	}
}

func TestOwns(t *testing.T) {
	topo := testTopology(false, false)
	for queue, want := range map[string]bool{
		"in": true, "parked": true, "delay.1500": true, "delay.1": true, "delay.in-use": true, "delay.lock": true,
		"delay.replica.0": true, "delay.replica.12": true, "delay.replica.": false, "delay.replica.x": false,
		"delay.": false, "delay.15x": false, "delay.-1": false, "orders": false, "in.x": false, "xdelay.15": false,
	} {
		if got := topo.Owns(queue); got != want {
			t.Errorf("Owns(%q) = %v, want %v", queue, got, want)
		}
	}
}

func TestTopologyDefinitions(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		topo := testTopology(quorum, true)
		defs := topo.Definitions("v1")
		defs.Policies = append(defs.Policies, topo.DeadLetterPolicy("v1", "rebound-dead-letter", `^app\.`))
		defs.Policies = append(defs.Policies, topo.Policies("v1")...)
		b, err := json.Marshal(defs)
		if err != nil {
			t.Fatal(err)
		}
		// Decode generically: this is the shape RabbitMQ reads.
		var doc map[string][]map[string]any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		names := func(key, field string) map[string]map[string]any {
			out := map[string]map[string]any{}
			for _, e := range doc[key] {
				if e["vhost"] != "v1" {
					t.Errorf("%s %v: vhost %v, want v1", key, e[field], e["vhost"])
				}
				out[e[field].(string)] = e
			}
			return out
		}
		xs := names("exchanges", "name")
		if xs["dlx"]["type"] != "fanout" || xs["dlx"]["durable"] != true || len(xs) != 1 {
			t.Errorf("exchanges: %v", doc["exchanges"])
		}
		qs := names("queues", "name")
		if len(qs) != 3 || qs["in"] == nil || qs["parked"] == nil || qs["delay.in-use"] == nil {
			t.Fatalf("queues: %v", doc["queues"])
		}
		for name, q := range qs {
			args := q["arguments"].(map[string]any)
			// The leases' queue is classic whatever the type of the others.
			if q["durable"] != true || (args["x-queue-type"] == "quorum") != (quorum && name != "delay.in-use") {
				t.Errorf("quorum=%v queue %s: %v", quorum, name, q)
			}
		}
		if bs := names("bindings", "destination"); bs["in"]["source"] != "dlx" || len(bs) != 1 {
			t.Errorf("bindings: %v", doc["bindings"])
		}
		ps := names("policies", "name")
		p := ps["rebound-dead-letter"]
		if p["apply-to"] != "queues" || p["pattern"] != `^app\.` || p["definition"].(map[string]any)["dead-letter-exchange"] != "dlx" || p["priority"] != 10.0 {
			t.Errorf("policy: %v", p)
		}
		if !quorum {
			lazy := ps[lazyDelayQueuePolicyName]
			if lazy["apply-to"] != "queues" || lazy["definition"].(map[string]any)["queue-mode"] != "lazy" || lazy["priority"] != 10.0 || len(ps) != 2 {
				t.Errorf("classic policies: %v", ps)
			}
			pattern := regexp.MustCompile(lazy["pattern"].(string))
			for name, want := range map[string]bool{"delay.1500": true, "delay.3600000": true, "delay.": false, "delay.15x": false,
				"delayx1500": false, "in": false, "parked": false, "app.delay.1500": false} {
				if got := pattern.MatchString(name); got != want {
					t.Errorf("lazy policy pattern %s matches %q: %v, want %v", pattern, name, got, want)
				}
			}
			continue
		}
		inbox, parked := ps[inboxDeadLetterPolicyName], ps[parkingNoDeliveryLimitPolicyName]
		if inbox["pattern"] != `^in$` || mustJSON(t, inbox["definition"]) !=
			`{"dead-letter-exchange":"","dead-letter-routing-key":"parked","dead-letter-strategy":"at-least-once","overflow":"reject-publish"}` {
			t.Errorf("inbox policy: %v", inbox)
		}
		if parked["pattern"] != `^parked$` || mustJSON(t, parked["definition"]) != `{"delivery-limit":-1}` || len(ps) != 3 {
			t.Errorf("parking policy: %v (policies %v)", parked, ps)
		}
	}
	// RabbitMQ 3.x refuses a delivery limit of -1 in a policy.
	for _, p := range testTopology(true, false).Policies("v1") {
		if p.Name == parkingNoDeliveryLimitPolicyName {
			t.Errorf("the parking policy is for RabbitMQ 4.0 and later only: %+v", p)
		}
	}
}

func TestTopologyDefinitionsEmptyListsAreArrays(t *testing.T) {
	// RabbitMQ wants lists, not nulls, for sections with nothing in them.
	b, err := json.Marshal(Topology{}.Definitions("/"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if string(doc["policies"]) != "[]" {
		t.Errorf("policies = %s, want []", doc["policies"])
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAllowsAndDirect: the allowlist, when set, decides which queues
// rebound may send to; a direct destination is the default exchange with
// the queue as routing key.
func TestAllowsAndDirect(t *testing.T) {
	open := Topology{}
	allowlisted := Topology{OriginQueues: regexp.MustCompile(`^orders\.`)}
	for _, tc := range []struct {
		topo  Topology
		queue string
		want  bool
	}{
		{open, "anything", true},
		{allowlisted, "orders.created", true},
		{allowlisted, "payments.capture", false},
	} {
		if got := tc.topo.Allows(tc.queue); got != tc.want {
			t.Errorf("Allows(%q) with %v = %v, want %v", tc.queue, tc.topo.OriginQueues, got, tc.want)
		}
	}
	if dest := Direct("orders.created"); dest.RoutingKey != "orders.created" || dest.Exchange != "" {
		t.Errorf("Direct: %+v, want the default exchange with the queue as routing key", dest)
	}
}

// TestWithoutAdded: a fixed queue as an earlier rebound declared it is
// the queue without the arguments added since, which are named with the
// policy that applies them; a queue with none of them is unchanged, and
// the original is untouched.
func TestWithoutAdded(t *testing.T) {
	topo := testTopology(true, true)
	inbox, parking := topo.Queues()[0], topo.Queues()[1]
	legacy, missing, policy := topo.WithoutAdded(inbox)
	want := []string{"x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy", amqp.QueueOverflowArg}
	if !slices.Equal(missing, want) || policy != "rebound-inbox-dead-letter" {
		t.Errorf("missing %q by policy %s, want %q by rebound-inbox-dead-letter", missing, policy, want)
	}
	if len(legacy.Args) != 1 || legacy.Args[amqp.QueueTypeArg] != amqp.QueueTypeQuorum || len(inbox.Args) != 5 {
		t.Errorf("legacy args %v (inbox's now %v), want only the queue type", legacy.Args, inbox.Args)
	}
	if _, missing, policy := topo.WithoutAdded(parking); !slices.Equal(missing, []string{"x-delivery-limit"}) || policy != "rebound-parked-no-delivery-limit" {
		t.Errorf("parking queue: missing %q by policy %s, want x-delivery-limit by rebound-parked-no-delivery-limit", missing, policy)
	}
	classic := testTopology(false, false)
	if legacy, missing, _ := classic.WithoutAdded(classic.Queues()[0]); len(missing) != 0 || len(legacy.Args) != 0 {
		t.Errorf("a classic inbox: %v, %q; want unchanged", legacy.Args, missing)
	}
}

// TestHoldTopology: hold mode adds the hold queue (quorum, delayed retry,
// dead-lettering home at least once, no delivery limit), its fanout
// exchange and binding, and the commands stream; rebound owns them, and
// the probe queues, none of which is ever an origin; queues mode adds
// none of them.
func TestHoldTopology(t *testing.T) {
	topo := Topology{InboxQueue: "rebound.inbox", DeadLetterExchange: "rebound.dlx", DelayExchange: "rebound.delay",
		DelayQueuePrefix: "rebound.delay.", ParkingQueue: "rebound.parked"}
	if slices.ContainsFunc(topo.Queues(), func(q Queue) bool { return q.Name == "rebound.delay.hold" }) {
		t.Error("queues mode declares the hold queue")
	}
	topo.Hold = true
	hold := topo.HoldQueue()
	if hold.Name != "rebound.delay.hold" || hold.Args["x-queue-type"] != "quorum" || hold.Args["x-delayed-retry-type"] != "returned" ||
		hold.Args["x-delivery-limit"] != int64(-1) || hold.Args["x-dead-letter-exchange"] != "" || hold.Args["x-dead-letter-strategy"] != "at-least-once" {
		t.Errorf("hold queue %+v", hold)
	}
	described := strings.Join(topo.Describe(), "\n")
	for _, want := range []string{"exchange rebound.delay.hold (fanout", "queue rebound.delay.hold (durable", "queue rebound.delay.hold.commands (durable",
		"binding rebound.delay.hold -> rebound.delay.hold"} {
		if !strings.Contains(described, want) {
			t.Errorf("Describe lacks %q:\n%s", want, described)
		}
	}
	for _, q := range []string{"rebound.delay.hold", "rebound.delay.hold.commands", "rebound.delay.hold.probe.0a1b2c3d"} {
		if !topo.Owns(q) {
			t.Errorf("rebound does not own %s", q)
		}
	}
	if topo.Owns("rebound.delay.holder") {
		t.Error("rebound owns rebound.delay.holder, an application's name")
	}
}

// TestHoldParksThroughItsOwnExchange: in hold mode parks go through a
// fanout exchange named as the parking queue and bound to it alone, so
// that rebound's user needs no write on the default exchange; queues
// mode parks through the default exchange and declares no such exchange.
func TestHoldParksThroughItsOwnExchange(t *testing.T) {
	topo := Topology{InboxQueue: "rebound.inbox", DeadLetterExchange: "rebound.dlx", DelayExchange: "rebound.delay",
		DelayQueuePrefix: "rebound.delay.", ParkingQueue: "rebound.parked"}
	if got := topo.Parked(); got != (Destination{RoutingKey: "rebound.parked"}) {
		t.Errorf("queues mode parks to %+v, want the default exchange", got)
	}
	if len(topo.Exchanges()) != 1 || len(topo.Bindings()) != 1 {
		t.Errorf("queues mode declares %v and %v, want the dead-letter exchange and its binding alone", topo.Exchanges(), topo.Bindings())
	}
	topo.Hold = true
	if got := topo.Parked(); got != (Destination{Exchange: "rebound.parked", RoutingKey: "rebound.parked"}) {
		t.Errorf("hold mode parks to %+v, want the parking exchange", got)
	}
	if !slices.Contains(topo.Exchanges(), Exchange{Name: "rebound.parked", Kind: amqp.ExchangeFanout}) {
		t.Errorf("hold mode's exchanges %v lack the parking exchange", topo.Exchanges())
	}
	var bound []string
	for _, b := range topo.Bindings() {
		if b.Exchange == "rebound.parked" {
			bound = append(bound, b.Queue)
		}
	}
	if !slices.Equal(bound, []string{"rebound.parked"}) {
		t.Errorf("the parking exchange is bound to %q, want the parking queue alone", bound)
	}
}
