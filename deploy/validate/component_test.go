package validate

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// adoptingApps and otherApp are Deployments a team already has, none
// written for rebound: billing-api carries the label in its manifest (and
// an init container of its own), ledger is named by a component of the
// overlay, reporting is not named, and audit is labelled by the overlay's
// own patch, which kustomize applies after components: too late, as the
// sidecar component's comment warns.
const adoptingApps = `
apiVersion: apps/v1
kind: Deployment
metadata:
  name: billing-api
  labels:
    rebound-mq.github.io/rebound: enabled
spec:
  replicas: 3
  selector:
    matchLabels: {app: billing-api}
  template:
    metadata:
      labels: {app: billing-api}
    spec:
      terminationGracePeriodSeconds: 45
      securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
      initContainers:
        - name: migrate
          image: example.com/billing-migrate:2.1
          securityContext: %[1]s
      containers:
        - name: api
          image: example.com/billing-api:2.1
          securityContext: %[1]s
`

// otherApp is a Deployment named %[2]s with no label for rebound.
const otherApp = `
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: %[2]s
spec:
  selector:
    matchLabels: {app: %[2]s}
  template:
    metadata:
      labels: {app: %[2]s}
    spec:
      terminationGracePeriodSeconds: 45
      securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: worker
          image: example.com/%[2]s:1.0
          securityContext: %[1]s
`

const restrictedContainer = `{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}`

const adoptingOverlay = `
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: billing
resources:
  - apps.yaml
components:
  - select
  - ../../components/vhost-config
  - ../../components/sidecar
images:
  - name: rebound
    newName: registry.example.com/platform/rebound
    newTag: "0.2.0"
secretGenerator:
  - name: rebound-amqp
    literals:
      - url=amqp://billing-rebound:secret@rabbitmq:5672/billing
    options:
      disableNameSuffixHash: true
patches:
  # What the sidecar component's comment shows: a service's own setting,
  # on its rebound container, never on the vhost's ConfigMap.
  - target:
      kind: Deployment
      name: billing-api
    patch: |-
      - op: add
        path: /spec/template/spec/initContainers/0/env/-
        value: {name: REBOUND_LOG_LEVEL, value: debug}
  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata:
        name: audit
        labels:
          rebound-mq.github.io/rebound: enabled
`

const adoptingSelect = `
apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata:
        name: ledger
        labels:
          rebound-mq.github.io/rebound: enabled
`

// TestSidecarComponentAddsReboundToTheDeploymentsNamed builds the sidecar
// component into an overlay of Deployments it has never seen, the way its
// comment tells a team to, and checks each named Deployment as the
// example's and leaves the others untouched.
func TestSidecarComponentAddsReboundToTheDeploymentsNamed(t *testing.T) {
	fs := inMemory(t)
	docs := fmt.Sprintf(adoptingApps, restrictedContainer)
	for _, name := range []string{"ledger", "reporting", "audit"} {
		docs += fmt.Sprintf(otherApp, restrictedContainer, name)
	}
	// payroll carries the label from before 0.4.0, which still selects
	// for one version.
	docs += fmt.Sprintf(strings.Replace(otherApp, "  name: %[2]s\n", "  name: %[2]s\n  labels: {rebound/sidecar: enabled}\n", 1), restrictedContainer, "payroll")
	for path, content := range map[string]string{
		"/kustomize/overlays/adopt/apps.yaml":                 docs,
		"/kustomize/overlays/adopt/kustomization.yaml":        adoptingOverlay,
		"/kustomize/overlays/adopt/select/kustomization.yaml": adoptingSelect,
	} {
		if err := fs.WriteFile(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	objs, err := BuildFS(fs, "/kustomize/overlays/adopt")
	if err != nil {
		t.Fatal(err)
	}
	deployments := map[string]*appsv1.Deployment{}
	for _, o := range objs {
		if d, ok := o.Value.(*appsv1.Deployment); ok {
			deployments[d.Name] = d
		}
	}
	if len(deployments) != 5 {
		t.Fatalf("built %d Deployments, want billing-api, ledger, reporting, audit and payroll", len(deployments))
	}
	for _, name := range []string{"billing-api", "ledger", "payroll"} {
		t.Run(name, func(t *testing.T) {
			d := deployments[name]
			checkDeployment(t, d, objs, NativeSidecar, true)
			if d.Spec.Template.Labels["rebound-mq.github.io/rebound"] != "enabled" {
				t.Errorf("pod template labels %v lack rebound-mq.github.io/rebound: enabled (the PodMonitor selects it)", d.Spec.Template.Labels)
			}
		})
	}
	var inits []string
	for _, c := range deployments["billing-api"].Spec.Template.Spec.InitContainers {
		inits = append(inits, c.Name)
	}
	// rebound first: the app's own init containers run once it is ready,
	// with the dead-letter exchange declared.
	if !slices.Equal(inits, []string{"rebound", "migrate"}) {
		t.Errorf("billing-api's init containers %v, want rebound, then its own migrate kept", inits)
	}
	for _, name := range []string{"reporting", "audit"} {
		spec := deployments[name].Spec.Template.Spec
		if len(spec.InitContainers) > 0 || len(spec.Volumes) > 0 || len(deployments[name].Spec.Template.Labels) != 1 {
			t.Errorf("%s was not named, yet the component changed it: %d init containers, volumes %v, pod labels %v",
				name, len(spec.InitContainers), spec.Volumes, deployments[name].Spec.Template.Labels)
		}
	}
	cm := only[*corev1.ConfigMap](t, objs)
	for k, v := range componentEnv(t) {
		if cm.Data[k] != v {
			t.Errorf("%s=%q in the built ConfigMap, %q in the vhost's rebound.env", k, cm.Data[k], v)
		}
	}
	if env := reboundEnv(deployments["billing-api"]); env["REBOUND_LOG_LEVEL"] != "debug" {
		t.Errorf("the overlay set REBOUND_LOG_LEVEL=debug on billing-api's rebound container, it has %v", env)
	}
}

// reboundEnv returns the env of d's rebound container.
func reboundEnv(d *appsv1.Deployment) map[string]string {
	out := map[string]string{}
	spec := d.Spec.Template.Spec
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if c.Name == ContainerName {
			for _, e := range c.Env {
				out[e.Name] = e.Value
			}
		}
	}
	return out
}

// TestNoOverlayPatchesTheVhostsVariables: no kustomization under deploy/
// (its comments included, which teams copy) sets a variable of the vhost
// (the names, the allowlist, the policies) per service: those are the
// same for every rebound of the vhost, in components/vhost-config.
func TestNoOverlayPatchesTheVhostsVariables(t *testing.T) {
	setting := regexp.MustCompile(`\b(REBOUND_[A-Z0-9_]+)\s*:|name:\s*(REBOUND_[A-Z0-9_]+)`)
	err := filepath.WalkDir(kustomizeDir, func(p string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() || filepath.Base(p) != "kustomization.yaml" {
			return err
		}
		for i, line := range strings.Split(string(read(t, p)), "\n") {
			for _, m := range setting.FindAllStringSubmatch(line, -1) {
				name := m[1] + m[2]
				if !slices.Contains(perPod, name) {
					t.Errorf("%s:%d sets %s, a variable of the vhost, outside components/vhost-config/rebound.env", p, i+1, name)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
