package validate

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// TestCheckPDBCatches breaks the example's PodDisruptionBudget one way at
// a time and expects CheckPDB to say so.
func TestCheckPDBCatches(t *testing.T) {
	objs := build(t, filepath.Join(kustomizeDir, "overlays", "example"))
	d := only[*appsv1.Deployment](t, objs)
	good := only[*policyv1.PodDisruptionBudget](t, objs)
	if ps := CheckPDB(good, d); len(ps) > 0 {
		t.Fatalf("the example itself fails: %v", ps)
	}
	pct := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	num := func(n int) *intstr.IntOrString { v := intstr.FromInt32(int32(n)); return &v }
	tests := []struct {
		name   string
		mutate func(p *policyv1.PodDisruptionBudget, d *appsv1.Deployment)
		want   string
	}{
		{"other pods", func(p *policyv1.PodDisruptionBudget, _ *appsv1.Deployment) {
			p.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "payments"}}
		}, "does not match the pods"},
		{"every pod of the namespace", func(p *policyv1.PodDisruptionBudget, _ *appsv1.Deployment) { p.Spec.Selector = &metav1.LabelSelector{} }, "no selector"},
		{"drain blocked", func(p *policyv1.PodDisruptionBudget, _ *appsv1.Deployment) {
			p.Spec.MaxUnavailable, p.Spec.MinAvailable = nil, num(2)
		}, "waits forever"},
		{"one replica", func(_ *policyv1.PodDisruptionBudget, d *appsv1.Deployment) { d.Spec.Replicas = ptr.To[int32](1) }, "every pod may be evicted"},
		{"all at once", func(p *policyv1.PodDisruptionBudget, _ *appsv1.Deployment) { p.Spec.MaxUnavailable = pct("100%") }, "every pod may be evicted"},
		{"both", func(p *policyv1.PodDisruptionBudget, _ *appsv1.Deployment) { p.Spec.MinAvailable = num(1) }, "both"},
		{"neither", func(p *policyv1.PodDisruptionBudget, _ *appsv1.Deployment) { p.Spec.MaxUnavailable = nil }, "neither"},
		{"namespace", func(p *policyv1.PodDisruptionBudget, _ *appsv1.Deployment) { p.Namespace = "default" }, "namespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, dd := good.DeepCopy(), d.DeepCopy()
			tt.mutate(p, dd)
			ps := CheckPDB(p, dd)
			if !slices.ContainsFunc(ps, func(s string) bool { return strings.Contains(s, tt.want) }) {
				t.Errorf("want a problem mentioning %q, got %q", tt.want, ps)
			}
		})
	}
	// A percentage that rounds to one pod of two passes.
	p := good.DeepCopy()
	p.Spec.MaxUnavailable = pct("50%")
	if ps := CheckPDB(p, d); len(ps) > 0 {
		t.Errorf("maxUnavailable 50%% of 2 replicas: %v", ps)
	}
}
