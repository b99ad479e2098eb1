package validate

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/rebound-mq/rebound/config"
)

const kustomizeDir = "../kustomize"

// overlays lists every overlay with the layout it must produce. An overlay
// directory missing here fails TestEveryOverlayIsChecked.
var overlays = map[string]Layout{
	"example":       NativeSidecar,
	"two-container": TwoContainers,
	"standalone":    Standalone,
}

// placeholderURL stands in for the Secret when a kustomization has none.
const placeholderURL = "amqp://rebound:secret@rabbitmq.example:5672/orders"

func TestEveryOverlayIsChecked(t *testing.T) {
	dirs, err := os.ReadDir(filepath.Join(kustomizeDir, "overlays"))
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no overlays")
	}
	for _, d := range dirs {
		if _, ok := overlays[d.Name()]; d.IsDir() && !ok {
			t.Errorf("overlay %s is not in the overlays table of this test", d.Name())
		}
	}
}

// TestBase: the sample application alone, as a team has it before
// rebound: no rebound in it, and a PodDisruptionBudget that fits it.
func TestBase(t *testing.T) {
	objs := build(t, filepath.Join(kustomizeDir, "base"))
	d := only[*appsv1.Deployment](t, objs)
	spec := d.Spec.Template.Spec
	if len(spec.InitContainers) > 0 || slices.ContainsFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == ContainerName }) {
		t.Error("the base holds rebound: it is the application alone, the sidecar component adds rebound")
	}
	for _, p := range CheckPDB(only[*policyv1.PodDisruptionBudget](t, objs), d) {
		t.Error(p)
	}
}

// perPod are the variables a service's overlay may change for its own
// pods. Every other one (names, the allowlist, the policies) is the
// vhost's: every rebound sharing the inbox must have the same, or a
// message's fate depends on the pod that takes it.
var perPod = []string{"REBOUND_LOG_LEVEL", "REBOUND_LOG_FORMAT", "REBOUND_HTTP_ADDR", "REBOUND_PREFETCH",
	"REBOUND_INFLIGHT_BYTES", "REBOUND_CONFIRM_TIMEOUT", "REBOUND_SHUTDOWN_GRACE", "REBOUND_DELAY_QUEUE_IDLE"}

// componentEnv reads the vhost-config component's rebound.env, the
// vhost's one configuration.
func componentEnv(t *testing.T) map[string]string {
	t.Helper()
	vars := map[string]string{}
	for _, line := range strings.Split(string(read(t, filepath.Join(kustomizeDir, "components", "vhost-config", "rebound.env"))), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(strings.TrimSpace(line), "#") {
			vars[k] = v
		}
	}
	return vars
}

func TestOverlays(t *testing.T) {
	shared := componentEnv(t)
	for name, layout := range overlays {
		t.Run(name, func(t *testing.T) {
			objs := build(t, filepath.Join(kustomizeDir, "overlays", name))
			checkBuilt(t, objs, layout, true)
			cm := only[*corev1.ConfigMap](t, objs)
			// One name in every namespace and every release: a content
			// hash in it would restart every service's pods at each change.
			if cm.Name != "rebound-config" {
				t.Errorf("the vhost's ConfigMap is named %s, want rebound-config (no content hash)", cm.Name)
			}
			for k, v := range shared {
				if !slices.Contains(perPod, k) && cm.Data[k] != v {
					t.Errorf("%s=%q, but the component's rebound.env, every rebound's of the vhost, has %q: patch only %s per service", k, cm.Data[k], v, strings.Join(perPod, ", "))
				}
			}
			for k := range cm.Data {
				if _, ok := shared[k]; !ok && !slices.Contains(perPod, k) {
					t.Errorf("%s is set here but not in the component's rebound.env: the vhost's variables live there", k)
				}
			}
			for _, o := range objs {
				if m, ok := o.Value.(metav1.Object); ok && m.GetNamespace() == "" {
					t.Errorf("%s %s has no namespace", o.Kind, o.Name)
				}
			}
		})
	}
}

