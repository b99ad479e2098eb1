package validate

import (
	"bytes"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
)

const chartDir = "../helm/rebound"

// helm runs the Helm pinned in tools/go.mod (go tool helm): no download,
// the same Helm on every machine. An argument "CHART" is the chart's
// directory.
func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// runHelm runs helm and returns its output: stdout, and after it stderr
// when helm failed.
func runHelm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	chart, err := filepath.Abs(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	args = slices.Clone(args)
	for i, a := range args {
		if a == "CHART" {
			args[i] = chart
		}
	}
	cmd := exec.Command("go", append([]string{"tool", "helm"}, args...)...)
	cmd.Dir = "../../tools"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		out = append(out, stderr.Bytes()...)
	}
	return out, err
}

// renderChart renders the chart as `helm template` does and decodes each
// object as strictly as the API server would. Each "key=value" is a --set;
// "show-only=templates/x.yaml" keeps that template's objects only.
func renderChart(t *testing.T, set ...string) []Object {
	t.Helper()
	args := []string{"template", "rebound", "CHART", "--namespace", "messaging"}
	for _, s := range set {
		if template, ok := strings.CutPrefix(s, "show-only="); ok {
			args = append(args, "--show-only", template)
			continue
		}
		args = append(args, "--set", s)
	}
	var objs []Object
	for _, doc := range strings.Split(string(helm(t, args...)), "\n---\n") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
			continue
		}
		o, err := DecodeStrict([]byte(doc))
		if err != nil {
			t.Fatalf("rendered chart: %v\n%s", err, doc)
		}
		objs = append(objs, o)
	}
	return objs
}

func TestHelmLint(t *testing.T) {
	out := helm(t, "lint", "--strict", "CHART")
	if !bytes.Contains(out, []byte("1 chart(s) linted, 0 chart(s) failed")) {
		t.Errorf("helm lint: %s", out)
	}
}

// TestHelmChart runs every check the standalone kustomize layout gets on
// the chart's rendering: the pod (probes, security context, resources,
// the broker URL mount), its ConfigMap as config.Load reads it, and the
// PodDisruptionBudget against the Deployment.
func TestHelmChart(t *testing.T) {
	objs := renderChart(t, "amqp.url=amqp://orders-rebound:change-me@rabbitmq.messaging.svc:5672/orders")
	checkBuilt(t, objs, Standalone, true)
}

// TestHelmChartConfigIsTheVhostConfig: with its default values the chart
// writes the same rebound.env as components/vhost-config, so the two ways
// in cannot drift apart; the chart adds only REBOUND_DELAY_MODE, a value
// of its own.
func TestHelmChartConfigIsTheVhostConfig(t *testing.T) {
	chart := only[*corev1.ConfigMap](t, renderChart(t)).Data
	kustomized := only[*corev1.ConfigMap](t, build(t, filepath.Join(kustomizeDir, "overlays", "standalone"))).Data
	for k, want := range kustomized {
		if got, ok := chart[k]; !ok || got != want {
			t.Errorf("chart's %s = %q, components/vhost-config's %q", k, got, want)
		}
	}
	extra := slices.DeleteFunc(slices.Sorted(maps.Keys(chart)), func(k string) bool { _, ok := kustomized[k]; return ok })
	if !slices.Equal(extra, []string{"REBOUND_DELAY_MODE"}) {
		t.Errorf("chart's ConfigMap adds %v, want only REBOUND_DELAY_MODE", extra)
	}
}

// TestHelmChartValues: the values a team sets reach the objects.
func TestHelmChartValues(t *testing.T) {
	objs := renderChart(t, "amqp.existingSecret=orders-amqp", "delayMode=hold", "queueType=quorum",
		// helm --set unescapes one backslash: it reads ^slow\\. and stores ^slow\.
		"policies.slow.QUEUES=^slow\\\\.",
		"image.digest=sha256:"+strings.Repeat("ab", 32), "serviceMonitor.enabled=true")
	cm := only[*corev1.ConfigMap](t, objs).Data
	for k, want := range map[string]string{
		"REBOUND_DELAY_MODE": "hold", "REBOUND_QUEUE_TYPE": "quorum",
		"REBOUND_POLICIES": "payments,slow", "REBOUND_POLICY_SLOW_QUEUES": `^slow\.`,
	} {
		if cm[k] != want {
			t.Errorf("%s = %q, want %q", k, cm[k], want)
		}
	}
	for _, o := range objs {
		if _, ok := o.Value.(*corev1.Secret); ok {
			t.Error("with amqp.existingSecret the chart still writes a Secret")
		}
	}
	d := only[*appsv1.Deployment](t, objs).Spec.Template.Spec.Containers[0] // standalone: an ordinary container
	if !strings.HasSuffix(d.Image, "@sha256:"+strings.Repeat("ab", 32)) {
		t.Errorf("image %q, want the digest", d.Image)
	}
	sm := only[*monitoringv1.ServiceMonitor](t, objs)
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "rebound-http" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %+v, want rebound-http /metrics", sm.Spec.Endpoints)
	}
	only[*corev1.Service](t, objs)
}

