package exportrequests

import (
	"context"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/kbprovider/backend/internal/binding"
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

func metaAccessor(obj any) (metav1.Object, error) { return meta.Accessor(obj) }

// reconcile brings one consumer namespace in step: it answers pending
// requests, mirrors the exported CRDs it bound, grants its service account
// those resources, and makes the namespaces of its APIServiceNamespaces.
// A namespace that is not (or no longer) a consumer's loses the
// namespaces made for it.
func (r *run) reconcile(ctx context.Context, nsName string) error {
	ns := r.namespace(nsName)
	if ns == nil || ns.DeletionTimestamp != nil || !binding.IsConsumerNamespace(ns) {
		r.forgetRoles(nsName)
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

func (r *run) namespace(name string) *corev1.Namespace {
	o, ok, _ := r.namespaces.GetStore().GetByKey(name)
	if !ok {
		return nil
	}
	return o.(*corev1.Namespace)
}

func (r *run) inNamespace(inf cache.SharedIndexInformer, ns string) []*unstructured.Unstructured {
	objs, _ := inf.GetIndexer().ByIndex(cache.NamespaceIndex, ns)
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out
}