// inMemory copies deploy/kustomize into an in-memory file system, under
// /kustomize, for tests that change or add to it.
func inMemory(t *testing.T) filesys.FileSystem {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	err := filepath.WalkDir(kustomizeDir, func(p string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return fs.WriteFile(filepath.Join("/kustomize", strings.TrimPrefix(p, kustomizeDir)), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// TestPrometheusOperatorComponent builds the example overlay with the
// optional PodMonitor component enabled the way its comment says: by
// uncommenting its line (in a copy of deploy/kustomize held in memory).
func TestPrometheusOperatorComponent(t *testing.T) {
	fs := inMemory(t)
	k := "/kustomize/overlays/example/kustomization.yaml"
	b, err := fs.ReadFile(k)
	if err != nil {
		t.Fatal(err)
	}
	enabled := strings.Replace(string(b), "  # - ../../components/prometheus-operator\n",
		"  - ../../components/prometheus-operator\n", 1)
	if enabled == string(b) {
		t.Fatal("the example overlay no longer has the commented-out component line this test enables")
	}
	if err := fs.WriteFile(k, []byte(enabled)); err != nil {
		t.Fatal(err)
	}
	objs, err := BuildFS(fs, "/kustomize/overlays/example")
	if err != nil {
		t.Fatal(err)
	}
	d := only[*appsv1.Deployment](t, objs)
	pm := only[*monitoringv1.PodMonitor](t, objs)
	sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("PodMonitor selector %s does not match the pod labels %v", sel, d.Spec.Template.Labels)
	}
	if pm.Namespace != d.Namespace {
		t.Errorf("PodMonitor in namespace %q, Deployment in %q", pm.Namespace, d.Namespace)
	}
	c := d.Spec.Template.Spec.InitContainers[slices.IndexFunc(d.Spec.Template.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == ContainerName })]
	if len(pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatalf("want one endpoint, got %d", len(pm.Spec.PodMetricsEndpoints))
	}
	ep := pm.Spec.PodMetricsEndpoints[0]
	if ep.Port == nil || !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == *ep.Port }) {
		t.Errorf("PodMonitor port %v is not a named port of the rebound container", ep.Port)
	}
	if ep.Path != "/metrics" {
		t.Errorf("PodMonitor path %q, want /metrics", ep.Path)
	}
}

