package consumer

import (
	"fmt"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// TestMeasureDelayedRetryThroughput prints what it costs that a delayed
// copy comes back through rebound (topology.Topology.Delayed): each
// delayed retry passes rebound twice, once into its delay queue and once
// on to its origin. In one run, on the broker under test (classic queues,
// 256-byte bodies), it measures copies a second of
//
//   - one pass: failures sent straight back (immediate retries), the
//     rebound work a delayed retry cost before;
//   - the broker's hop: copies published as an earlier rebound did, with
//     the origin as routing key, into the delay queue of 1ms, which hands
//     them straight to the origin;
//   - two passes: failures retried after 1ms, back through the inbox, as
//     now.
//
// Before, a delayed retry was the first two stages in a pipeline, as fast
// as the slower of them; the ratio printed is the two passes over that,
// medians of three interleaved rounds.
// Run it with REBOUND_MEASURE=1; it asserts only that every copy arrived.
func TestMeasureDelayedRetryThroughput(t *testing.T) {
	brokertest.Measure(t, "REBOUND_MEASURE")
	const n = 2000
	e := newEnv(t, "classic")
	fast := e.prefix + "fast"
	e.Declare(fast, amqp.Table{"x-dead-letter-exchange": e.vars["REBOUND_DEAD_LETTER_EXCHANGE"]})
	e.start(e.options("REBOUND_MIN_DELAY", "1ms", "REBOUND_MAX_RETRIES", "5", "REBOUND_PREFETCH", "256",
		"REBOUND_POLICIES", "fast", "REBOUND_POLICY_FAST_QUEUES", "fast$", "REBOUND_POLICY_FAST_IMMEDIATE_RETRIES", "1"))
	failures := func(prefix, origin string) []amqp.Publishing {
		out := make([]amqp.Publishing, n)
		for i := range out {
			out[i] = amqp.Publishing{MessageId: fmt.Sprintf("%s%d", prefix, i), DeliveryMode: amqp.Persistent,
				Headers: amqp.Table{names.OriginQueue: origin}, Body: make([]byte, 256)}
		}
		return out
	}
	arrive := func(what, queue string, publish func()) float64 {
		start := time.Now()
		publish()
		got := 0
		if !brokertest.Await(5*time.Minute, func() bool {
			got += len(e.Drain(queue))
			return got >= n
		}) {
			t.Fatalf("%s: %d of %d arrived", what, got, n)
		}
		took := time.Since(start)
		rate := float64(n) / took.Seconds()
		t.Logf("%s: %d copies in %s, %.0f copies/s", what, n, took.Round(time.Millisecond), rate)
		return rate
	}

	delay := time.Millisecond
	e.declareDelayQueue(delay)
	// Three rounds of the three, interleaved, so that the machine's load
	// weighs on each alike; the median of each is compared.
	const rounds = 3
	var onePasses, hops, twoPassesAll []float64
	for r := range rounds {
		onePasses = append(onePasses, arrive("one pass (immediate retries)", fast, func() {
			e.Publish(e.topo.InboxQueue, failures(fmt.Sprintf("i%d.", r), fast)...)
		}))
		hops = append(hops, arrive("the broker's hop (an earlier rebound's copies, delay 1ms)", e.app, func() {
			brokertest.PublishConfirmedVia(t, e.Ch, e.topo.DelayExchangeFor(delay).Name, e.app, failures(fmt.Sprintf("h%d.", r), e.app)...)
		}))
		twoPassesAll = append(twoPassesAll, arrive("two passes (delayed retries, delay 1ms, back through the inbox)", e.app, func() {
			e.Publish(e.topo.InboxQueue, failures(fmt.Sprintf("d%d.", r), e.app)...)
		}))
	}
	median := func(xs []float64) float64 {
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	onePass, hop, twoPasses := median(onePasses), median(hops), median(twoPassesAll)
	before := min(onePass, hop)
	t.Logf("RabbitMQ %s, medians of %d rounds: delayed retries before (the slower of one pass and the broker's hop) %.0f copies/s, after %.0f copies/s: ratio %.2f",
		e.b.Version(), rounds, before, twoPasses, twoPasses/before)
}
