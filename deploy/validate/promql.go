package validate

import (
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// Metric is one series family rebound exports.
type Metric struct {
	Name string
	// Histogram families are queried through _bucket, _sum and _count.
	Histogram bool
	// Labels maps each label to its allowed values; nil values = any.
	Labels map[string][]string
}

// Metrics are the metrics rebound's sidecar exports, the contract the
// dashboard and the alerts are built on. TestMetricsAreTheSidecars checks
// them against what sidecar.NewMetrics registers.
var Metrics = []Metric{
	{Name: "rebound_messages_received_total"},
	{Name: "rebound_messages_retried_total", Labels: map[string][]string{"kind": {"delayed", "immediate"}, "policy": nil, "origin": nil, "vhost": nil}},
	{Name: "rebound_retry_delay_seconds", Histogram: true},
	{Name: "rebound_messages_parked_total", Labels: map[string][]string{"reason": {"max-retries", "max-duration", "non-retryable", "unknown-origin", "origin-not-allowed", "origin-refused"}, "policy": nil, "origin": nil, "vhost": nil}},
	{Name: "rebound_invalid_headers_total", Labels: map[string][]string{"header": nil}},
	{Name: "rebound_origin_mismatch_total"},
	{Name: "rebound_policy_conflicts_total", Labels: map[string][]string{"policy": nil, "vhost": nil}},
	// The routing labels team and owner are those the alerts join; a
	// policy may carry others (REBOUND_POLICY_<NAME>_LABELS).
	{Name: "rebound_policy_info", Labels: map[string][]string{"policy": nil, "vhost": nil, "team": nil, "owner": nil}},
	{Name: "rebound_retry_after_total", Labels: map[string][]string{"policy": nil, "outcome": {"applied", "capped", "ignored-invalid"}}},
	{Name: "rebound_publish_failures_total", Labels: map[string][]string{"kind": {"nack", "return", "timeout", "closed"}}},
	{Name: "rebound_confirm_latency_seconds", Histogram: true},
	{Name: "rebound_inflight_deliveries"},
	{Name: "rebound_redelivered_total"},
	{Name: "rebound_reconnects_total"},
	{Name: "rebound_connection_blocked"},
	{Name: "rebound_ready"},
	{Name: "rebound_inbox_messages", Labels: map[string][]string{"queue": nil, "vhost": nil}},
	{Name: "rebound_inbox_consumers"},
	{Name: "rebound_parked_messages", Labels: map[string][]string{"queue": nil, "vhost": nil}},
	{Name: "rebound_delay_queue_messages", Labels: map[string][]string{"queue": nil, "vhost": nil}},
	{Name: "rebound_watch_leader"},
	{Name: "rebound_broker_calls_total", Labels: map[string][]string{"kind": {"inbox", "parked", "delay-queue", "watch", "lease", "place"}}},
	{Name: "rebound_prefetch"},
	{Name: "rebound_inflight_bytes"},
	{Name: "rebound_inbox_stalled_seconds"},
	{Name: "rebound_retry_rate_deferred_total", Labels: map[string][]string{"policy": nil}},
	{Name: "rebound_retry_rate_deferral_seconds", Histogram: true, Labels: map[string][]string{"policy": nil}},
	{Name: "rebound_retry_rate_overflow_total", Labels: map[string][]string{"policy": nil}},
	{Name: "rebound_retry_rate_share", Labels: map[string][]string{"policy": nil}},
	{Name: "rebound_events_total", Labels: map[string][]string{"outcome": {"published", "failed", "dropped"}}},
	{Name: "rebound_messages_returned_total", Labels: map[string][]string{"policy": nil}},
	{Name: "rebound_origin_refused_total", Labels: map[string][]string{"policy": nil}},
	{Name: "rebound_origin_refused_waits_total", Labels: map[string][]string{"policy": nil}},
	{Name: "rebound_origins_refusing"},
	{Name: "rebound_origin_refused_twins_total"},
	// Hold mode's holders (internal/holder), registered beside the sidecar's.
	{Name: "rebound_held_messages"},
	{Name: "rebound_hold_settlements_total", Labels: map[string][]string{"outcome": {"held", "released", "parked"}}},
	{Name: "rebound_hold_lateness_seconds", Histogram: true},
	{Name: "rebound_hold_invalid_copies_total"},
	{Name: "rebound_hold_park_returned_total"},
	{Name: "rebound_hold_released_total", Labels: map[string][]string{"way": {"published", "dead-lettered"}}},
	{Name: "rebound_hold_origin_refused_total"},
	{Name: "rebound_build_info", Labels: map[string][]string{"version": nil, "revision": nil, "goversion": nil}},
}

// targetLabels are the labels Prometheus adds to every scraped series
// (kubernetes_sd with the Prometheus Operator's relabelling), plus le on
// histogram buckets.
var targetLabels = []string{"namespace", "pod", "container", "instance", "job", "endpoint", "service", "node", "le"}

// metricFor returns the contract metric a series name belongs to.
func metricFor(name string) (Metric, bool) {
	for _, m := range Metrics {
		if name == m.Name {
			return m, true
		}
		if m.Histogram {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				if name == m.Name+s {
					return m, true
				}
			}
		}
	}
	return Metric{}, false
}

