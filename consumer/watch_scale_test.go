package consumer

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// TestWatchCostAtScale measures what N replicas of one vhost cost the
// broker in checks: the declarations of the watcher (inbox, parking
// queue, delay queues, places among the replicas), counted by
// rebound_broker_calls_total,
// over a window after each replica has used its share of some hundred
// delay queues. It runs only with REBOUND_MEASURE_WATCH=1 (about six
// minutes: 1, 5, 10 and 50 replicas, and 5 and 50 under a retry rate),
// prints a table, and fails when 50 replicas make more than twice the
// checks of 5.
//
//	REBOUND_MEASURE_WATCH=1 REBOUND_TEST_BROKER=4.3 go test -run WatchCostAtScale -v ./consumer/
func TestWatchCostAtScale(t *testing.T) {
	brokertest.Measure(t, "REBOUND_MEASURE_WATCH")
	window := brokertest.MeasureWindow("REBOUND_MEASURE_WINDOW", 45*time.Second)
	type row struct {
		n                  int
		rate               bool
		checks, all        float64 // calls a second
		series, delayQueue int
	}
	var rows []row
	byN := map[string]float64{}
	for _, tc := range []struct {
		n    int
		rate bool
	}{{1, false}, {5, false}, {10, false}, {50, false}, {5, true}, {50, true}} {
		t.Run(fmt.Sprintf("%d replicas, rate %v", tc.n, tc.rate), func(t *testing.T) {
			e := newEnv(t, "classic")
			vars := []string{"REBOUND_MIN_DELAY", "10m", "REBOUND_MAX_DELAY", "10m", "REBOUND_JITTER", "full",
				"REBOUND_MAX_RETRIES", "5", "REBOUND_MAX_DURATION", "1h", "REBOUND_PREFETCH", "16"}
			if tc.rate {
				vars = append(vars, "REBOUND_RETRY_RATE", "1000")
			}
			var regs []*prometheus.Registry
			for range tc.n {
				opt := e.options(vars...)
				reg := prometheus.NewRegistry()
				opt.Metrics = NewMetrics(reg, opt.Router)
				e.start(opt)
				regs = append(regs, reg)
			}
			// 20 failures a replica, each to a delay drawn from 0 to 10
			// min: every replica uses a few dozen delay queues.
			msgs := make([]amqp.Publishing, 20*tc.n)
			for i := range msgs {
				msgs[i] = amqp.Publishing{MessageId: strconv.Itoa(i), Headers: amqp.Table{"x-retry-origin-queue": e.app}}
			}
			e.Publish(e.topo.InboxQueue, msgs...)
			// Fifty replicas starting on a loaded machine take their time.
			if !brokertest.Await(3*time.Minute, func() bool {
				return sum(t, regs, "rebound_messages_retried_total") >= float64(len(msgs)) && e.QueueLen(e.topo.InboxQueue) == 0
			}) {
				t.Fatalf("%g of %d failures handled", sum(t, regs, "rebound_messages_retried_total"), len(msgs))
			}
			if !brokertest.Await(time.Minute, func() bool { return sum(t, regs, "rebound_watch_leader") == 1 }) {
				t.Fatalf("%g replicas hold the watch token, want 1", sum(t, regs, "rebound_watch_leader"))
			}
			checks := func() float64 {
				return sum(t, regs, "rebound_broker_calls_total", "kind", callInbox) + sum(t, regs, "rebound_broker_calls_total", "kind", callParked) +
					sum(t, regs, "rebound_broker_calls_total", "kind", callDelayQueue) + sum(t, regs, "rebound_broker_calls_total", "kind", callPlace)
			}
			c0, a0, t0 := checks(), sum(t, regs, "rebound_broker_calls_total"), time.Now()
			time.Sleep(window) // a measurement window, not a wait for a condition
			c1, a1, el := checks(), sum(t, regs, "rebound_broker_calls_total"), time.Since(t0).Seconds()
			r := row{n: tc.n, rate: tc.rate, checks: (c1 - c0) / el, all: (a1 - a0) / el,
				series: count(t, regs, "rebound_delay_queue_messages"), delayQueue: e.delayQueuesUsed()}
			rows = append(rows, r)
			byN[fmt.Sprint(tc.n, tc.rate)] = r.checks
		})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nreplicas  retry rate  checks/s  all calls/s  delay-queue series  delay queues  before (every replica checks its own)\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "%8d  %10v  %8.2f  %11.2f  %18d  %12d  ~%.1f/s\n", r.n, r.rate, r.checks, r.all, r.series, r.delayQueue,
			float64(r.n)*(1/inboxEvery.Seconds()+float64(1+r.delayQueue)/defaultQueuesEvery.Seconds()))
	}
	t.Log(b.String())
	for _, rate := range []bool{false, true} {
		five, fifty := byN[fmt.Sprint(5, rate)], byN[fmt.Sprint(50, rate)]
		if fifty > 2*five+0.1 { // 0.1/s: one inbox read of a window's rounding
			t.Errorf("retry rate %v: 50 replicas make %.2f checks a second, more than twice the %.2f of 5", rate, fifty, five)
		}
	}
}

// delayQueuesUsed counts the delay queues of e's deployment on the broker.
func (e *env) delayQueuesUsed() int {
	out := e.b.MustCtl(e.t, "list_queues", "-q", "--no-table-headers", "name")
	n := 0
	for line := range strings.Lines(out) {
		if e.topo.IsDelayQueue(strings.TrimSpace(line)) {
			n++
		}
	}
	return n
}

// sum adds the series of name (with labels) over every registry.
func sum(t *testing.T, regs []*prometheus.Registry, name string, labels ...string) float64 {
	total := 0.0
	for _, reg := range regs {
		total += sumSeries(t, reg, name, labels...)
	}
	return total
}

func sumSeries(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	total := 0.0
	for _, v := range matching(t, reg, name, labels...) {
		total += v
	}
	return total
}

// count is the number of series of name over every registry.
func count(t *testing.T, regs []*prometheus.Registry, name string) int {
	n := 0
	for _, reg := range regs {
		n += len(matching(t, reg, name))
	}
	return n
}
