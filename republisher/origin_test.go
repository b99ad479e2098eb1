package republisher

import (
	"testing"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/policy"
)

func TestCheckOrigin(t *testing.T) {
	topo := testTopology(false, false)
	ordersOnly := func(q string) bool { return q == "orders" }
	for _, tc := range []struct {
		name    string
		origin  string // State.Origin: the broker's record first
		claimed string // State.ClaimedOrigin: a disagreeing origin header
		allowed func(string) bool
		want    OriginCheck
	}{
		{"allowed", "orders", "", ordersOnly, OriginCheck{Origin: "orders"}},
		{"any allowed", "payments", "", nil, OriginCheck{Origin: "payments"}},
		{"record over a disputing header", "orders", "payments", ordersOnly, OriginCheck{Origin: "orders", Disputed: "payments"}},
		{"not allowed", "payments", "", ordersOnly,
			OriginCheck{Origin: "payments", Refused: policy.OriginNotAllowed, Why: "origin queue not allowed by REBOUND_ORIGIN_QUEUES"}},
		{"unknown", "", "", nil, OriginCheck{Refused: policy.UnknownOrigin, Why: "no origin queue in x-death or the origin headers"}},
		{"the inbox", "in", "", nil, OriginCheck{Origin: "in", Refused: policy.UnknownOrigin, Why: "origin is one of rebound's own queues"}},
		{"the parking queue", "parked", "", nil, OriginCheck{Origin: "parked", Refused: policy.UnknownOrigin, Why: "origin is one of rebound's own queues"}},
		{"a delay queue, no header", "delay.1000", "", nil, OriginCheck{Origin: "delay.1000", Refused: policy.UnknownOrigin, Why: "origin is one of rebound's own queues"}},
		// A retry a consumer republished into the inbox with its headers:
		// the origin rebound wrote on it, not a dispute.
		{"a delay queue's copy, republished", "delay.1000", "orders", ordersOnly, OriginCheck{Origin: "orders"}},
		{"a delay queue's copy, republished to a queue not allowed", "delay.1000", "payments", ordersOnly,
			OriginCheck{Origin: "payments", Refused: policy.OriginNotAllowed, Why: "origin queue not allowed by REBOUND_ORIGIN_QUEUES"}},
		{"a delay queue's copy naming the inbox", "delay.1000", "in", nil,
			OriginCheck{Origin: "in", Refused: policy.UnknownOrigin, Why: "origin is one of rebound's own queues"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := topo.CheckOrigin(headers.State{Origin: tc.origin, ClaimedOrigin: tc.claimed}, tc.allowed)
			if got != tc.want {
				t.Errorf("CheckOrigin = %+v, want %+v", got, tc.want)
			}
		})
	}
}
