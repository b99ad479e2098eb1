package consumer

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rebound-mq/rebound/internal/buildinfo"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/policy"
	"github.com/rebound-mq/rebound/republisher"
)

// Metrics are the sidecar's Prometheus metrics. Label values come from
// fixed sets or from configuration (header names, policy names, rebound's
// own queue names), never from messages.
type Metrics struct {
	Received        prometheus.Counter
	Redelivered     prometheus.Counter
	Retried         *prometheus.CounterVec // kind: delayed, immediate; policy; origin (see originLabels)
	RetryDelay      prometheus.Histogram
	Parked          *prometheus.CounterVec // reason; policy; origin (see originLabels)
	InvalidHeaders  *prometheus.CounterVec // header
	OriginMismatch  prometheus.Counter
	PolicyConflicts *prometheus.CounterVec // policy: the one this replica chose
	RetryAfter      *prometheus.CounterVec // policy; outcome: applied, capped, ignored-invalid
	PublishFailures *prometheus.CounterVec // kind: nack, return, timeout, closed
	ConfirmLatency  prometheus.Histogram
	InFlight        prometheus.Gauge
	Reconnects      prometheus.Counter
	Blocked         prometheus.Gauge
	Ready           prometheus.Gauge
	// PolicyInfo is rebound_policy_info: 1 for each policy, labelled
	// with its routing labels (REBOUND_LABELS, REBOUND_POLICY_<NAME>_LABELS)
	// for the alerts to join on policy and vhost.
	PolicyInfo *prometheus.GaugeVec

	// What waits on the broker, from passive declarations by the one
	// replica of the vhost that holds the watch token (WatchLeader; see
	// topology.JoinWatch): the others have no series. Aggregate with max
	// by queue, which also covers the moment two report during a
	// handover; never sum across pods or namespaces.
	InboxMessages *prometheus.GaugeVec // queue: the inbox
	// InboxConsumers is this replica's own reading of the inbox's
	// consumers, the divisor of its share of a retry rate: read by the
	// leader, and by every replica when a policy has a rate.
	InboxConsumers     prometheus.Gauge
	ParkedMessages     *prometheus.GaugeVec // queue: the parking queue
	DelayQueueMessages *prometheus.GaugeVec // queue: a delay queue the reporting replica uses
	WatchLeader        prometheus.Gauge
	// BrokerCalls counts the calls rebound makes to learn about the
	// broker, by kind (inbox, parked, delay-queue, watch, lease, place):
	// what a replica costs the broker besides moving messages.
	BrokerCalls *prometheus.CounterVec

	// The in-flight window (REBOUND_PREFETCH, REBOUND_INFLIGHT_BYTES).
	Prefetch      prometheus.Gauge
	InflightBytes prometheus.Gauge
	InboxStalled  prometheus.Gauge // seconds the consume connection has gone unread while rebound holds nothing

	// The retry rate budget (REBOUND_RETRY_RATE), by policy.
	RateDeferred *prometheus.CounterVec   // policy
	RateDeferral *prometheus.HistogramVec // policy: seconds added
	RateOverflow *prometheus.CounterVec   // policy
	RateShare    *prometheus.GaugeVec     // policy: copies a second this replica allows each origin

	// Park events (REBOUND_EVENTS_EXCHANGE), by outcome: published,
	// failed, dropped.
	Events *prometheus.CounterVec

	// Origins that refuse copies (a full queue with overflow
	// reject-publish); see refusals.
	Returned        *prometheus.CounterVec // policy: delayed copies sent on to their origin
	OriginRefused   *prometheus.CounterVec // policy: copies the broker refused to put into their origin
	OriginWaits     *prometheus.CounterVec // policy: copies put into a delay queue while their origin refuses
	OriginsRefusing prometheus.Gauge
	OriginTwins     prometheus.Counter

	BuildInfo *prometheus.GaugeVec // version, revision, goversion
}

func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// queueCounterVec and queueGaugeVec make the series that name a queue
// (origin or queue label): each carries the vhost as well, so that two
// vhosts' queues of the same name stay two series.
func queueCounterVec(vhost prometheus.Labels, name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: vhost}, labels)
}

func queueGaugeVec(vhost prometheus.Labels, name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: vhost}, labels)
}

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

func gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

