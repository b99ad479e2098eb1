package validate

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/rebound-mq/rebound/config"
)

// TestConsole: the console's Deployment runs `rebound console` alone in
// its pod, from the sidecar's ConfigMap and a broker URL without a
// password, listens where its probes and Service look, and runs as the
// restricted profile asks.
func TestConsole(t *testing.T) {
	checkConsole(t, build(t, filepath.Join(kustomizeDir, "console")))
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
