package e2e

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// waitDelivered checks that the backend recorded on the consumer's
// ClusterBinding that the response was handed out (and that the bind
// completed), the marks the garbage collection of unused bindings relies on.
func (e *env) waitDelivered(t *testing.T, namespace string) {
	t.Helper()
	gvr := kbresources.ClusterBindings
	cbs := dynamic.NewForConfigOrDie(e.cp.AdminConfig()).Resource(gvr).Namespace(namespace)
	var annotations map[string]string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		cb, err := cbs.Get(context.Background(), binding.ClusterBindingName, metav1.GetOptions{})
		if err == nil {
			annotations = cb.GetAnnotations()
			if annotations[binding.AnnotationDeliveredAt] != "" {
				break
			}
		}
	}
	for _, a := range []string{binding.AnnotationProvisionedAt, binding.AnnotationDeliveredAt} {
		if _, err := time.Parse(time.RFC3339, annotations[a]); err != nil {
			t.Errorf("ClusterBinding %s/cluster: annotation %s = %q, want a time", namespace, a, annotations[a])
		}
	}
}