// buildEdited builds overlay from a copy of deploy/kustomize held in
// memory whose overlay kustomization.yaml has old replaced by new: an
// optional component enabled the way its comment says. It fails when old
// is not there.
func buildEdited(t *testing.T, overlay, old, new string) []Object {
	t.Helper()
	fs := inMemory(t)
	k := "/kustomize/overlays/" + overlay + "/kustomization.yaml"
	b, err := fs.ReadFile(k)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(b), old, new, 1)
	if edited == string(b) {
		t.Fatalf("the %s overlay no longer has %q", overlay, old)
	}
	if err := fs.WriteFile(k, []byte(edited)); err != nil {
		t.Fatal(err)
	}
	objs, err := BuildFS(fs, "/kustomize/overlays/"+overlay)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func build(t *testing.T, dir string) []Object {
	t.Helper()
	objs, err := Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func only[T any](t *testing.T, objs []Object) T {
	t.Helper()
	v, err := Only[T](objs)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// checkBuilt runs every check on one kustomize build of rebound beside
// one application: the pod, its configuration and its disruption budget.
func checkBuilt(t *testing.T, objs []Object, layout Layout, wantSecret bool) {
	t.Helper()
	d := only[*appsv1.Deployment](t, objs)
	checkDeployment(t, d, objs, layout, wantSecret)
	for _, p := range CheckPDB(only[*policyv1.PodDisruptionBudget](t, objs), d) {
		t.Error(p)
	}
}

// checkDeployment runs CheckPod on d with the build's ConfigMap and
// Secret, and checks the ConfigMap as config.Load reads it.
func checkDeployment(t *testing.T, d *appsv1.Deployment, objs []Object, layout Layout, wantSecret bool) {
	t.Helper()
	cm := only[*corev1.ConfigMap](t, objs)
	var secret *corev1.Secret
	url := placeholderURL
	if wantSecret {
		secret = only[*corev1.Secret](t, objs)
		url = string(secret.Data["url"])
	}
	cfg, problems := LoadConfigMap(cm, t.TempDir(), url)
	for _, p := range problems {
		t.Error(p)
	}
	if cfg.AMQPURL != url {
		t.Errorf("config.Load read the broker URL %q, want the file's %q", config.Redact(cfg.AMQPURL), config.Redact(url))
	}
	in := PodInput{Layout: layout, ConfigMap: cm, Secret: secret, Config: cfg, Deployable: wantSecret}
	for _, p := range CheckPod(d, in) {
		t.Error(p)
	}
}

// exampleInput builds the example overlay once for the negative tests.
func exampleInput(t *testing.T) (*appsv1.Deployment, PodInput) {
	t.Helper()
	objs := build(t, filepath.Join(kustomizeDir, "overlays", "example"))
	d := only[*appsv1.Deployment](t, objs)
	cm := only[*corev1.ConfigMap](t, objs)
	secret := only[*corev1.Secret](t, objs)
	cfg, problems := LoadConfigMap(cm, t.TempDir(), string(secret.Data["url"]))
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	return d, PodInput{Layout: NativeSidecar, ConfigMap: cm, Secret: secret, Config: cfg, Deployable: true}
}

func reboundContainer(d *appsv1.Deployment) *corev1.Container {
	return &d.Spec.Template.Spec.InitContainers[0]
}

// TestCheckPodCatches breaks the example Deployment one way at a time and
// expects CheckPod to say so: the checks above can fail.
func TestCheckPodCatches(t *testing.T) {
	good, in := exampleInput(t)
	if ps := CheckPod(good, in); len(ps) > 0 {
		t.Fatalf("the example itself fails: %v", ps)
	}
	tests := []struct {
		name   string
		mutate func(d *appsv1.Deployment, in *PodInput)
		want   string
	}{
		{"no restartPolicy", func(d *appsv1.Deployment, _ *PodInput) { reboundContainer(d).RestartPolicy = nil }, "restartPolicy: Always"},
		{"wrong layout", func(_ *appsv1.Deployment, in *PodInput) { in.Layout = TwoContainers }, `no container "rebound"`},
		{"rebound twice", func(d *appsv1.Deployment, _ *PodInput) {
			spec := &d.Spec.Template.Spec
			spec.Containers = append(spec.Containers, *reboundContainer(d))
		}, `"rebound" is both an init container and a container`},
		{"rebound twice, two-container layout", func(d *appsv1.Deployment, in *PodInput) {
			spec := &d.Spec.Template.Spec
			spec.Containers = append(spec.Containers, *reboundContainer(d))
			spec.Containers[len(spec.Containers)-1].RestartPolicy = nil
			in.Layout = TwoContainers
		}, `"rebound" is both an init container and a container`},
		{"writable root", func(d *appsv1.Deployment, _ *PodInput) {
			reboundContainer(d).SecurityContext.ReadOnlyRootFilesystem = ptr.To(false)
		}, "readOnlyRootFilesystem"},
		{"escalation", func(d *appsv1.Deployment, _ *PodInput) {
			reboundContainer(d).SecurityContext.AllowPrivilegeEscalation = nil
		}, "allowPrivilegeEscalation"},
		{"capabilities kept", func(d *appsv1.Deployment, _ *PodInput) { reboundContainer(d).SecurityContext.Capabilities = nil }, "drop ALL"},
		{"app escalation", func(d *appsv1.Deployment, _ *PodInput) {
			d.Spec.Template.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
		}, "app: allowPrivilegeEscalation"},
		{"a sidecar ready on readyz (the broker would hold the pod)", func(d *appsv1.Deployment, _ *PodInput) { reboundContainer(d).ReadinessProbe.HTTPGet.Path = "/readyz" }, "readiness probe path"},
		{"a sidecar started on readyz (the broker would hold the app)", func(d *appsv1.Deployment, _ *PodInput) { reboundContainer(d).StartupProbe.HTTPGet.Path = "/readyz" }, "startup probe path"},
		{"liveness on readyz", func(d *appsv1.Deployment, _ *PodInput) { reboundContainer(d).LivenessProbe.HTTPGet.Path = "/readyz" }, "liveness probe path"},
		{"impatient liveness", func(d *appsv1.Deployment, _ *PodInput) { reboundContainer(d).LivenessProbe.FailureThreshold = 1 }, "liveness probe gives up"},
		{"probe port", func(d *appsv1.Deployment, _ *PodInput) {
			reboundContainer(d).ReadinessProbe.HTTPGet.Port.StrVal = "http"
		}, "readiness probe port"},
		{"http addr", func(_ *appsv1.Deployment, in *PodInput) { in.Config.HTTPAddr = ":8080" }, "no containerPort 8080"},
		{"no startup probe", func(d *appsv1.Deployment, _ *PodInput) { reboundContainer(d).StartupProbe = nil }, "no startup probe"},
		{"no envFrom", func(d *appsv1.Deployment, _ *PodInput) { reboundContainer(d).EnvFrom = nil }, "envFrom"},
		{"url in env", func(d *appsv1.Deployment, _ *PodInput) {
			reboundContainer(d).Env = append(reboundContainer(d).Env, corev1.EnvVar{Name: "REBOUND_AMQP_URL", Value: placeholderURL})
		}, "password"},
		{"url file elsewhere", func(d *appsv1.Deployment, _ *PodInput) { reboundContainer(d).Env[0].Value = "/tmp/url" }, "under no volume mount"},
		{"no pod name", func(d *appsv1.Deployment, _ *PodInput) {
			reboundContainer(d).Env[1].ValueFrom.FieldRef.FieldPath = "spec.nodeName"
		}, "POD_NAME"},
		{"unreadable url", func(d *appsv1.Deployment, _ *PodInput) {
			d.Spec.Template.Spec.Volumes[0].Secret.DefaultMode = ptr.To[int32](0o400)
		}, "not readable"},
		{"writable url mount", func(d *appsv1.Deployment, _ *PodInput) { reboundContainer(d).VolumeMounts[0].ReadOnly = false }, "readOnly"},
		{"cpu limit", func(d *appsv1.Deployment, _ *PodInput) {
			reboundContainer(d).Resources.Limits[corev1.ResourceCPU] = resource.MustParse("100m")
		}, "CPU limit"},
		{"memlimit literal", func(d *appsv1.Deployment, _ *PodInput) {
			c := reboundContainer(d)
			c.Env = append(c.Env, corev1.EnvVar{Name: "GOMEMLIMIT", Value: "144MiB"})
		}, "GOMEMLIMIT"},
		{"short grace", func(d *appsv1.Deployment, _ *PodInput) {
			d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](20)
		}, "terminationGracePeriodSeconds"},
		{"latest image", func(d *appsv1.Deployment, _ *PodInput) { reboundContainer(d).Image = "rebound:latest" }, "pin a tag"},
		{"root user", func(d *appsv1.Deployment, _ *PodInput) {
			reboundContainer(d).SecurityContext.RunAsUser = ptr.To[int64](0)
		}, "runs as root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := good.DeepCopy()
			in := in
			tt.mutate(d, &in)
			ps := CheckPod(d, in)
			if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tt.want) }) {
				t.Errorf("want a problem mentioning %q, got %q", tt.want, ps)
			}
		})
	}
}

