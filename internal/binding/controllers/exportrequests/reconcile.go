package exportrequests

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
)

// fieldManager owns what the backend writes, and the v1alpha1 fields of
// an export; fieldManagerV1alpha2 owns an export's v1alpha2 fields, so that
// a v1alpha1-only backend applying its fields during a rolling upgrade
// never strips them.
const (
	fieldManager         = "kube-bind-backend"
	fieldManagerV1alpha2 = "kube-bind-backend/v1alpha2"
)

// Request phases (status.phase of an APIServiceExportRequest).
const (
	PhasePending   = "Pending"
	PhaseSucceeded = "Succeeded"
	PhaseFailed    = "Failed"
)

// reconcile brings one consumer namespace in step: it answers pending
// requests, mirrors the exported CRDs it bound, grants its service account
// those resources, and makes the namespaces of its APIServiceNamespaces.
// A namespace that is not (or no longer) a consumer's loses the
// namespaces made for it.
func (r *run) reconcile(ctx context.Context, nsName string) error {
	ns, err := r.namespace(ctx, nsName)
	if err != nil {
		return err
	}
	if ns == nil || ns.DeletionTimestamp != nil || !binding.IsConsumerNamespace(ns) {
		return r.removeChildren(ctx, nsName, nil)
	}

	wanted, err := r.answerRequests(ctx, nsName)
	if err != nil {
		return err
	}
	bound, all, err := r.syncExports(ctx, nsName, wanted)
	if err != nil {
		return err
	}
	if err := r.syncBoundSchemas(ctx, nsName, bound); err != nil {
		return err
	}
	rules := consumerRules(bound)
	if err := r.applyConsumerRBAC(ctx, nsName, nsName, ConsumerExportsRole, rules); err != nil {
		return fmt.Errorf("granting the consumer its resources in %s: %w", nsName, err)
	}
	if err := r.ensureRequestedNamespaces(ctx, nsName, all); err != nil {
		return err
	}
	return r.syncAPIServiceNamespaces(ctx, nsName, rules, claimRules(all, r.cfg.ClaimableResources))
}

func (r *run) namespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	ns := &corev1.Namespace{}
	if err := r.cache.Get(ctx, client.ObjectKey{Name: name}, ns); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return ns, nil
}

// inNamespace lists the cached objects of gvk in ns, sorted by name.
func (r *run) inNamespace(ctx context.Context, gvk schema.GroupVersionKind, ns string) ([]*unstructured.Unstructured, error) {
	return kbmanager.List(ctx, r.cache, gvk, client.InNamespace(ns))
}
