package validate

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/consumer"
	"github.com/rebound-mq/rebound/internal/holder"
)

const (
	rulesFile          = "../prometheus/rebound-alerts.yaml"
	prometheusRuleFile = "../prometheus/rebound-prometheusrule.yaml"
	dashboardFile      = "../grafana/rebound-dashboard.json"
)

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAlertRules(t *testing.T) {
	groups, problems := CheckRules(read(t, rulesFile))
	for _, p := range problems {
		t.Error(p)
	}
	if groups == nil {
		return
	}
	// The alerts the deploy README promises a platform team.
	var alerts []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
		}
	}
	for _, want := range []string{
		"ReboundDown", "ReboundNotReady", "ReboundConnectionBlocked", "ReboundMessagesStuck", "ReboundInboxStalled",
		"ReboundParkingRateHigh", "ReboundPublishFailures", "ReboundFrequentReconnects",
	} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s", want)
		}
	}
}

func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	groups, problems := CheckRules(read(t, rulesFile))
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	o, err := DecodeStrict(read(t, prometheusRuleFile))
	if err != nil {
		t.Fatal(err)
	}
	pr, ok := o.Value.(*monitoringv1.PrometheusRule)
	if !ok {
		t.Fatalf("%s holds a %s, want a PrometheusRule", prometheusRuleFile, o.Kind)
	}
	for _, p := range SameRules(groups, pr) {
		t.Error(p)
	}
}

func TestCheckRulesCatches(t *testing.T) {
	const head = "groups:\n  - name: g\n    rules:\n"
	tests := []struct{ name, rules, want string }{
		{"syntax", head + "      - alert: A\n        expr: rate(rebound_reconnects_total[5m] > 0\n        labels: {severity: warning}\n        annotations: {summary: s, description: d}\n", "unclosed"},
		{"unknown metric", head + "      - alert: A\n        expr: rebound_reconnect_total > 0\n        labels: {severity: warning}\n        annotations: {summary: s, description: d}\n", "does not export rebound_reconnect_total"},
		{"foreign metric", head + "      - alert: A\n        expr: rabbitmq_queue_messages > 0\n        labels: {severity: warning}\n        annotations: {summary: s, description: d}\n", "not a rebound_, go_ or process_ metric"},
		{"label value", head + "      - alert: A\n        expr: rebound_messages_parked_total{reason=\"max_retries\"} > 0\n        labels: {severity: warning}\n        annotations: {summary: s, description: d}\n", `never has the value "max_retries"`},
		{"grouping label", head + "      - alert: A\n        expr: sum by (reasons) (rebound_messages_parked_total) > 0\n        labels: {severity: warning}\n        annotations: {summary: s, description: d}\n", "no series has the label reasons"},
		{"unknown field", head + "      - alert: A\n        expr: rebound_ready == 0\n        severity: warning\n", "severity"},
		{"template", head + "      - alert: A\n        expr: rebound_ready == 0\n        labels: {severity: warning}\n        annotations: {summary: \"{{ $labels.pod \", description: d}\n", "summary"},
		{"no severity", head + "      - alert: A\n        expr: rebound_ready == 0\n        annotations: {summary: s, description: d}\n", "severity label"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ps := CheckRules([]byte(tt.rules))
			if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tt.want) }) {
				t.Errorf("want a problem mentioning %q, got %q", tt.want, ps)
			}
		})
	}
}

func TestDashboard(t *testing.T) {
	for _, p := range CheckDashboard(read(t, dashboardFile)) {
		t.Error(p)
	}
}

func TestCheckDashboardCatches(t *testing.T) {
	const vars = `"templating": {"list": [{"name": "datasource", "type": "datasource"}]}`
	panel := func(expr string) string {
		return `{"uid": "u", "title": "t", ` + vars + `, "panels": [{"id": 1, "type": "timeseries", "title": "p",
			"datasource": {"type": "prometheus", "uid": "${datasource}"}, "targets": [{"refId": "A", "expr": ` + expr + `}]}]}`
	}
	tests := []struct{ name, dashboard, want string }{
		{"not JSON", `{"panels": [`, "dashboard JSON"},
		{"bad PromQL", panel(`"sum(rate(rebound_ready[$__rate_interval])"`), "unclosed"},
		{"unknown metric", panel(`"rebound_readyy"`), "does not export rebound_readyy"},
		{"undefined variable", panel(`"rebound_ready{pod=~\"$pod\"}"`), "$pod is not a dashboard variable"},
		{"missing metric", panel(`"rebound_ready"`), "no panel shows rebound_reconnects_total"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps := CheckDashboard([]byte(tt.dashboard))
			if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tt.want) }) {
				t.Errorf("want a problem mentioning %q, got %q", tt.want, ps)
			}
		})
	}
}