func TestLoadConfigMapCatches(t *testing.T) {
	tests := []struct {
		name string
		data map[string]string
		want string
	}{
		{"misspelt variable", map[string]string{"REBOUND_MAX_RETRY": "3"}, "not a variable rebound reads"},
		{"invalid value", map[string]string{"REBOUND_BACKOFF": "fibonacci"}, "REBOUND_BACKOFF"},
		{"url in configmap", map[string]string{"REBOUND_AMQP_URL": placeholderURL}, "belongs in the Secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}, Data: tt.data}
			_, ps := LoadConfigMap(cm, t.TempDir(), placeholderURL)
			if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tt.want) }) {
				t.Errorf("want a problem mentioning %q, got %q", tt.want, ps)
			}
		})
	}
}

// TestDecodeStrictRejects shows the decoder refuses what the API server's
// strict validation refuses.
func TestDecodeStrictRejects(t *testing.T) {
	const head = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\n"
	tests := []struct {
		name, doc, want string
	}{
		{"unknown field", head + "spec:\n  replicas: 1\n  replica: 2\n", `unknown field "spec.replica"`},
		{"wrong capitals", head + "spec:\n  Replicas: 1\n", `unknown field "spec.Replicas"`},
		{"nested unknown field", head + "spec:\n  template:\n    spec:\n      initContainers:\n        - name: rebound\n          restartpolicy: Always\n", "restartpolicy"},
		{"duplicate key", head + "spec:\n  replicas: 1\n  replicas: 2\n", "replicas"},
		{"wrong type", head + "spec:\n  replicas: two\n", "replicas"},
		{"unknown kind", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n", "not one deploy/validate knows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeStrict([]byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("want an error mentioning %q, got %v", tt.want, err)
			}
		})
	}
	if _, err := DecodeStrict([]byte(head + "spec:\n  replicas: 1\n")); err != nil {
		t.Errorf("a valid Deployment is rejected: %v", err)
	}
}

