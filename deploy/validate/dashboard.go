package validate

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// Dashboard is the part of Grafana's dashboard JSON model that holds
// queries.
type Dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []Panel `json:"panels"`
	Templating struct {
		List []Variable `json:"list"`
	} `json:"templating"`
}

// Panel is a dashboard panel; rows nest panels.
type Panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *Datasource `json:"datasource"`
	Targets    []Target    `json:"targets"`
	Panels     []Panel     `json:"panels"`
}

// Target is one query of a panel.
type Target struct {
	Expr       string      `json:"expr"`
	RefID      string      `json:"refId"`
	Datasource *Datasource `json:"datasource"`
}

// Datasource names the data source a panel or query reads.
type Datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// Variable is a template variable.
type Variable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"`
}

// grafanaRanges are Grafana's built-in range variables; any duration will
// do to parse an expression that uses them.
var grafanaRanges = regexp.MustCompile(`\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}`)

// labelValues matches the label_values(selector, label) query of a
// variable.
var labelValues = regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// CheckDashboard checks a Grafana dashboard: valid JSON, unique panel ids,
// every query on the ${datasource} variable, every expression parsing as
// PromQL over rebound's metrics (CheckPromQL) and attributing the vhost's
// numbers to their queue or policy (CheckAttribution), every $variable defined,
// and every metric of the contract shown somewhere.
func CheckDashboard(content []byte) []string {
	var d Dashboard
	if err := json.Unmarshal(content, &d); err != nil {
		return []string{"dashboard JSON: " + err.Error()}
	}
	var problems []string
	if d.UID == "" || d.Title == "" {
		problems = append(problems, "dashboard needs a uid and a title")
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		q := variableQuery(v.Query)
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			problems = append(problems, fmt.Sprintf("variable %s: query %q is not label_values(selector, label)", v.Name, q))
			continue
		}
		_, ps := CheckPromQL(substitute(m[1]))
		problems = append(problems, ps...)
		if !knownLabel(m[2]) {
			problems = append(problems, fmt.Sprintf("variable %s: no series has the label %s", v.Name, m[2]))
		}
	}
	if !vars["datasource"] {
		problems = append(problems, "no datasource variable: the dashboard would be tied to one Grafana's data source")
	}
	used := map[string]bool{}
	ids := map[int]bool{}
	var walk func([]Panel)
	walk = func(panels []Panel) {
		for _, p := range panels {
			if ids[p.ID] {
				problems = append(problems, fmt.Sprintf("panel id %d used twice", p.ID))
			}
			ids[p.ID] = true
			if p.Type != "row" && len(p.Targets) == 0 {
				problems = append(problems, fmt.Sprintf("panel %q has no query", p.Title))
			}
			for _, t := range p.Targets {
				where := fmt.Sprintf("panel %q query %s", p.Title, t.RefID)
				ds := t.Datasource
				if ds == nil {
					ds = p.Datasource
				}
				if ds == nil || ds.Type != "prometheus" || ds.UID != "${datasource}" {
					problems = append(problems, where+": data source must be the ${datasource} variable")
				}
				for _, ref := range variableRefs.FindAllStringSubmatch(t.Expr, -1) {
					if name := ref[1] + ref[2]; !vars[name] && !strings.HasPrefix(name, "__") {
						problems = append(problems, fmt.Sprintf("%s: $%s is not a dashboard variable", where, name))
					}
				}
				names, ps := CheckPromQL(substitute(t.Expr))
				ps = append(ps, CheckAttribution(substitute(t.Expr))...)
				for _, p := range ps {
					problems = append(problems, where+": "+p)
				}
				for _, n := range names {
					if m, ok := metricFor(n); ok {
						used[m.Name] = true
					}
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, m := range Metrics {
		if !used[m.Name] {
			problems = append(problems, fmt.Sprintf("no panel shows %s", m.Name))
		}
	}
	return problems
}

var variableRefs = regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)`)

// substitute replaces Grafana's range variables with a duration so the
// expression parses; other variables sit inside label matcher strings,
// where PromQL takes them as text.
func substitute(expr string) string {
	return grafanaRanges.ReplaceAllString(expr, "5m")
}

// variableQuery returns a query variable's query, which Grafana stores as
// a string or as an object with a query field.
func variableQuery(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	_ = json.Unmarshal(raw, &o)
	return o.Query
}
