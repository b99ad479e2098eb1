package validate

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/rebound-mq/rebound/config"
)

// TestConsole: the console's Deployment runs `rebound console` alone in
// its pod, from the sidecar's ConfigMap and a broker URL without a
// password, listens where its probes and Service look, and runs as the
// restricted profile asks.
func TestConsole(t *testing.T) {
	objs := build(t, filepath.Join(kustomizeDir, "console"))
	checkConsole(t, objs)
	checkConsoleNetworkPolicy(t, objs)
}

// checkConsoleNetworkPolicy: a console serving plain HTTP behind a
// TLS-terminating proxy admits, on its port only, the pods of named
// namespaces (the ingress controller's), never every pod.
func checkConsoleNetworkPolicy(t *testing.T, objs []Object) {
	t.Helper()
	d := only[*appsv1.Deployment](t, objs)
	np := only[*networkingv1.NetworkPolicy](t, objs)
	selector, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || selector.Empty() || !selector.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("NetworkPolicy %s selects %v, want the console's pod alone", np.Name, np.Spec.PodSelector)
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Errorf("NetworkPolicy %s policy types %v, want Ingress", np.Name, np.Spec.PolicyTypes)
	}
	if len(np.Spec.Ingress) == 0 {
		t.Errorf("NetworkPolicy %s admits nothing: the ingress controller cannot reach the console", np.Name)
	}
	for _, rule := range np.Spec.Ingress {
		if len(rule.From) == 0 {
			t.Errorf("NetworkPolicy %s: a rule admits every source", np.Name)
		}
		for _, from := range rule.From {
			if from.NamespaceSelector == nil || len(from.NamespaceSelector.MatchLabels)+len(from.NamespaceSelector.MatchExpressions) == 0 || from.IPBlock != nil {
				t.Errorf("NetworkPolicy %s admits %+v, want named namespaces only", np.Name, from)
			}
		}
		if len(rule.Ports) != 1 || rule.Ports[0].Port == nil || rule.Ports[0].Port.String() != "console" {
			t.Errorf("NetworkPolicy %s ports %+v, want the console port alone", np.Name, rule.Ports)
		}
	}
}

// checkConsole checks a rendering of the console (its Deployment, Service
// and the vhost's ConfigMap), the kustomization's or the chart's.
func checkConsole(t *testing.T, objs []Object) {
	t.Helper()
	d := only[*appsv1.Deployment](t, objs)
	svc := only[*corev1.Service](t, objs)
	cm := only[*corev1.ConfigMap](t, objs)
	if _, err := Only[*corev1.Secret](objs); err == nil {
		t.Error("the console carries a Secret: it needs no broker password")
	}
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 0 {
		t.Fatalf("want one container and no init container, got %d and %d", len(spec.Containers), len(spec.InitContainers))
	}
	c := spec.Containers[0]
	if strings.Join(c.Args, " ") != "console" {
		t.Errorf("args %q, want [console]", c.Args)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Error("want one replica: sessions live in the console's memory")
	}
	if len(c.EnvFrom) != 1 || c.EnvFrom[0].ConfigMapRef == nil || c.EnvFrom[0].ConfigMapRef.Name != cm.Name {
		t.Errorf("envFrom %v, want the ConfigMap %s", c.EnvFrom, cm.Name)
	}
	environ := []string{}
	for k, v := range cm.Data {
		environ = append(environ, k+"="+v)
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			environ = append(environ, e.Name+"="+e.Value)
		}
	}
	cfg, err := config.Load(environ)
	if err != nil {
		t.Fatalf("config.Load: %v", err)
	}
	if u, err := amqp.ParseURI(cfg.AMQPURL); err != nil || strings.Contains(cfg.AMQPURL, "@") {
		t.Errorf("REBOUND_AMQP_URL %q: want a broker URL without user or password (%v)", config.Redact(cfg.AMQPURL), err)
	} else if u.Vhost == "" {
		t.Error("REBOUND_AMQP_URL names no virtual host")
	}
	if err := cfg.CheckConsoleListen(); err != nil {
		t.Errorf("the console would refuse to start: %v", err)
	}
	_, port, _ := strings.Cut(cfg.ConsoleAddr, ":")
	var named *corev1.ContainerPort
	for i, p := range c.Ports {
		if strconv.Itoa(int(p.ContainerPort)) == port {
			named = &c.Ports[i]
		}
	}
	if named == nil {
		t.Fatalf("no container port for REBOUND_CONSOLE_ADDR %s", cfg.ConsoleAddr)
	}
	for name, probe := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != "/healthz" || probe.HTTPGet.Port.String() != named.Name {
			t.Errorf("%s probe %v: want GET /healthz on port %s", name, probe, named.Name)
		}
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != named.Name {
		t.Errorf("Service ports %v: want one, targeting %s", svc.Spec.Ports, named.Name)
	}
	for k, v := range svc.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("the Service selects %s=%s, which the pod does not carry", k, v)
		}
	}
	sc := c.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 {
		t.Errorf("security context %v: want the restricted profile's", sc)
	}
	p := &problems{}
	checkImage(p, c.Image)
	for _, problem := range p.list {
		t.Error(problem)
	}
}
