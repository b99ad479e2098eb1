package validate

import (
	"slices"
	"strings"
	"testing"
)

// TestCheckAttributionCatches: the expressions issue 37 found in the
// dashboard and alerts (a shared parking queue counted once per namespace,
// parks blamed on the namespace of the rebound that took them) and their
// kin are problems; what the dashboard and alerts do now is not.
func TestCheckAttributionCatches(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{`sum(max by (namespace) (rebound_parked_messages))`, "grouped by namespace"},
		{`max by (namespace) (delta(rebound_parked_messages[1h])) > 0`, "grouped by namespace"},
		{`sum(rebound_inbox_messages)`, "first aggregated with sum"},
		{`rebound_delay_queue_messages`, "not aggregated"},
		{`max by (vhost, queue, pod) (rebound_delay_queue_messages)`, "grouped by pod"},
		{`max by (vhost, queue) (rebound_parked_messages{namespace=~"$namespace"})`, "selected by namespace"},
		{`max by (queue) (rebound_parked_messages)`, "without vhost"},
		{`sum by (namespace, reason) (rate(rebound_messages_parked_total[15m])) * 60 > 1`, "grouped by namespace"},
		{`sum without (policy) (rate(rebound_messages_retried_total[5m]))`, "without"},
		{`sum(rate(rebound_policy_conflicts_total{pod=~"$pod"}[5m]))`, "selected by pod"},
	} {
		if ps := CheckAttribution(tc.expr); !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tc.want) }) {
			t.Errorf("%s: want a problem mentioning %q, got %q", tc.expr, tc.want, ps)
		}
	}
	for _, expr := range []string{
		`sum(max by (vhost, queue) (rebound_delay_queue_messages))`,
		`max by (vhost, queue) (min_over_time(rebound_inbox_messages[15m])) > 100`,
		`sum(max by (vhost) (rebound_parked_messages))`,
		`sum by (policy, origin, reason) (rate(rebound_messages_parked_total[15m])) * 60 > 1`,
		// Whether this pod retried anything: a condition on the process.
		`max by (namespace, pod) (rebound_inflight_deliveries) > 0 unless on (namespace, pod) (sum by (namespace, pod) (increase(rebound_messages_retried_total[15m])) > 0)`,
	} {
		if ps := CheckAttribution(expr); len(ps) != 0 {
			t.Errorf("%s: %q", expr, ps)
		}
	}
}

// TestCheckRoutingCatches: an alert about a policy's messages without the
// policy's team, or grouped by policy without vhost, is a problem; the
// joined form the alerts use is not.
func TestCheckRoutingCatches(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{`sum by (vhost, policy, origin) (increase(rebound_messages_parked_total[15m])) > 0`, "not joined with rebound_policy_info"},
		{`(sum by (policy) (increase(rebound_messages_parked_total[15m])) > 0) * on (vhost, policy) group_left (team, owner) rebound_policy_info`, "grouped by policy without vhost"},
		{`(sum by (vhost, policy) (increase(rebound_messages_parked_total[15m])) > 0) * on (vhost, policy) group_left (team) rebound_policy_info`, "not joined"},
		{`(sum by (vhost, policy) (increase(rebound_messages_parked_total[15m])) > 0) * on (vhost, policy) group_left (team, owner) rebound_build_info`, "not joined"},
	} {
		if ps := CheckRouting(tc.expr); !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tc.want) }) {
			t.Errorf("%s: want a problem mentioning %q, got %q", tc.expr, tc.want, ps)
		}
	}
	for _, expr := range []string{
		`(sum by (vhost, policy, origin) (increase(rebound_messages_parked_total[15m])) > 0) * on (vhost, policy) group_left (team, owner) max by (vhost, policy, team, owner) (rebound_policy_info) or on (vhost, policy, origin) (sum by (vhost, policy, origin) (increase(rebound_messages_parked_total[15m])) > 0)`,
		`max by (namespace, pod) (rebound_inflight_deliveries) > 0 unless on (namespace, pod) (sum by (namespace, pod) (increase(rebound_messages_retried_total[15m])) > 0)`,
		`sum by (header) (increase(rebound_invalid_headers_total[1h])) > 0`,
	} {
		if ps := CheckRouting(expr); len(ps) != 0 {
			t.Errorf("%s: %q", expr, ps)
		}
	}
}
