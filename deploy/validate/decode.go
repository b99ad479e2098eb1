package validate

import (
	"fmt"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Object is one manifest decoded into its Kubernetes API type.
type Object struct {
	APIVersion string
	Kind       string
	Name       string
	// Value is a pointer to the typed object, for example *appsv1.Deployment.
	Value any
}

// kinds are the API types deploy/ may contain. A manifest of any other kind
// is an error, so a new kind cannot slip in unchecked: add it here.
var kinds = map[string]func() any{
	"apps/v1 Deployment":                      func() any { return &appsv1.Deployment{} },
	"batch/v1 CronJob":                        func() any { return &batchv1.CronJob{} },
	"v1 ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1 Secret":                               func() any { return &corev1.Secret{} },
	"v1 Service":                              func() any { return &corev1.Service{} },
	"policy/v1 PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1 NetworkPolicy":      func() any { return &networkingv1.NetworkPolicy{} },
	"monitoring.coreos.com/v1 PodMonitor":     func() any { return &monitoringv1.PodMonitor{} },
	"monitoring.coreos.com/v1 ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1 PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
	"keda.sh/v1alpha1 ScaledObject":           func() any { return &ScaledObject{} },
	"keda.sh/v1alpha1 TriggerAuthentication":  func() any { return &TriggerAuthentication{} },
}

// DecodeStrict decodes one YAML document into the API type its apiVersion
// and kind name, as strictly as the API server's strict field validation
// (kubectl apply --validate=strict): a field the type does not have, a
// field spelled with other capitals, and a key given twice are errors.
func DecodeStrict(doc []byte) (Object, error) {
	// YAMLToJSONStrict rejects duplicate keys.
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return Object{}, fmt.Errorf("yaml: %w", err)
	}
	var tm metav1.TypeMeta
	if err := kjson.UnmarshalCaseSensitivePreserveInts(j, &tm); err != nil {
		return Object{}, fmt.Errorf("apiVersion and kind: %w", err)
	}
	key := tm.APIVersion + " " + tm.Kind
	newValue, ok := kinds[key]
	if !ok {
		return Object{}, fmt.Errorf("kind %q: not one deploy/validate knows; add its Go type to kinds", key)
	}
	v := newValue()
	strictErrs, err := kjson.UnmarshalStrict(j, v)
	if err != nil {
		return Object{}, fmt.Errorf("%s: %w", key, err)
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, len(strictErrs))
		for i, e := range strictErrs {
			msgs[i] = e.Error()
		}
		return Object{}, fmt.Errorf("%s: %s", key, strings.Join(msgs, "; "))
	}
	name := ""
	if m, ok := v.(metav1.Object); ok {
		name = m.GetName()
	}
	return Object{APIVersion: tm.APIVersion, Kind: tm.Kind, Name: name, Value: v}, nil
}

// Build runs kustomize on the kustomization in dir, as kubectl kustomize
// does, and decodes every object it produces with DecodeStrict.
func Build(dir string) ([]Object, error) {
	return BuildFS(filesys.MakeFsOnDisk(), dir)
}

// BuildFS is Build on another file system.
func BuildFS(fs filesys.FileSystem, dir string) ([]Object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(fs, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var objs []Object
	for _, r := range m.Resources() {
		doc, err := r.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		o, err := DecodeStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		objs = append(objs, o)
	}
	return objs, nil
}

// Only returns the one object of type T in objs, or an error when there is
// none or more than one.
func Only[T any](objs []Object) (T, error) {
	var found []T
	for _, o := range objs {
		if v, ok := o.Value.(T); ok {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		return zero, fmt.Errorf("want exactly one %T, found %d", zero, len(found))
	}
	return found[0], nil
}
