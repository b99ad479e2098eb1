package validate

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// ScaledObject is the part of KEDA's keda.sh/v1alpha1 ScaledObject that
// deploy/ uses, declared here rather than importing KEDA's module: strict
// decoding then rejects a field spelled wrong, or one KEDA does not have.
type ScaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              ScaledObjectSpec `json:"spec"`
}

// ScaledObjectSpec is a ScaledObject's spec.
type ScaledObjectSpec struct {
	ScaleTargetRef struct {
		Name       string `json:"name"`
		Kind       string `json:"kind,omitempty"`
		APIVersion string `json:"apiVersion,omitempty"`
	} `json:"scaleTargetRef"`
	MinReplicaCount *int32          `json:"minReplicaCount,omitempty"`
	MaxReplicaCount *int32          `json:"maxReplicaCount,omitempty"`
	PollingInterval *int32          `json:"pollingInterval,omitempty"`
	CooldownPeriod  *int32          `json:"cooldownPeriod,omitempty"`
	Triggers        []ScaledTrigger `json:"triggers"`
}

// ScaledTrigger is one of a ScaledObject's triggers.
type ScaledTrigger struct {
	Type              string            `json:"type"`
	Name              string            `json:"name,omitempty"`
	Metadata          map[string]string `json:"metadata"`
	AuthenticationRef *struct {
		Name string `json:"name"`
	} `json:"authenticationRef,omitempty"`
}

// TriggerAuthentication is the part of KEDA's keda.sh/v1alpha1
// TriggerAuthentication that deploy/ uses.
type TriggerAuthentication struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretTargetRef []struct {
			Parameter string `json:"parameter"`
			Name      string `json:"name"`
			Key       string `json:"key"`
		} `json:"secretTargetRef"`
	} `json:"spec"`
}