// CheckPromQL parses expr and checks every series it selects: rebound_*
// names must be in Metrics, with label matchers on the metric's own labels
// (and values it can take) or on target labels; go_* and process_* (the
// standard Go collectors) and the names in extra are accepted as they are;
// anything else is a problem. It returns the selected names too.
func CheckPromQL(expr string, extra ...string) (names []string, problems []string) {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return nil, []string{fmt.Sprintf("%q: %v", expr, err)}
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		var grouping []string
		switch n := n.(type) {
		case *parser.AggregateExpr:
			grouping = n.Grouping
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				grouping = n.VectorMatching.MatchingLabels
			}
		}
		for _, l := range grouping {
			if !knownLabel(l) {
				problems = append(problems, fmt.Sprintf("%q: no series has the label %s to group or match on", expr, l))
			}
		}
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			problems = append(problems, fmt.Sprintf("%q: selector %s has no metric name", expr, vs))
			return nil
		}
		names = append(names, name)
		m, known := metricFor(name)
		switch {
		case known:
			problems = append(problems, checkMatchers(expr, m, vs.LabelMatchers)...)
		case strings.HasPrefix(name, "rebound_"):
			problems = append(problems, fmt.Sprintf("%q: rebound does not export %s", expr, name))
		case strings.HasPrefix(name, "go_"), strings.HasPrefix(name, "process_"), slices.Contains(extra, name):
		default:
			problems = append(problems, fmt.Sprintf("%q: %s is not a rebound_, go_ or process_ metric", expr, name))
		}
		return nil
	})
	return names, problems
}

func checkMatchers(expr string, m Metric, ms []*labels.Matcher) []string {
	var problems []string
	for _, lm := range ms {
		if lm.Name == model.MetricNameLabel {
			continue
		}
		values, own := m.Labels[lm.Name]
		switch {
		case own && values != nil && lm.Type == labels.MatchEqual && !slices.Contains(values, lm.Value):
			problems = append(problems, fmt.Sprintf("%q: %s{%s} never has the value %q", expr, m.Name, lm.Name, lm.Value))
		case own && values != nil && lm.Type == labels.MatchRegexp:
			for _, alt := range strings.Split(lm.Value, "|") {
				if !slices.Contains(values, alt) {
					problems = append(problems, fmt.Sprintf("%q: %s{%s} never has the value %q", expr, m.Name, lm.Name, alt))
				}
			}
		case own, slices.Contains(targetLabels, lm.Name):
		default:
			problems = append(problems, fmt.Sprintf("%q: %s has no label %s", expr, m.Name, lm.Name))
		}
	}
	return problems
}

// knownLabel tells whether l is a target label or a label of some contract
// metric.
func knownLabel(l string) bool {
	if slices.Contains(targetLabels, l) {
		return true
	}
	return slices.ContainsFunc(Metrics, func(m Metric) bool {
		_, ok := m.Labels[l]
		return ok
	})
}
