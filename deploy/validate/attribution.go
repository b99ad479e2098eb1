package validate

import (
	"fmt"
	"slices"

	"github.com/prometheus/prometheus/promql/parser"
)

// Whose a number is. In sidecar mode any rebound of a vhost takes any
// service's failed message, and one rebound, in whichever namespace, holds
// the watch and reports the vhost's queues; so the namespace and pod of
// the rebound that exported a series say nothing about whose the number
// is. A queue gauge grouped or filtered by namespace counts one shared
// queue once per namespace (or not at all); a message counter grouped by
// namespace blames the service whose pod happened to take the message.

// queueGauges are the vhost's queue counts, reported by the replica that
// holds the watch (and by two for a moment at a handover).
var queueGauges = []string{"rebound_inbox_messages", "rebound_parked_messages", "rebound_delay_queue_messages"}

// attributedCounters count messages by the policy (and origin) that
// decided them, whichever rebound took them.
var attributedCounters = []string{"rebound_messages_retried_total", "rebound_messages_parked_total", "rebound_policy_conflicts_total"}

// processLabels name the rebound that exported a series.
var processLabels = []string{"namespace", "pod", "instance"}

// CheckAttribution checks that expr attributes the vhost's numbers to what
// they are about, not to the rebound that exported them: a queue gauge is
// never selected or grouped by namespace or pod, and its innermost
// aggregation is a max or min by (vhost, queue), which a handover's second
// reporter does not double and two vhosts' queues of one name do not merge; a message counter is never selected or
// grouped by namespace or pod, except as the condition of an and/unless
// about that pod (did this rebound retry anything?).
func CheckAttribution(expr string) []string {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return nil // CheckPromQL says so
	}
	var problems []string
	parser.Inspect(e, func(n parser.Node, path []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		gauge, counter := slices.Contains(queueGauges, vs.Name), slices.Contains(attributedCounters, vs.Name)
		if !gauge && !counter {
			return nil
		}
		if counter && conditionOnProcess(n, path) {
			return nil
		}
		for _, m := range vs.LabelMatchers {
			if slices.Contains(processLabels, m.Name) {
				problems = append(problems, fmt.Sprintf("%q: %s selected by %s, the rebound that exported it, not whose it is", expr, vs.Name, m.Name))
			}
		}
		var innermost *parser.AggregateExpr
		for _, a := range path {
			agg, ok := a.(*parser.AggregateExpr)
			if !ok {
				continue
			}
			innermost = agg
			if agg.Without {
				problems = append(problems, fmt.Sprintf("%q: %s aggregated without (...) keeps the labels of the rebound that exported it", expr, vs.Name))
				continue
			}
			for _, l := range agg.Grouping {
				if slices.Contains(processLabels, l) {
					problems = append(problems, fmt.Sprintf("%q: %s grouped by %s, the rebound that exported it, not whose it is", expr, vs.Name, l))
				}
			}
		}
		if gauge {
			switch {
			case innermost == nil:
				problems = append(problems, fmt.Sprintf("%q: %s not aggregated: one series per reporting rebound; use max by (vhost, queue)", expr, vs.Name))
			case innermost.Op != parser.MAX && innermost.Op != parser.MIN:
				problems = append(problems, fmt.Sprintf("%q: %s first aggregated with %s, which counts a queue once per reporting rebound; use max by (vhost, queue)", expr, vs.Name, innermost.Op))
			case slices.ContainsFunc(innermost.Grouping, func(l string) bool { return l != "queue" && l != "vhost" }):
				problems = append(problems, fmt.Sprintf("%q: %s first aggregated by %v; by (vhost, queue) alone", expr, vs.Name, innermost.Grouping))
			case slices.Contains(innermost.Grouping, "queue") && !slices.Contains(innermost.Grouping, "vhost"):
				problems = append(problems, fmt.Sprintf("%q: %s aggregated by queue without vhost: two vhosts' queues of one name (both keep the default names) merge; use max by (vhost, queue)", expr, vs.Name))
			}
		}
		return nil
	})
	return problems
}

// conditionOnProcess tells whether the selector n (reached through path)
// is inside the right-hand side of an and/unless: a condition on the
// rebound process the left-hand side is about.
func conditionOnProcess(n parser.Node, path []parser.Node) bool {
	for i, a := range path {
		b, ok := a.(*parser.BinaryExpr)
		if !ok || (b.Op != parser.LAND && b.Op != parser.LUNLESS) {
			continue
		}
		child := n
		if i+1 < len(path) {
			child = path[i+1]
		}
		if child == b.RHS {
			return true
		}
	}
	return false
}

// CheckRouting checks that an alert expression about a policy's messages
// reaches the policy's team: every attributed counter grouped by policy is
// grouped by vhost too (policies are per vhost), and is the left-hand side
// of a join that copies the routing labels team and owner from
// rebound_policy_info on (vhost, policy). A fallback (`or`) for a policy
// that reports no info is allowed beside the join.
func CheckRouting(expr string) []string {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return nil // CheckPromQL says so
	}
	var problems []string
	joined, byPolicy := false, false
	parser.Inspect(e, func(n parser.Node, path []parser.Node) error {
		if b, ok := n.(*parser.BinaryExpr); ok && b.VectorMatching != nil && b.VectorMatching.Card == parser.CardManyToOne {
			vm := b.VectorMatching
			if vm.On && slices.Equal(slices.Sorted(slices.Values(vm.MatchingLabels)), []string{"policy", "vhost"}) &&
				slices.Contains(vm.Include, "team") && slices.Contains(vm.Include, "owner") && selects(b.RHS, "rebound_policy_info") {
				joined = true
			}
		}
		vs, ok := n.(*parser.VectorSelector)
		if !ok || !slices.Contains(attributedCounters, vs.Name) || conditionOnProcess(n, path) {
			return nil
		}
		for _, a := range path {
			agg, ok := a.(*parser.AggregateExpr)
			if !ok || !slices.Contains(agg.Grouping, "policy") {
				continue
			}
			byPolicy = true
			if !slices.Contains(agg.Grouping, "vhost") {
				problems = append(problems, fmt.Sprintf("%q: %s grouped by policy without vhost: two vhosts' policies of one name merge, and the team label cannot be joined", expr, vs.Name))
			}
		}
		return nil
	})
	if byPolicy && !joined {
		problems = append(problems, fmt.Sprintf("%q: not joined with rebound_policy_info: * on (vhost, policy) group_left (team, owner) topk by (vhost, policy) (1, max by (vhost, policy, team, owner) (rebound_policy_info)) gives the alert the policy's team for Alertmanager to route on, one label set even while replicas disagree", expr))
	}
	return problems
}

// selects tells whether expr reads the metric name.
func selects(expr parser.Node, name string) bool {
	found := false
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok && vs.Name == name {
			found = true
		}
		return nil
	})
	return found
}
