package republisher

import (
	"encoding/json"
	"regexp"
	"testing"
	"time"
)

func TestTopologyDefinitions(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		topo := Topology{
			InboxQueue: "in", DeadLetterExchange: "dlx", DelayExchange: "delay",
			DelayQueuePrefix: "delay.", ParkingQueue: "parked", Quorum: quorum,
		}
		defs := topo.Definitions("v1", 1500*time.Millisecond)
		defs.Policies = append(defs.Policies, topo.DeadLetterPolicy("v1", "rebound-dead-letter", `^app\.`),
			topo.LazyDelayQueuePolicy("v1", "rebound-delay-queues-lazy"))
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
		if xs["dlx"]["type"] != "fanout" || xs["delay"]["type"] != "headers" || xs["dlx"]["durable"] != true {
			t.Errorf("exchanges: %v", doc["exchanges"])
		}
		qs := names("queues", "name")
		if len(qs) != 3 || qs["in"] == nil || qs["parked"] == nil || qs["delay.1500"] == nil {
			t.Fatalf("queues: %v", doc["queues"])
		}
		for name, q := range qs {
			args := q["arguments"].(map[string]any)
			if q["durable"] != true || (args["x-queue-type"] == "quorum") != quorum {
				t.Errorf("quorum=%v queue %s: %v", quorum, name, q)
			}
		}
		delayArgs := qs["delay.1500"]["arguments"].(map[string]any)
		if delayArgs["x-message-ttl"] != 1500.0 || delayArgs["x-dead-letter-exchange"] != "" {
			t.Errorf("delay queue arguments: %v", delayArgs)
		}
		bs := names("bindings", "destination")
		if bs["in"]["source"] != "dlx" || bs["delay.1500"]["source"] != "delay" ||
			bs["delay.1500"]["arguments"].(map[string]any)[DelayRouteHeader] != 1500.0 {
			t.Errorf("bindings: %v", doc["bindings"])
		}
		ps := names("policies", "name")
		p := ps["rebound-dead-letter"]
		if p["apply-to"] != "queues" || p["pattern"] != `^app\.` || p["definition"].(map[string]any)["dead-letter-exchange"] != "dlx" {
			t.Errorf("policy: %v", p)
		}
		lazy := ps["rebound-delay-queues-lazy"]
		if p["priority"] != 10.0 || lazy["priority"] != 10.0 {
			t.Errorf("policy priorities %v and %v, want 10 as deploy/rabbitmq/setup.sh sets them", p["priority"], lazy["priority"])
		}
		if lazy["apply-to"] != "queues" || lazy["definition"].(map[string]any)["queue-mode"] != "lazy" {
			t.Errorf("lazy delay queue policy: %v", lazy)
		}
		pattern := regexp.MustCompile(lazy["pattern"].(string))
		for name, want := range map[string]bool{"delay.1500": true, "delay.3600000": true, "delay.": false, "delay.15x": false,
			"delayx1500": false, "in": false, "parked": false, "app.delay.1500": false} {
			if got := pattern.MatchString(name); got != want {
				t.Errorf("lazy policy pattern %s matches %q: %v, want %v", pattern, name, got, want)
			}
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
