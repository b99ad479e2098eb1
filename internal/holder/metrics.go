package holder

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the holder's Prometheus metrics.
type metrics struct {
	// Held is rebound_held_messages: the copies this replica returned to
	// the hold queue within the last slice. Every held copy comes back
	// within a slice, so the sum over replicas bounds what the hold queue
	// holds (a copy held twice in a slice counts twice).
	Held     prometheus.GaugeFunc
	Settled  *prometheus.CounterVec
	Lateness prometheus.Histogram
	Invalid  prometheus.Counter
	// ParkReturned counts copies the parking queue did not take (returned
	// unroutable: the queue is missing), held again instead.
	ParkReturned prometheus.Counter
	// Released counts due copies sent home, by way: published by the
	// holder, or dead-lettered by the broker (release.go).
	Released *prometheus.CounterVec
	// OriginRefused counts copies a holder published home that their
	// origin refused (nack: full, reject-publish).
	OriginRefused prometheus.Counter

	mu      sync.Mutex
	buckets []heldBucket // oldest first, each a sixtieth of a slice
}

type heldBucket struct {
	start time.Time
	n     int64
}

// NewMetrics registers the holder's metrics with reg; now is the clock
// the held gauge is read by.
func NewMetrics(reg prometheus.Registerer, now func() time.Time, slice time.Duration) *metrics {
	m := &metrics{
		Settled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rebound_hold_settlements_total",
			Help: "Copies of the hold queue settled by this replica: held (returned with a delivery time), released (dead-lettered home by the broker), parked.",
		}, []string{"outcome"}),
		Lateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rebound_hold_lateness_seconds",
			Help:    "How long after its due time a held copy was released to its origin.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		Invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rebound_hold_invalid_copies_total",
			Help: "Held copies whose routing key or due time could not be trusted (parked, clamped or released now).",
		}),
		ParkReturned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rebound_hold_park_returned_total",
			Help: "Held copies the broker returned unroutable when they were parked (the parking queue is missing): held again, parked once the queue is back.",
		}),
		Released: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rebound_hold_released_total",
			Help: "Due copies this replica sent home, by way: published (by the holder, confirmed) or dead-lettered (by the broker).",
		}, []string{"way"}),
		OriginRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rebound_hold_origin_refused_total",
			Help: "Due copies a holder published home that their origin refused (full, reject-publish): held again, or parked origin-refused once their budget is spent.",
		}),
	}
	for _, way := range []string{"published", "dead-lettered"} {
		m.Released.WithLabelValues(way)
	}
	m.Held = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rebound_held_messages",
		Help: "Copies this replica returned to the hold queue within the last REBOUND_HOLD_SLICE (an upper bound of those it holds).",
	}, func() float64 { return float64(m.heldWithin(now(), slice)) })
	for _, outcome := range []action{hold, release, park} {
		m.Settled.WithLabelValues(outcome.String())
	}
	reg.MustRegister(m.Held, m.Settled, m.Lateness, m.Invalid, m.ParkReturned, m.Released, m.OriginRefused)
	return m
}

// held counts one copy held at now.
func (m *metrics) held(now time.Time, slice time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire(now, slice)
	if n := len(m.buckets); n > 0 && now.Sub(m.buckets[n-1].start) < slice/60 {
		m.buckets[n-1].n++
		return
	}
	m.buckets = append(m.buckets, heldBucket{start: now, n: 1})
}

func (m *metrics) heldWithin(now time.Time, slice time.Duration) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire(now, slice)
	var n int64
	for _, b := range m.buckets {
		n += b.n
	}
	return n
}

func (m *metrics) expire(now time.Time, slice time.Duration) {
	i := 0
	for i < len(m.buckets) && now.Sub(m.buckets[i].start) >= slice {
		i++
	}
	m.buckets = m.buckets[i:]
}
