package holder

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/brokertest"
)

// measured is how the measurements run a holder: with the credit it has
// by default (256) and no log, whose lines would weigh on the numbers.
var measured = Options{Logger: zap.NewNop(), Credit: 256}

// TestMeasureHoldSettleRate measures, when REBOUND_MEASURE is set, how
// many copies a second one holder settles: REBOUND_MEASURE_N copies
// (default 20 000), due in an hour, are in the hold queue before the
// holder starts with its default credit, and each is held once. The
// rate is from the holder's start to its last settlement, so it bounds
// how fast a burst of copies is first seen. It asserts only that every
// copy was held; run it several times, alternating with the code it is
// compared with, since a shared machine moves the numbers:
//
//	REBOUND_MEASURE=1 REBOUND_TEST_BROKER=4.3 go test -count=1 -run TestMeasureHoldSettleRate -v ./internal/holder/
func TestMeasureHoldSettleRate(t *testing.T) {
	brokertest.Measure(t, "REBOUND_MEASURE")
	e := newHoldEnv(t)
	n := brokertest.MeasureCount("REBOUND_MEASURE_N", 20000)
	e.rules.Slice = time.Hour // each copy held once, for the measurement's length
	e.publishPipelined(t, e.App, n, time.Now().Add(time.Hour))

	started := time.Now()
	m, _ := e.startWith(t, measured)
	held := func() float64 { return testutil.ToFloat64(m.Settled.WithLabelValues("held")) }
	if !brokertest.Await(5*time.Minute, func() bool { return held() >= float64(n) }) {
		t.Fatalf("%v of %d copies held", held(), n)
	}
	elapsed := time.Since(started)
	load, _ := exec.Command("uptime").Output()
	t.Logf("MEASURE holder settles: %d copies in %s, %.0f/s; %s", n, elapsed.Round(time.Millisecond),
		float64(n)/elapsed.Seconds(), strings.TrimSpace(string(load)))
}

// TestMeasureHoldBurst measures, when REBOUND_MEASURE is set, how late a
// burst of copies comes home through a running holder: REBOUND_MEASURE_N
// copies (default 5 000), each due 0 to 2 s after it is published, as the
// sidecar publishes a burst of retries with full jitter. Lateness is from a copy's due time
// to its arrival in its origin queue, so it includes the broker's hold and
// its dead-lettering. It asserts only that every copy came home:
//
//	REBOUND_MEASURE=1 REBOUND_TEST_BROKER=4.3 go test -count=1 -run TestMeasureHoldBurst -v ./internal/holder/
func TestMeasureHoldBurst(t *testing.T) {
	brokertest.Measure(t, "REBOUND_MEASURE")
	e := newHoldEnv(t)
	n := brokertest.MeasureCount("REBOUND_MEASURE_N", 5000)
	e.rules.Slice = time.Minute
	m, _ := e.startWith(t, measured)
	ch, err := e.Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	home, err := ch.Consume(e.App, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The holder is attached once it holds a first copy.
	e.publish(t, e.App, 1, time.Now().Add(time.Hour), nil)
	if !brokertest.Await(time.Minute, func() bool { return testutil.ToFloat64(m.Settled.WithLabelValues("held")) >= 1 }) {
		t.Fatal("the holder held nothing")
	}
	started := time.Now()
	e.publishPipelined(t, e.App, n, time.Time{})
	var late []time.Duration
	timeout := time.After(5 * time.Minute)
	for len(late) < n {
		select {
		case d := <-home:
			due, _ := d.Headers["x-retry-due-at"].(int64)
			late = append(late, time.Since(time.UnixMilli(due)))
		case <-timeout:
			t.Fatalf("%d of %d copies home", len(late), n)
		}
	}
	elapsed := time.Since(started)
	slices.Sort(late)
	within := func(d time.Duration) float64 {
		i, _ := slices.BinarySearch(late, d)
		return 100 * float64(i) / float64(n)
	}
	var seen dto.Metric
	if err := m.Lateness.Write(&seen); err != nil {
		t.Fatal(err)
	}
	releasedWithin := 0.0
	for _, b := range seen.Histogram.Bucket {
		if b.GetUpperBound() == 1 {
			releasedWithin = 100 * float64(b.GetCumulativeCount()) / float64(seen.Histogram.GetSampleCount())
		}
	}
	t.Logf("MEASURE the holder released %.1f %% within 1 s of due (rebound_hold_lateness_seconds); published home %v, dead-lettered %v",
		releasedWithin, testutil.ToFloat64(m.Released.WithLabelValues("published")), testutil.ToFloat64(m.Released.WithLabelValues("dead-lettered")))
	load, _ := exec.Command("uptime").Output()
	t.Logf("MEASURE hold burst: %d copies due 0-2 s after publishing, all home in %s; lateness p50 %s p99 %s max %s, %.1f %% within 1 s; %s",
		n, elapsed.Round(time.Millisecond), late[n/2].Round(time.Millisecond), late[n*99/100].Round(time.Millisecond),
		late[n-1].Round(time.Millisecond), within(time.Second), strings.TrimSpace(string(load)))
}

// publishPipelined is publish without a round trip per copy: every copy
// is sent, then every confirm awaited. A zero due time makes each copy
// due 0 to 2 s after it is sent, spread evenly, as full jitter
// spreads the first two retries of TestMeasureHoldVsQueues (e2e).
func (e *holdEnv) publishPipelined(t *testing.T, origin string, n int, due time.Time) {
	t.Helper()
	ex := e.rules.Topology.HoldExchange().Name
	confirms := make([]*amqp.DeferredConfirmation, 0, n)
	for range n {
		i := e.sent
		e.sent++
		at := due
		if at.IsZero() {
			at = time.Now().Add(time.Duration(i%2000) * time.Millisecond)
		}
		h := amqp.Table{"x-retry-due-at": at.UnixMilli()}
		headers.HoldTables(h)
		c, err := e.Ch.PublishWithDeferredConfirm(ex, origin, true, false, amqp.Publishing{MessageId: fmt.Sprint(origin, "#", i), Headers: h, Body: []byte("body"), DeliveryMode: amqp.Persistent})
		if err != nil {
			t.Fatal(err)
		}
		confirms = append(confirms, c)
	}
	for _, c := range confirms {
		if !c.Wait() {
			t.Fatal("copy not confirmed")
		}
	}
}
