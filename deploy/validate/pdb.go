package validate

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// CheckPDB checks a PodDisruptionBudget against the Deployment it
// protects: it selects the Deployment's pods, and at the Deployment's
// replica count it lets a drain take one pod at a time (not none: a drain
// would wait forever) while leaving at least one running, with rebound
// beside it consuming the inbox.
func CheckPDB(pdb *policyv1.PodDisruptionBudget, d *appsv1.Deployment) []string {
	p := &problems{prefix: "PodDisruptionBudget " + pdb.Name + ": "}
	if pdb.Namespace != d.Namespace {
		p.add("in namespace %q, Deployment %s in %q", pdb.Namespace, d.Name, d.Namespace)
	}
	if pdb.Spec.Selector == nil || len(pdb.Spec.Selector.MatchLabels)+len(pdb.Spec.Selector.MatchExpressions) == 0 {
		p.add("no selector: it would select every pod of the namespace")
		return p.list
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		p.add("selector: %v", err)
		return p.list
	}
	if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		p.add("selector %s does not match the pods of Deployment %s (%v)", sel, d.Name, d.Spec.Template.Labels)
	}
	replicas := 1
	if d.Spec.Replicas != nil {
		replicas = int(*d.Spec.Replicas)
	}
	var disruptable int
	switch {
	case pdb.Spec.MaxUnavailable != nil && pdb.Spec.MinAvailable != nil:
		p.add("sets both minAvailable and maxUnavailable")
		return p.list
	case pdb.Spec.MaxUnavailable != nil:
		n, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MaxUnavailable, replicas, false)
		if err != nil {
			p.add("maxUnavailable: %v", err)
			return p.list
		}
		disruptable = n
	case pdb.Spec.MinAvailable != nil:
		n, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MinAvailable, replicas, true)
		if err != nil {
			p.add("minAvailable: %v", err)
			return p.list
		}
		disruptable = replicas - n
	default:
		p.add("neither minAvailable nor maxUnavailable")
		return p.list
	}
	switch {
	case disruptable < 1:
		p.add("at %d replicas no pod may be evicted: a node drain waits forever", replicas)
	case disruptable >= replicas:
		p.add("at %d replicas every pod may be evicted at once: %s", replicas, describe(pdb))
	}
	return p.list
}

func describe(pdb *policyv1.PodDisruptionBudget) string {
	if v := pdb.Spec.MaxUnavailable; v != nil {
		return fmt.Sprintf("maxUnavailable %s", v.String())
	}
	return fmt.Sprintf("minAvailable %s", pdb.Spec.MinAvailable.String())
}