// NewMetrics creates the metrics and registers them with reg. The series
// of r's policies and of the headers it reads start at 0, so that
// increase() counts the first retry, park or bad header too.
func NewMetrics(reg prometheus.Registerer, r route.Router) *Metrics {
	vhost := prometheus.Labels{"vhost": r.Topology.Vhost}
	m := &Metrics{
		Received:    counter("rebound_messages_received_total", "Messages delivered to rebound from its inbox."),
		Redelivered: counter("rebound_redelivered_total", "Inbox deliveries flagged redelivered; each may produce a duplicate copy."),
		Retried: queueCounterVec(vhost, "rebound_messages_retried_total", "Messages sent back for another attempt, confirmed by the broker.",
			"kind", "policy", "origin"),
		RetryDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "rebound_retry_delay_seconds", Help: "Delay chosen for each delayed retry.",
			Buckets: prometheus.ExponentialBuckets(0.1, 4, 10), // 100ms .. ~7h
		}),
		Parked: queueCounterVec(vhost, "rebound_messages_parked_total", "Messages moved to the parking queue, confirmed by the broker.",
			"reason", "policy", "origin"),
		InvalidHeaders: counterVec("rebound_invalid_headers_total", "Headers that could not be read and were treated as absent.", "header"),
		OriginMismatch: counter("rebound_origin_mismatch_total",
			"Messages whose origin header named another queue than the broker's x-death record, which was used instead."),
		PolicyConflicts: queueCounterVec(vhost, "rebound_policy_conflicts_total",
			"Messages whose policy header named another policy, or another fingerprint, than this replica chose (policy): replicas configured differently.", "policy"),
		RetryAfter: counterVec("rebound_retry_after_total",
			"Retries whose consumer asked for a least delay (x-retry-after, x-opt-retry-after), confirmed: applied, capped by the policy's max delay or budget, or ignored-invalid.",
			"policy", "outcome"),
		PublishFailures: counterVec("rebound_publish_failures_total", "Copies the broker did not confirm; their inbox deliveries were requeued.", "kind"),
		ConfirmLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "rebound_confirm_latency_seconds", Help: "Time from publishing a copy to the broker's confirm.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), // 0.5ms .. ~16s
		}),
		InFlight:   gauge("rebound_inflight_deliveries", "Inbox deliveries published but not yet acknowledged."),
		Reconnects: counter("rebound_reconnects_total", "Connection generations started after the first."),
		Blocked:    gauge("rebound_connection_blocked", "1 while the broker blocks rebound's publishing connection (resource alarm)."),
		Ready:      gauge("rebound_ready", "1 when connected, topology declared and consuming."),

		InboxMessages: queueGaugeVec(vhost, "rebound_inbox_messages",
			"Messages ready in the inbox, reported by the replica that holds the watch token (aggregate with max by vhost and queue).", "queue"),
		InboxConsumers: gauge("rebound_inbox_consumers",
			"Consumers on the inbox (rebound's replicas) as this replica last read them: the divisor of its share of a retry rate. Read by the replica that holds the watch token, and by every replica when a policy has a retry rate (aggregate with max)."),
		ParkedMessages: queueGaugeVec(vhost, "rebound_parked_messages",
			"Messages in the parking queue, reported by the replica that holds the watch token (aggregate with max by vhost and queue).", "queue"),
		DelayQueueMessages: queueGaugeVec(vhost, "rebound_delay_queue_messages",
			"Messages waiting in each delay queue the replica that holds the watch token uses, having published to it within REBOUND_DELAY_QUEUE_IDLE (aggregate with max by vhost and queue).", "queue"),
		WatchLeader: gauge("rebound_watch_leader", "1 while this replica holds the watch token and reports the queue gauges for the vhost."),
		BrokerCalls: counterVec("rebound_broker_calls_total",
			"Calls made to learn about the broker (passive declarations, the watch token, leases, places among the replicas), by kind.", "kind"),

		Prefetch:      gauge("rebound_prefetch", "The inbox prefetch in use: at most REBOUND_PREFETCH, lower when large messages fill REBOUND_INFLIGHT_BYTES."),
		InflightBytes: gauge("rebound_inflight_bytes", "Message bytes of the inbox deliveries rebound holds unacked."),
		InboxStalled: gauge("rebound_inbox_stalled_seconds",
			"Seconds the consume connection has gone unread for the in-flight bytes budget while rebound holds no delivery: a stall (0 otherwise); /healthz fails past a heartbeat interval."),

		RateDeferred: counterVec("rebound_retry_rate_deferred_total",
			"Copies moved later than their policy's delay to keep an origin queue within REBOUND_RETRY_RATE.", "policy"),
		RateDeferral: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rebound_retry_rate_deferral_seconds", Help: "Seconds the retry rate budget added to deferred copies' delays.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14), // 1s .. ~2h
		}, []string{"policy"}),
		RateOverflow: counterVec("rebound_retry_rate_overflow_total",
			"Copies sent at their deadline although the origin's second was full: the budget never parks what the policy retries.", "policy"),
		RateShare: gaugeVec("rebound_retry_rate_share",
			"Copies a second this replica sends each origin queue of the policy: REBOUND_RETRY_RATE over the inbox's consumers (0: no cap).", "policy"),

		Events: counterVec("rebound_events_total",
			"Park events for REBOUND_EVENTS_EXCHANGE, by outcome: published (confirmed), failed (not confirmed, not tried again), dropped (queue full, or rebound stopping).", "outcome"),

		Returned: counterVec("rebound_messages_returned_total",
			"Delayed copies whose delay ended, sent on to their origin queue and confirmed.", "policy"),
		OriginRefused: counterVec("rebound_origin_refused_total",
			"Copies the broker refused to put into their origin queue (nack: a full queue with overflow reject-publish); each waits, not spins.", "policy"),
		OriginWaits: counterVec("rebound_origin_refused_waits_total",
			"Copies put into a delay queue, confirmed, to wait while their origin queue refuses copies.", "policy"),
		OriginTwins: counter("rebound_origin_refused_twins_total",
			"Messages dropped as twins of copies their origin refused: overflow reject-publish-dlx dead-letters a refused copy, which rebound still holds."),
		OriginsRefusing: gauge("rebound_origins_refusing",
			"Origin queues this replica waits on because they refused a copy (backing off before the next try)."),

		PolicyInfo: policyInfo(vhost, r.Policies),
		BuildInfo: gaugeVec("rebound_build_info", "1, labelled with the running build's version, revision and Go version.",
			"version", "revision", "goversion"),
	}
	reg.MustRegister(m.Received, m.Redelivered, m.Retried, m.RetryDelay, m.Parked, m.InvalidHeaders, m.OriginMismatch,
		m.PolicyConflicts, m.RetryAfter, m.PublishFailures, m.ConfirmLatency, m.InFlight, m.Reconnects, m.Blocked, m.Ready,
		m.InboxMessages, m.InboxConsumers, m.ParkedMessages, m.DelayQueueMessages, m.WatchLeader, m.BrokerCalls, m.Prefetch, m.InflightBytes,
		m.InboxStalled, m.RateDeferred, m.RateDeferral, m.RateOverflow, m.RateShare, m.Returned, m.OriginRefused, m.OriginWaits,
		m.OriginsRefusing, m.OriginTwins, m.Events, m.PolicyInfo, m.BuildInfo)
	// Create the fixed-label series up front so dashboards show zeros, not gaps.
	for _, p := range r.Policies.All() {
		for _, kind := range []string{"delayed", "immediate"} {
			m.Retried.WithLabelValues(kind, p.Name, "")
		}
		for _, reason := range policy.Reasons {
			m.Parked.WithLabelValues(string(reason), p.Name, "")
		}
		m.RateDeferred.WithLabelValues(p.Name)
		m.PolicyConflicts.WithLabelValues(p.Name)
		m.RateDeferral.WithLabelValues(p.Name)
		m.RateOverflow.WithLabelValues(p.Name)
		m.RateShare.WithLabelValues(p.Name)
		m.Returned.WithLabelValues(p.Name)
		m.OriginRefused.WithLabelValues(p.Name)
		m.OriginWaits.WithLabelValues(p.Name)
		for _, outcome := range route.RetryAfterOutcomes {
			m.RetryAfter.WithLabelValues(p.Name, outcome)
		}
	}
	for _, h := range r.Codec.Names.Read() {
		if h != "" {
			m.InvalidHeaders.WithLabelValues(h)
		}
	}
	for _, kind := range brokerCallKinds {
		m.BrokerCalls.WithLabelValues(kind)
	}
	for _, o := range []republisher.Outcome{republisher.Nacked, republisher.Returned, republisher.TimedOut, republisher.Closed} {
		m.PublishFailures.WithLabelValues(o.String())
	}
	for _, o := range eventOutcomes {
		m.Events.WithLabelValues(o)
	}
	b := buildinfo.Read()
	m.BuildInfo.WithLabelValues(b.Version, b.Revision, b.GoVersion).Set(1)
	return m
}

// policyInfo returns rebound_policy_info with a series of 1 for each of
// set's policies. Its labels are policy and every routing label name any
// policy sets (a policy without one has it empty), so that an alert joins
// it with `* on (vhost, policy) group_left (team, owner)`.
func policyInfo(vhost prometheus.Labels, set policy.Set) *prometheus.GaugeVec {
	var names []string
	for _, p := range set.All() {
		for name := range p.Labels {
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	info := queueGaugeVec(vhost, "rebound_policy_info",
		"1 for each retry policy, labelled with its routing labels (REBOUND_LABELS, REBOUND_POLICY_<NAME>_LABELS) for alerts to join.",
		append([]string{"policy"}, names...)...)
	for _, p := range set.All() {
		values := []string{p.Name}
		for _, name := range names {
			values = append(values, p.Labels[name])
		}
		info.WithLabelValues(values...).Set(1)
	}
	return info
}