// TestParkedExpireComponent builds the standalone overlay with the
// parked-expire component added as its comment says (in a copy of
// deploy/kustomize held in memory): the CronJob runs `rebound parked
// expire --yes` with the image, ConfigMap and Secret the Deployment's
// rebound uses, one run at a time, a retention config.Load accepts, and
// the restricted security context.
func TestParkedExpireComponent(t *testing.T) {
	objs := buildEdited(t, "standalone", "  - ../../components/sidecar\n", "  - ../../components/sidecar\n  - ../../components/parked-expire\n")
	d := only[*appsv1.Deployment](t, objs)
	cj := only[*batchv1.CronJob](t, objs)
	job := cj.Spec.JobTemplate.Spec.Template.Spec
	spec := d.Spec.Template.Spec
	i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == ContainerName })
	if i < 0 {
		t.Fatal("the standalone Deployment has no rebound container")
	}
	rebound := spec.Containers[i] // standalone: an ordinary container
	if len(job.Containers) != 1 {
		t.Fatalf("the job has %d containers, want 1", len(job.Containers))
	}
	c := job.Containers[0]
	if !slices.Equal(c.Args, []string{"parked", "expire", "--yes"}) || c.Image != rebound.Image {
		t.Errorf("the job runs %s %v, want the Deployment's image %s with parked expire --yes", c.Image, c.Args, rebound.Image)
	}
	if cj.Namespace != d.Namespace || cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent || job.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("namespace %q (want %q), concurrency %q (want Forbid), restart %q (want Never)", cj.Namespace, d.Namespace, cj.Spec.ConcurrencyPolicy, job.RestartPolicy)
	}
	if !reflect.DeepEqual(c.EnvFrom, rebound.EnvFrom) || !reflect.DeepEqual(job.Volumes, spec.Volumes) || !reflect.DeepEqual(c.VolumeMounts, rebound.VolumeMounts) {
		t.Errorf("the job's configuration (%v, %v, %v) is not the Deployment's rebound's (%v, %v, %v)",
			c.EnvFrom, job.Volumes, c.VolumeMounts, rebound.EnvFrom, spec.Volumes, rebound.VolumeMounts)
	}
	environ := []string{}
	for _, e := range c.Env {
		if e.Name == "REBOUND_AMQP_URL_FILE" {
			continue // a file of the pod
		}
		environ = append(environ, e.Name+"="+e.Value)
	}
	cfg, err := config.Load(environ)
	if err != nil || cfg.ParkedRetention <= 0 {
		t.Errorf("the job's retention: %v, %v; want a retention config.Load accepts", cfg.ParkedRetention, err)
	}
	sc := c.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("the job's security context %+v is not the restricted profile's", sc)
	}
}

// TestCheckSpreadCatches: a standalone Deployment needs two replicas
// spread over nodes by a constraint that selects its own pods.
func TestCheckSpreadCatches(t *testing.T) {
	good := func() *appsv1.Deployment {
		d := &appsv1.Deployment{}
		d.Spec.Replicas = ptr.To[int32](2)
		d.Spec.Template.Labels = map[string]string{"app.kubernetes.io/name": "rebound"}
		d.Spec.Template.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.ScheduleAnyway,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "rebound"}},
		}}
		return d
	}
	p := &problems{}
	checkSpread(p, good())
	if len(p.list) > 0 {
		t.Fatalf("a good Deployment: %v", p.list)
	}
	for name, tc := range map[string]struct {
		mutate func(*appsv1.Deployment)
		want   string
	}{
		"one replica": {func(d *appsv1.Deployment) { d.Spec.Replicas = ptr.To[int32](1) }, "fewer than 2 replicas"},
		"no spread":   {func(d *appsv1.Deployment) { d.Spec.Template.Spec.TopologySpreadConstraints = nil }, "topologySpreadConstraints"},
		"spread by zone": {func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.TopologySpreadConstraints[0].TopologyKey = "topology.kubernetes.io/zone"
		}, "topologySpreadConstraints"},
		"selects others": {func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.TopologySpreadConstraints[0].LabelSelector.MatchLabels["app.kubernetes.io/name"] = "orders"
		}, "topologySpreadConstraints"},
		"empty selector": {func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.TopologySpreadConstraints[0].LabelSelector = &metav1.LabelSelector{}
		}, "topologySpreadConstraints"},
	} {
		d := good()
		tc.mutate(d)
		p := &problems{}
		checkSpread(p, d)
		if len(p.list) != 1 || !strings.Contains(p.list[0], tc.want) {
			t.Errorf("%s: %v, want one problem naming %q", name, p.list, tc.want)
		}
	}
}
