package validate

import (
	"fmt"
	"maps"
	"slices"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
)

// Severities an alert may carry in its severity label.
var Severities = []string{"critical", "warning", "info"}

// CheckRules parses a Prometheus rules file as Prometheus and promtool do
// (rulefmt: unknown fields rejected, every expression and annotation
// template parsed) and checks each rule's expression with CheckPromQL and
// CheckAttribution, and that every alert has a severity, a summary and a
// description.
func CheckRules(content []byte) (*rulefmt.RuleGroups, []string) {
	groups, errs := rulefmt.Parse(content, false, model.LegacyValidation)
	var problems []string
	for _, err := range errs {
		problems = append(problems, err.Error())
	}
	if groups == nil {
		return nil, problems
	}
	if len(groups.Groups) == 0 {
		problems = append(problems, "no rule groups")
	}
	seen := map[string]bool{}
	for _, g := range groups.Groups {
		if len(g.Rules) == 0 {
			problems = append(problems, fmt.Sprintf("group %s: no rules", g.Name))
		}
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			// up tells whether the scrape worked; it is the one series
			// about rebound that rebound cannot export itself.
			_, ps := CheckPromQL(r.Expr, "up")
			ps = append(ps, CheckAttribution(r.Expr)...)
			if r.Alert != "" {
				ps = append(ps, CheckRouting(r.Expr)...)
			}
			for _, p := range ps {
				problems = append(problems, fmt.Sprintf("%s: %s", name, p))
			}
			if r.Alert == "" {
				continue
			}
			if seen[r.Alert] {
				problems = append(problems, fmt.Sprintf("%s: alert name used twice", r.Alert))
			}
			seen[r.Alert] = true
			if !slices.Contains(Severities, r.Labels["severity"]) {
				problems = append(problems, fmt.Sprintf("%s: severity label %q, want one of %v", r.Alert, r.Labels["severity"], Severities))
			}
			for _, a := range []string{"summary", "description"} {
				if r.Annotations[a] == "" {
					problems = append(problems, fmt.Sprintf("%s: no %s annotation", r.Alert, a))
				}
			}
		}
	}
	return groups, problems
}

// SameRules reports where a PrometheusRule's groups differ from a rules
// file's (group names; each rule's name, expression, for, labels and
// annotations): the two forms of the same rules must not drift apart.
func SameRules(file *rulefmt.RuleGroups, pr *monitoringv1.PrometheusRule) []string {
	var problems []string
	if len(file.Groups) != len(pr.Spec.Groups) {
		return []string{fmt.Sprintf("%d groups in the rules file, %d in PrometheusRule %s", len(file.Groups), len(pr.Spec.Groups), pr.Name)}
	}
	for i, fg := range file.Groups {
		pg := pr.Spec.Groups[i]
		if fg.Name != pg.Name {
			problems = append(problems, fmt.Sprintf("group %d: %q in the rules file, %q in the PrometheusRule", i, fg.Name, pg.Name))
		}
		if len(fg.Rules) != len(pg.Rules) {
			problems = append(problems, fmt.Sprintf("group %s: %d rules in the rules file, %d in the PrometheusRule", fg.Name, len(fg.Rules), len(pg.Rules)))
			continue
		}
		for j, fr := range fg.Rules {
			pr := pg.Rules[j]
			var prFor model.Duration
			if pr.For != nil {
				d, err := model.ParseDuration(string(*pr.For))
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s: PrometheusRule for %q: %v", pr.Alert, *pr.For, err))
				}
				prFor = d
			}
			same := fr.Alert == pr.Alert && fr.Record == pr.Record && fr.Expr == pr.Expr.String() &&
				fr.For == prFor && maps.Equal(fr.Labels, pr.Labels) && maps.Equal(fr.Annotations, pr.Annotations)
			if !same {
				problems = append(problems, fmt.Sprintf("group %s, rule %d (%s%s): differs between the rules file and the PrometheusRule", fg.Name, j+1, fr.Alert, fr.Record))
			}
		}
	}
	return problems
}
