package route

import (
	"regexp"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
)

func TestCheckOrigin(t *testing.T) {
	ordersOnly := regexp.MustCompile(`^orders$`)
	for _, tc := range []struct {
		name    string
		origin  string // State.Origin: the broker's record first
		claimed string // State.ClaimedOrigin: a disagreeing origin header
		allowed *regexp.Regexp
		want    Origin
	}{
		{"allowed", "orders", "", ordersOnly, Origin{Queue: "orders"}},
		{"any allowed", "payments", "", nil, Origin{Queue: "payments"}},
		{"record over a disputing header", "orders", "payments", ordersOnly, Origin{Queue: "orders", Disputed: "payments"}},
		{"not allowed", "payments", "", ordersOnly,
			Origin{Queue: "payments", Refused: policy.OriginNotAllowed, Why: "origin queue not allowed by REBOUND_ORIGIN_QUEUES"}},
		{"unknown", "", "", nil, Origin{Refused: policy.UnknownOrigin, Why: "no origin queue in x-death or the origin headers"}},
		{"the inbox", "in", "", nil, Origin{Queue: "in", Refused: policy.UnknownOrigin, Why: "origin is one of rebound's own queues"}},
		{"the parking queue", "parked", "", nil, Origin{Queue: "parked", Refused: policy.UnknownOrigin, Why: "origin is one of rebound's own queues"}},
		{"a delay queue, no header", "delay.1000", "", nil, Origin{Queue: "delay.1000", Refused: policy.UnknownOrigin, Why: "origin is one of rebound's own queues"}},
		// A retry a consumer republished into the inbox with its headers:
		// the origin rebound wrote on it, not a dispute.
		{"a delay queue's copy, republished", "delay.1000", "orders", ordersOnly, Origin{Queue: "orders"}},
		{"a delay queue's copy, republished to a queue not allowed", "delay.1000", "payments", ordersOnly,
			Origin{Queue: "payments", Refused: policy.OriginNotAllowed, Why: "origin queue not allowed by REBOUND_ORIGIN_QUEUES"}},
		{"a delay queue's copy naming the inbox", "delay.1000", "in", nil,
			Origin{Queue: "in", Refused: policy.UnknownOrigin, Why: "origin is one of rebound's own queues"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := testRouter(tc.allowed).CheckOrigin(tc.origin, tc.claimed)
			if got != tc.want {
				t.Errorf("CheckOrigin = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// testRouter is a router of the default names (inbox "in", parking queue
// "parked", delay queues "delay.<ms>"), the default policy only, and the
// allowlist allowed (nil: any queue).
func testRouter(allowed *regexp.Regexp) Router {
	return Router{
		Topology: topology.Topology{
			InboxQueue: "in", DeadLetterExchange: "dlx", DelayExchange: "delay",
			DelayQueuePrefix: "delay.", ParkingQueue: "parked", OriginQueues: allowed,
		},
		Policies: policy.NewSet(policy.Policy{
			Backoff: policy.Constant, MinDelay: time.Second, MaxDelay: time.Second, Jitter: policy.NoJitter,
			MaxRetries: 3, Deadline: "clamp",
		}),
		Codec: headers.NewCodec(headers.DefaultNames()),
	}
}
