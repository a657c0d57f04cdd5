package cleanup

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/kbprovider/backend/internal/binding"
)

// revoke unbinds a consumer whose namespace the provider labelled
// kube-bind.io/revoked=true: the token Secret and service account go
// first (the issued kubeconfig stops working within the API server's
// 10 s token cache), then the namespace, then the namespaces made for its
// APIServiceNamespaces.
func (r *run) revoke(ctx context.Context, ns *corev1.Namespace) error {
	err := r.cfg.Unbinder.UnbindNamespace(ctx, ns.Name, ns.UID)
	if errors.Is(err, binding.ErrNotBound) {
		return nil // gone, or made again since
	}
	if err != nil {
		return fmt.Errorf("revoking the consumer of %s: %w", ns.Name, err)
	}
	r.once(r.removed, ns) // its deletion needs nothing more
	r.metrics.revoked.Inc()
	r.log.Info("cleanup: consumer revoked: token revoked, provider namespace and the namespaces made for it deleted",
		"namespace", ns.Name, "consumer", consumerOf(ns), "cluster", ns.Annotations[binding.AnnotationCluster])
	return nil
}

// deleted finishes a consumer namespace someone deleted (kubectl delete
// namespace): the namespace controller removes what is in it, the token
// with it; the backend removes what it made outside it, once.
func (r *run) deleted(ctx context.Context, ns *corev1.Namespace) error {
	if !r.once(r.removed, ns) {
		return nil
	}
	err := r.cfg.Unbinder.UnbindNamespace(ctx, ns.Name, ns.UID)
	if err != nil && !errors.Is(err, binding.ErrNotBound) {
		r.forget(r.removed, ns.Name) // try again
		return fmt.Errorf("removing what was made for deleted namespace %s: %w", ns.Name, err)
	}
	r.log.Info("cleanup: consumer namespace deleted; the namespaces made for it are deleted too",
		"namespace", ns.Name, "consumer", consumerOf(ns))
	return nil
}