// TestMetricsAreTheSidecars: the metric contract the dashboard and alerts
// are checked against is what the sidecar registers, names, label names and
// fixed label values alike.
func TestMetricsAreTheSidecars(t *testing.T) {
	reg := prometheus.NewRegistry()
	// The routing labels are label names only where a policy sets them.
	cfg, err := config.Load([]string{"REBOUND_LABELS=team=platform,owner=sre"})
	if err != nil {
		t.Fatal(err)
	}
	m := consumer.NewMetrics(reg, cfg.Router())
	// A replica in hold mode registers its holder's metrics beside them.
	holder.NewMetrics(reg, time.Now, cfg.HoldSlice)
	// One series per delay queue used: none until one is.
	m.DelayQueueMessages.WithLabelValues(cfg.DelayQueuePrefix + "1000").Set(0)
	// The vhost's queue gauges: series on the replica that holds the watch.
	m.InboxMessages.WithLabelValues(cfg.InboxQueue).Set(0)
	m.ParkedMessages.WithLabelValues(cfg.ParkingQueue).Set(0)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string][]string{}
	for _, f := range families {
		labels := map[string][]string{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = append(labels[l.GetName()], l.GetValue())
			}
		}
		got[f.GetName()] = labels
	}
	for _, m := range Metrics {
		labels, ok := got[m.Name]
		if !ok {
			t.Errorf("%s is in the contract but the sidecar does not register it", m.Name)
			continue
		}
		delete(got, m.Name)
		for name, values := range m.Labels {
			seen, ok := labels[name]
			if !ok {
				t.Errorf("%s: label %s is in the contract but not on the sidecar's series", m.Name, name)
				continue
			}
			if values == nil {
				continue
			}
			slices.Sort(seen)
			want := slices.Sorted(slices.Values(values))
			if !slices.Equal(slices.Compact(seen), want) {
				t.Errorf("%s{%s}: the sidecar's values %v, the contract's %v", m.Name, name, seen, want)
			}
		}
	}
	for name := range got {
		t.Errorf("the sidecar registers %s, which the contract lacks", name)
	}
}

const (
	runbookFile   = "../../docs/runbook.md"
	ruleTestsFile = "../prometheus/rebound-alerts.test.yaml"
)

// TestRunbook: every alert links to its section of the runbook, which
// says what it means, what to check and which rebound command to run.
func TestRunbook(t *testing.T) {
	groups, problems := CheckRules(read(t, rulesFile))
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	for _, p := range CheckRunbook(groups, string(read(t, runbookFile))) {
		t.Error(p)
	}
}

// TestEveryAlertHasRuleTests: the promtool rule tests (run by make test)
// cover every alert, firing and silent.
func TestEveryAlertHasRuleTests(t *testing.T) {
	groups, problems := CheckRules(read(t, rulesFile))
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	for _, p := range CheckRuleTests(groups, read(t, ruleTestsFile)) {
		t.Error(p)
	}
}