// TestHelmChartConsole: the chart's console gets the kustomization's checks,
// and no selector of the retrier's takes its pod.
func TestHelmChartConsole(t *testing.T) {
	set := []string{"amqp.existingSecret=orders-amqp", "console.enabled=true",
		"console.brokerURL=amqp://rabbitmq.messaging.svc:5672/orders", "console.behindTLSProxy=true"}
	consoleObjs := renderChart(t, append(set, "show-only=templates/console.yaml", "show-only=templates/configmap.yaml")...)
	checkConsole(t, consoleObjs)
	checkConsoleNetworkPolicy(t, consoleObjs)
	if objs := renderChart(t, append(set, "show-only=templates/console.yaml", "console.ingressNamespaces=null")...); slices.ContainsFunc(objs, func(o Object) bool { return o.Kind == "NetworkPolicy" }) {
		t.Error("console.ingressNamespaces emptied still renders a NetworkPolicy")
	}

	var console *appsv1.Deployment
	objs := renderChart(t, append(set, "serviceMonitor.enabled=true")...)
	for _, o := range objs {
		if d, ok := o.Value.(*appsv1.Deployment); ok && d.Name == "rebound-console" {
			console = d
		}
	}
	if console == nil {
		t.Fatal("console.enabled=true renders no Deployment rebound-console")
	}
	pod := labels.Set(console.Spec.Template.Labels)
	for _, o := range objs {
		var selector map[string]string
		switch v := o.Value.(type) {
		case *appsv1.Deployment:
			if v.Name != console.Name {
				selector = v.Spec.Selector.MatchLabels
			}
		case *policyv1.PodDisruptionBudget:
			selector = v.Spec.Selector.MatchLabels
		case *corev1.Service:
			if v.Name != "rebound-console" {
				selector = v.Spec.Selector
			}
		}
		if selector != nil && labels.SelectorFromSet(selector).Matches(pod) {
			t.Errorf("%s %s selects %v, which takes the console's pod", o.Kind, o.Name, selector)
		}
	}

	if out, err := runHelm(t, "template", "r", "CHART", "--set", "amqp.existingSecret=orders-amqp", "--set", "console.enabled=true",
		"--set", "console.brokerURL=amqp://rabbitmq.messaging.svc:5672/orders"); err == nil || !strings.Contains(string(out), "console.behindTLSProxy") {
		t.Errorf("the console with neither console.tlsSecret nor console.behindTLSProxy renders (%v): want helm to refuse it, naming both\n%s", err, out)
	}
	if out, err := runHelm(t, "template", "r", "CHART", "--set", "amqp.existingSecret=orders-amqp", "--set", "console.enabled=true",
		"--set", "console.behindTLSProxy=true"); err == nil || !strings.Contains(string(out), "console.brokerURL") {
		t.Errorf("console.enabled without console.brokerURL renders (%v); want helm to refuse it, naming it\n%s", err, out)
	}
}

// TestHelmChartPrometheusRule: the chart's rules are the rules file's, so
// the copy in the chart cannot drift from deploy/prometheus.
func TestHelmChartPrometheusRule(t *testing.T) {
	chartCopy := read(t, filepath.Join(chartDir, "files", "rebound-alerts.yaml"))
	if !bytes.Equal(chartCopy, read(t, rulesFile)) {
		t.Errorf("%s/files/rebound-alerts.yaml differs from %s: copy it again", chartDir, rulesFile)
	}
	groups, problems := CheckRules(read(t, rulesFile))
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	objs := renderChart(t, "prometheusRule.enabled=true", "prometheusRule.labels.release=kube-prometheus-stack",
		"show-only=templates/prometheusrule.yaml")
	pr := only[*monitoringv1.PrometheusRule](t, objs)
	for _, p := range SameRules(groups, pr) {
		t.Error(p)
	}
	if pr.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("labels %v: want prometheusRule.labels among them", pr.Labels)
	}
}
