package binding

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// Marks that tell a binding's life after Provision (docs/binding.md,
// "Revocation" and "Garbage collection").
const (
	// LabelRevoked on a consumer namespace, with value "true", is the
	// provider's way to revoke the consumer: the cleanup controller then
	// unbinds it (token first, then the namespace and everything made for
	// it). Provision refuses a revoked namespace meanwhile.
	LabelRevoked = "kube-bind.io/revoked"
	// AnnotationProvisionedAt on ClusterBinding "cluster" is when the last
	// Provision of the namespace completed (RFC 3339): the binding is
	// complete, a response exists.
	AnnotationProvisionedAt = "kube-bind.io/provisioned-at"
	// AnnotationDeliveredAt on ClusterBinding "cluster" is when a
	// BindingResponse for the namespace was first handed out: to a poll,
	// in the redirect to a CLI's callback, or to POST /api/bind. It is
	// written before the response leaves (MarkDelivered).
	AnnotationDeliveredAt = "kube-bind.io/response-delivered-at"
)

// IsRevoked says whether the provider revoked the consumer of ns.
func IsRevoked(labels map[string]string) bool { return labels[LabelRevoked] == "true" }

// markTimeout bounds MarkDelivered: a response waits for it, so an API
// server that hangs must not hold the answer for a whole Provision.
const markTimeout = 10 * time.Second

// MarkDelivered records on the ClusterBinding of provider namespace ns
// that its BindingResponse is being handed out (AnnotationDeliveredAt),
// unless it already says so: one read, and one write the first time.
// Callers record it before the response leaves, so that the garbage
// collection never takes a delivered binding for an unused one.
func (p *Provisioner) MarkDelivered(ctx context.Context, ns string) error {
	ctx, cancel := context.WithTimeout(ctx, min(markTimeout, p.cfg.Timeout))
	defer cancel()
	cb := p.dynamic.Resource(kbresources.ClusterBindings).Namespace(ns)
	have, err := cb.Get(ctx, ClusterBindingName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading ClusterBinding %s/%s: %w", ns, ClusterBindingName, err)
	}
	if have.GetAnnotations()[AnnotationDeliveredAt] != "" {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations": map[string]any{AnnotationDeliveredAt: formatTime(p.now())},
	}})
	_, err = cb.Patch(ctx, ClusterBindingName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	if err != nil {
		return fmt.Errorf("marking ClusterBinding %s/%s delivered: %w", ns, ClusterBindingName, err)
	}
	return nil
}
