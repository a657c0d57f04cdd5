package kbmanager

import (
	"context"
	"fmt"
	"sort"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/kbcache"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// The kube-bind kinds in the cache, one version each. The cache holds
// them compactly (kbcache.Compact); readers get them as
// *unstructured.Unstructured through Get and List, and watch them with
// WatchKind.
var (
	ClusterBinding      = kbresources.ClusterBindings.GroupVersion().WithKind("ClusterBinding")
	ExportRequest       = kbresources.APIServiceExportRequestsV1alpha2.GroupVersion().WithKind("APIServiceExportRequest")
	Export              = kbresources.APIServiceExportsV1alpha2.GroupVersion().WithKind("APIServiceExport")
	APIServiceNamespace = kbresources.APIServiceNamespacesV1alpha2.GroupVersion().WithKind("APIServiceNamespace")
	BoundSchema         = kbresources.BoundSchemas.GroupVersion().WithKind("BoundSchema")
)

type (
	clusterBindingKind      struct{}
	exportRequestKind       struct{}
	exportKind              struct{}
	apiServiceNamespaceKind struct{}
	boundSchemaKind         struct{}
)

func (clusterBindingKind) GroupVersionKind() schema.GroupVersionKind      { return ClusterBinding }
func (exportRequestKind) GroupVersionKind() schema.GroupVersionKind       { return ExportRequest }
func (exportKind) GroupVersionKind() schema.GroupVersionKind              { return Export }
func (apiServiceNamespaceKind) GroupVersionKind() schema.GroupVersionKind { return APIServiceNamespace }
func (boundSchemaKind) GroupVersionKind() schema.GroupVersionKind         { return BoundSchema }

// cachedKind is what the cache needs of one compactly held kind.
type cachedKind struct {
	register func(*runtime.Scheme)
	object   func() client.Object
	list     func() client.ObjectList
	items    func(client.ObjectList) []CachedObject
}

// CachedObject is a kube-bind object as the cache holds it.
type CachedObject interface {
	client.Object
	// Unstructured is the whole object, a copy of the reader's own.
	Unstructured() (*unstructured.Unstructured, error)
	// DecodeBody decodes the fields besides the metadata into v: for a
	// reader of a few fields of every object, cheaper than Unstructured.
	DecodeBody(v any) error
}

func compactKind[K kbcache.Kind]() cachedKind {
	return cachedKind{
		register: kbcache.Register[K],
		object:   func() client.Object { return &kbcache.Compact[K]{} },
		list:     func() client.ObjectList { return &kbcache.CompactList[K]{} },
		items: func(l client.ObjectList) []CachedObject {
			items := l.(*kbcache.CompactList[K]).Items
			out := make([]CachedObject, len(items))
			for i := range items {
				out[i] = &items[i]
			}
			return out
		},
	}
}

var cachedKinds = map[schema.GroupVersionKind]cachedKind{
	ClusterBinding:      compactKind[clusterBindingKind](),
	ExportRequest:       compactKind[exportRequestKind](),
	Export:              compactKind[exportKind](),
	APIServiceNamespace: compactKind[apiServiceNamespaceKind](),
	BoundSchema:         compactKind[boundSchemaKind](),
}

func kindOf(gvk schema.GroupVersionKind) cachedKind {
	k, ok := cachedKinds[gvk]
	if !ok {
		panic("kbmanager: " + gvk.String() + " is not a cached kube-bind kind")
	}
	return k
}

// Cached is an empty object of gvk as the cache holds it: for watches
// (WatchKind) and indexes. gvk is one of the kinds above.
func Cached(gvk schema.GroupVersionKind) client.Object { return kindOf(gvk).object() }

// Expand is a cached kube-bind object as unstructured, a copy of its own.
func Expand(o client.Object) (*unstructured.Unstructured, error) {
	e, ok := o.(CachedObject)
	if !ok {
		return nil, fmt.Errorf("kbmanager: %T is not a cached kube-bind object", o)
	}
	return e.Unstructured()
}

// Get reads the cached object of gvk named key.
func Get(ctx context.Context, r client.Reader, gvk schema.GroupVersionKind, key client.ObjectKey) (*unstructured.Unstructured, error) {
	o := Cached(gvk)
	if err := r.Get(ctx, key, o); err != nil {
		return nil, err
	}
	return Expand(o)
}

// Labels and annotations the caches keep that are named by the packages
// reading them (which import this one); the controllers package's tests
// check they are spelled alike.
const (
	LabelAPIServiceNamespace = "kube-bind.io/apiservicenamespace"
	AnnotationRotate         = "kube-bind.io/rotate-credentials"
	AnnotationSettled        = "kube-bind.io/credentials-settled"
)

// DigestedSpec are the spec fields of the cached Exports and BoundSchemas
// kept only as their kbcache.Digest: the copies of a CRD's versions and
// schemas, which the exports controller compares with what it would
// write and never reads. Each consumer's namespace holds a copy of every
// CRD it bound, so whole copies would make the cache grow with the
// provider's schemas times the consumers.
var DigestedSpec = []string{"versions"}

// ListCached lists the cached objects of gvk as the cache holds them, in
// no particular order.
func ListCached(ctx context.Context, r client.Reader, gvk schema.GroupVersionKind, opts ...client.ListOption) ([]CachedObject, error) {
	k := kindOf(gvk)
	list := k.list()
	if err := r.List(ctx, list, opts...); err != nil {
		return nil, err
	}
	return k.items(list), nil
}

// List lists the cached objects of gvk, sorted by name.
func List(ctx context.Context, r client.Reader, gvk schema.GroupVersionKind, opts ...client.ListOption) ([]*unstructured.Unstructured, error) {
	items, err := ListCached(ctx, r, gvk, opts...)
	if err != nil {
		return nil, err
	}
	out := make([]*unstructured.Unstructured, len(items))
	for i, item := range items {
		u, err := item.Unstructured()
		if err != nil {
			return nil, err
		}
		out[i] = u
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out, nil
}

// Watch is a source of the cached objects of obj's kind (a typed kind):
// each event queues the requests toRequests maps the object to (objects
// of the initial list with low priority, with the priority queue on).
func Watch[T client.Object](m *Manager, obj T, toRequests func(context.Context, T) []reconcile.Request) source.Source {
	return source.Kind(m.GetCache(), obj, handler.TypedEnqueueRequestsFromMapFunc(toRequests))
}

// WatchKind is Watch for a kube-bind kind: toRequests and the
// predicates see the cached object's metadata (Expand gives the rest).
func WatchKind(m *Manager, gvk schema.GroupVersionKind, toRequests func(context.Context, client.Object) []reconcile.Request, preds ...predicate.Predicate) source.Source {
	return source.Kind(m.GetCache(), Cached(gvk), handler.TypedEnqueueRequestsFromMapFunc(toRequests), preds...)
}

// managed selects the backend's own objects.
var managed = labels.SelectorFromSet(labels.Set{binding.LabelManagedBy: binding.ManagedByValue})

// stamped selects the v2 konnectors' Leases the admission policy
// attributed to a consumer.
var stamped = func() labels.Selector {
	r, err := labels.NewRequirement(binding.LabelLeaseConsumer, selection.Exists, nil)
	if err != nil {
		panic(err)
	}
	return labels.NewSelector().Add(*r)
}()

// byObject is what the cache holds of each kind: for each, the union of
// what its readers need (exportrequests, heartbeats, cleanup,
// credentials), the rest trimmed (kbcache): consumers write these
// objects, and a cache must grow with the number of consumers, not with
// what they stored.
func byObject() map[client.Object]cache.ByObject {
	digested := make([][]string, 0, len(DigestedSpec))
	for _, f := range DigestedSpec {
		digested = append(digested, []string{"spec", f})
	}
	ownedOnly := kbcache.Transform(kbcache.Options{Labels: []string{binding.LabelManagedBy}, Drop: [][]string{{"status"}}, Digest: digested})
	return map[client.Object]cache.ByObject{
		// The backend's namespaces: consumers' and those made for
		// APIServiceNamespaces.
		&corev1.Namespace{}: {Label: managed, Transform: kbcache.Transform(kbcache.Options{
			Annotations: []string{binding.AnnotationIssuer, binding.AnnotationSubject, binding.AnnotationCluster,
				binding.AnnotationProvisionedAt, binding.AnnotationDeliveredAt},
			Labels: []string{binding.LabelManagedBy, binding.LabelConsumerNamespace, LabelAPIServiceNamespace, binding.LabelRevoked},
		})},
		// The consumers' Roles and RoleBindings the backend made: compared
		// with what they should be, written only when they differ. The
		// selector keeps their label true, so it is not kept (a map per
		// object, at every consumer).
		&rbacv1.Role{}:        {Label: managed, Transform: kbcache.Transform(kbcache.Options{})},
		&rbacv1.RoleBinding{}: {Label: managed, Transform: kbcache.Transform(kbcache.Options{})},
		// Provision labels every ClusterBinding it makes; the backend
		// writes no other. The konnector writes the status (heartbeats,
		// conditions), read whole.
		Cached(ClusterBinding): {Label: managed, Transform: kbcache.Transform(kbcache.Options{
			Annotations: []string{AnnotationRotate, AnnotationSettled, binding.AnnotationBoundAt, binding.AnnotationBoundBy,
				binding.AnnotationProvisionedAt, binding.AnnotationDeliveredAt},
			Drop: [][]string{{"spec"}},
		})},
		// Requests and APIServiceNamespaces: the consumers'.
		Cached(ExportRequest):       {Transform: kbcache.Transform(kbcache.Options{})},
		Cached(APIServiceNamespace): {Transform: kbcache.Transform(kbcache.Options{})},
		// Exports and BoundSchemas: every one, so that one of the same
		// name the backend did not make is seen; their status is the
		// konnector's, their CRD copies digested (DigestedSpec).
		Cached(Export):      {Transform: ownedOnly},
		Cached(BoundSchema): {Transform: ownedOnly},
		// The v2 konnectors' heartbeats: the stamped Leases of their one
		// namespace, with the stamp and the times.
		&coordinationv1.Lease{}: {
			Namespaces: map[string]cache.Config{binding.V2LeaseNamespace: {}},
			Label:      stamped,
			Transform:  kbcache.Transform(kbcache.Options{Labels: []string{binding.LabelLeaseConsumer}}),
		},
	}
}