func TestCheckRunbookCatches(t *testing.T) {
	groups, _ := CheckRules([]byte("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: rebound_ready == 0\n" +
		"        labels: {severity: warning}\n        annotations: {summary: s, description: d, runbook_url: \"" + RunbookURL + "a\"}\n"))
	for _, tc := range []struct{ name, runbook, want string }{
		{"no section", "# r\n\n## B\n", "no section"},
		{"extra section", "# r\n\n## A\n**What it means.** x **Whose it is.** p **What to check.** y **What to run.** `rebound delayed`\n\n## B\nz\n", `section "B" is for no alert`},
		{"no command", "# r\n\n## A\n**What it means.** x **Whose it is.** p **What to check.** y **What to run.** restart it\n", "names no rebound command"},
		{"missing part", "# r\n\n## A\n**What it means.** x **Whose it is.** p **What to run.** `rebound delayed`\n", "no **What to check.**"},
		{"no policy or origin named", "# r\n\n## A\n**What it means.** x **What to check.** y **What to run.** `rebound delayed`\n", "no **Whose it is.**"},
		{"unscoped replay", "# r\n\n## A\n**What it means.** x **Whose it is.** p **What to check.** y **What to run.** `rebound parked replay\n--canary 5 --canary-wait 5m --rate 50`\n", "scope it with --origin"},
	} {
		ps := CheckRunbook(groups, tc.runbook)
		if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tc.want) }) {
			t.Errorf("%s: want a problem mentioning %q, got %q", tc.name, tc.want, ps)
		}
	}
}

func TestCheckRuleTestsCatches(t *testing.T) {
	groups, _ := CheckRules([]byte("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: rebound_ready == 0\n" +
		"        labels: {severity: warning}\n        annotations: {summary: s, description: d, runbook_url: \"" + RunbookURL + "a\"}\n"))
	const fires = "tests:\n  - name: t\n    alert_rule_test:\n      - alertname: A\n        exp_alerts:\n          - exp_labels: {severity: warning}\n"
	for _, tc := range []struct{ name, tests, want string }{
		{"never fires", "tests:\n  - name: t\n    alert_rule_test:\n      - alertname: A\n        exp_alerts: []\n", "no rule test where it fires"},
		{"never silent", fires + "            exp_annotations: {runbook_url: u}\n", "no rule test where it must stay silent"},
		{"no annotations", fires, "fires without its annotations"},
	} {
		ps := CheckRuleTests(groups, []byte(tc.tests))
		if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tc.want) }) {
			t.Errorf("%s: want a problem mentioning %q, got %q", tc.name, tc.want, ps)
		}
	}
}

// TestDocsScopeEveryMove: every example in the documentation of a command
// that moves or deletes messages is limited to some origin, reason or
// group (the runbook's are checked with its sections).
func TestDocsScopeEveryMove(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md", "../README.md")
	for _, name := range files {
		for _, c := range UnscopedCommands(string(read(t, name))) {
			t.Errorf("%s: %s moves or deletes messages of every service: scope it with --origin, --reason or --group", name, c)
		}
	}
	if got := UnscopedCommands("`rebound parked replay --canary 5 --rate 50` and `rebound parked replay` and `rebound delayed flush --origin ^a$ --yes`"); len(got) != 1 {
		t.Errorf("UnscopedCommands found %q, want the first alone", got)
	}
	// In code blocks too, a command continued over lines included.
	block := "```sh\n$ rebound parked replay --canary 5 \\\n    --rate 50   # the rest\nrebound delayed flush \\\n  --origin '^a$' --yes\nrebound parked purge\n```\n"
	if got := UnscopedCommands(block); len(got) != 1 || got[0] != "`rebound parked replay --canary 5 --rate 50`" {
		t.Errorf("UnscopedCommands in a code block found %q, want the replay alone", got)
	}
}

// TestDashboardNumbersComeFromTheManifests: a size the dashboard states
// (the container's memory limit) is the one the manifests set.
func TestDashboardNumbersComeFromTheManifests(t *testing.T) {
	objs := build(t, filepath.Join(kustomizeDir, "overlays", "example"))
	d := only[*appsv1.Deployment](t, objs)
	var limit string
	for _, c := range append(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers...) {
		if c.Name == ContainerName {
			limit = c.Resources.Limits.Memory().String()
		}
	}
	sizes := regexp.MustCompile(`\b\d+(Mi|Gi)\b`).FindAllString(string(read(t, dashboardFile)), -1)
	if len(sizes) == 0 {
		t.Fatal("the dashboard states no memory size; the search is broken or the text moved")
	}
	for _, s := range sizes {
		if s != limit {
			t.Errorf("the dashboard says %s; the manifests' memory limit is %s", s, limit)
		}
	}
}
