package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rebound-mq/rebound/policy"
	"github.com/rebound-mq/rebound/republisher"
	"github.com/rebound-mq/rebound/route"
)

// Metrics are the sidecar's Prometheus metrics. Label values come from
// fixed sets or from configuration (header names, policy names), never
// from messages.
type Metrics struct {
	Received        prometheus.Counter
	Redelivered     prometheus.Counter
	Retried         *prometheus.CounterVec // kind: delayed, immediate; policy
	RetryDelay      prometheus.Histogram
	Parked          *prometheus.CounterVec // reason; policy
	InvalidHeaders  *prometheus.CounterVec // header
	OriginMismatch  prometheus.Counter
	PolicyConflicts prometheus.Counter
	PublishFailures *prometheus.CounterVec // kind: nack, return, timeout, closed
	ConfirmLatency  prometheus.Histogram
	InFlight        prometheus.Gauge
	Reconnects      prometheus.Counter
	Blocked         prometheus.Gauge
	Ready           prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg. The series
// of r's policies and of the headers it reads start at 0, so that
// increase() counts the first retry, park or bad header too.
func NewMetrics(reg prometheus.Registerer, r route.Router) *Metrics {
	m := &Metrics{
		Received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rebound_messages_received_total", Help: "Messages delivered to rebound from its inbox.",
		}),
		Redelivered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rebound_redelivered_total", Help: "Inbox deliveries flagged redelivered; each may produce a duplicate copy.",
		}),
		Retried: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rebound_messages_retried_total", Help: "Messages sent back for another attempt, confirmed by the broker.",
		}, []string{"kind", "policy"}),
		RetryDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "rebound_retry_delay_seconds", Help: "Delay chosen for each delayed retry.",
			Buckets: prometheus.ExponentialBuckets(0.1, 4, 10), // 100ms .. ~7h
		}),
		Parked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rebound_messages_parked_total", Help: "Messages moved to the parking queue, confirmed by the broker.",
		}, []string{"reason", "policy"}),
		InvalidHeaders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rebound_invalid_headers_total", Help: "Headers that could not be read and were treated as absent.",
		}, []string{"header"}),
		OriginMismatch: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rebound_origin_mismatch_total",
			Help: "Messages whose origin header named another queue than the broker's x-death record, which was used instead.",
		}),
		PolicyConflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rebound_policy_conflicts_total",
			Help: "Messages whose policy header named the chosen policy with another fingerprint, or a policy this replica does not have: replicas configured differently.",
		}),
		PublishFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rebound_publish_failures_total", Help: "Copies the broker did not confirm; their inbox deliveries were requeued.",
		}, []string{"kind"}),
		ConfirmLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "rebound_confirm_latency_seconds", Help: "Time from publishing a copy to the broker's confirm.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), // 0.5ms .. ~16s
		}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rebound_inflight_deliveries", Help: "Inbox deliveries published but not yet acknowledged.",
		}),
		Reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rebound_reconnects_total", Help: "Connection generations started after the first.",
		}),
		Blocked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rebound_connection_blocked", Help: "1 while the broker blocks rebound's publishing connection (resource alarm).",
		}),
		Ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rebound_ready", Help: "1 when connected, topology declared and consuming.",
		}),
	}
	reg.MustRegister(m.Received, m.Redelivered, m.Retried, m.RetryDelay, m.Parked, m.InvalidHeaders, m.OriginMismatch,
		m.PolicyConflicts, m.PublishFailures, m.ConfirmLatency, m.InFlight, m.Reconnects, m.Blocked, m.Ready)
	// Create the fixed-label series up front so dashboards show zeros, not gaps.
	for _, p := range r.Policies.All() {
		for _, kind := range []string{"delayed", "immediate"} {
			m.Retried.WithLabelValues(kind, p.Name)
		}
		for _, reason := range policy.Reasons {
			m.Parked.WithLabelValues(string(reason), p.Name)
		}
	}
	for _, h := range r.Codec.Names.Read() {
		if h != "" {
			m.InvalidHeaders.WithLabelValues(h)
		}
	}
	for _, o := range []republisher.Outcome{republisher.Nacked, republisher.Returned, republisher.TimedOut, republisher.Closed} {
		m.PublishFailures.WithLabelValues(o.String())
	}
	return m
}
