package validate

import (
	"cmp"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestKEDAComponent builds the standalone overlay with the optional KEDA
// component enabled the way its comment says, and checks that the
// ScaledObject scales that Deployment on its inbox, never to zero, with
// the broker URL from the Secret rebound reads.
func TestKEDAComponent(t *testing.T) {
	objs := buildEdited(t, "standalone", "  # - ../../components/keda\n", "  - ../../components/keda\n")
	d := only[*appsv1.Deployment](t, objs)
	so := only[*ScaledObject](t, objs)
	auth := only[*TriggerAuthentication](t, objs)
	cm := only[*corev1.ConfigMap](t, objs)
	secret := only[*corev1.Secret](t, objs)

	if so.Spec.ScaleTargetRef.Name != d.Name || so.Namespace != d.Namespace {
		t.Errorf("ScaledObject targets %s/%s, the Deployment is %s/%s", so.Namespace, so.Spec.ScaleTargetRef.Name, d.Namespace, d.Name)
	}
	if so.Spec.MinReplicaCount == nil || d.Spec.Replicas == nil || *so.Spec.MinReplicaCount < *d.Spec.Replicas {
		t.Errorf("minReplicaCount %v below the Deployment's %v replicas, which its PodDisruptionBudget and spread assume (and held copies need a replica the inbox's trigger cannot see)",
			so.Spec.MinReplicaCount, d.Spec.Replicas)
	}
	if so.Spec.MaxReplicaCount == nil || *so.Spec.MaxReplicaCount < *so.Spec.MinReplicaCount {
		t.Errorf("maxReplicaCount %v below minReplicaCount", so.Spec.MaxReplicaCount)
	}
	if len(so.Spec.Triggers) != 1 {
		t.Fatalf("%d triggers, want the inbox's", len(so.Spec.Triggers))
	}
	tr := so.Spec.Triggers[0]
	inbox := cmp.Or(cm.Data["REBOUND_INBOX_QUEUE"], "rebound.inbox")
	if tr.Type != "rabbitmq" || tr.Metadata["queueName"] != inbox || tr.Metadata["mode"] != "QueueLength" {
		t.Errorf("trigger %s on %q mode %q, want rabbitmq QueueLength on the inbox %q", tr.Type, tr.Metadata["queueName"], tr.Metadata["mode"], inbox)
	}
	if tr.AuthenticationRef == nil || tr.AuthenticationRef.Name != auth.Name || auth.Namespace != d.Namespace {
		t.Errorf("trigger authenticates with %v, the build's TriggerAuthentication is %s/%s", tr.AuthenticationRef, auth.Namespace, auth.Name)
	}
	if len(auth.Spec.SecretTargetRef) != 1 {
		t.Fatalf("TriggerAuthentication has %d secret refs, want the broker URL's", len(auth.Spec.SecretTargetRef))
	}
	ref := auth.Spec.SecretTargetRef[0]
	if ref.Parameter != "host" || ref.Name != secret.Name {
		t.Errorf("TriggerAuthentication gives %s from Secret %s, want host from %s", ref.Parameter, ref.Name, secret.Name)
	}
	if _, ok := secret.Data[ref.Key]; !ok {
		if _, ok := secret.StringData[ref.Key]; !ok {
			t.Errorf("Secret %s has no key %q", secret.Name, ref.Key)
		}
	}
}
