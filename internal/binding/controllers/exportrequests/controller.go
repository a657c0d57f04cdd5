// Package exportrequests is the provider side of a binding after the bind: it
// answers the APIServiceExportRequests consumers create in their provider
// namespaces by the offer covering each (internal/binding/offers), makes the
// APIServiceExport named after the request and a BoundSchema per bound
// resource, keeps those in step with the CRDs, makes a namespace for each
// APIServiceNamespace, and grants the consumer's service account the
// resources it bound and, in those namespaces, the ones it claimed.
//
// An export v1alpha1 can express (one resource, named after it, no claims
// or namespaces) also carries the v1alpha1 fields, the CRD copy, so that
// konnectors before v0.5 keep working: a dual export.
//
// One reconcile covers one consumer namespace, so that every decision is
// taken from the same view of its requests, exports and namespaces. It
// reads the provider side's shared cache (kbmanager) and writes only what
// differs from it: a settled consumer costs no request, on a new leader
// as at rest. Every write goes to a namespace the backend made, with the
// backend's namespace role (binding.BackendNamespaceClusterRole).
package exportrequests

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/binding/offers"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// Config configures the controllers.
type Config struct {
	// Catalog says which CRDs are exported; the caller starts it.
	Catalog *binding.Catalog
	// Offers decides requests and re-judges decided ones (an
	// offers.Source, started by the caller); nil decides by the catalog's
	// implicit offers alone.
	Offers Coverer
	// ClaimableResources are the only resources a claims Role names (the
	// offers' offers.Config.ClaimableResources); nil means
	// offers.DefaultClaimableResources.
	ClaimableResources []schema.GroupResource
	// GrantBackend gives the backend its namespace role in a namespace it
	// made (binding.Provisioner.GrantBackend).
	GrantBackend func(ctx context.Context, namespace string) error
	// NamespacePrefix starts the names of the namespaces made for
	// APIServiceNamespaces (--namespace-prefix, as for consumers).
	NamespacePrefix string
	// Workers reconcile namespaces in parallel; 0 means DefaultWorkers.
	Workers int
	Logger  *slog.Logger
}

// DefaultWorkers is enough to spend the shared request budget
// (kbmanager.QPS) on a new consumer's writes (about 6: export, schema,
// Role, RoleBinding, status) at the latency of a busy API server (about
// 250 ms a reconcile): with fewer, a provider with thousands of new
// requests waits on the round trips, not on the budget.
const DefaultWorkers = 8

// Coverer says which offer covers a request, or what the consumer should
// read when none does (offers.Source.Cover), and what a decided request
// still gets (offers.Source.Regrant).
type Coverer interface {
	Cover(spec v1alpha2.APIServiceExportRequestSpec) (offer, problem string)
	Regrant(spec v1alpha2.APIServiceExportRequestSpec) offers.Grant
	// OnChange calls fn when an offer may have changed.
	OnChange(fn func()) (stop func(), err error)
	HasSynced() bool
}

// Controller answers requests; Setup adds it to a leadership term's
// manager.
type Controller struct {
	cfg Config
	log *slog.Logger
}

// New checks the configuration; it does not contact the cluster.
func New(cfg Config) (*Controller, error) {
	if cfg.Catalog == nil || cfg.GrantBackend == nil {
		return nil, errors.New("exports: a catalog and GrantBackend are required")
	}
	if err := binding.ValidatePrefix(cfg.NamespacePrefix); err != nil {
		return nil, err
	}
	if cfg.Offers == nil {
		cfg.Offers = offers.CatalogOnly(cfg.Catalog)
	}
	if cfg.ClaimableResources == nil {
		cfg.ClaimableResources = offers.DefaultClaimableResources
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Controller{cfg: cfg, log: cfg.Logger}, nil
}

// run is one leadership term's state.
type run struct {
	*Controller
	cache   client.Reader
	kube    kubernetes.Interface
	dynamic dynamic.Interface
	// queue is the controller's, once it started: a change of the
	// catalog or the offers queues every consumer.
	queue atomic.Pointer[workqueue.TypedRateLimitingInterface[reconcile.Request]]
}

// Setup adds the controller to m: a reconcile per consumer namespace,
// queued by any change of its requests, exports, BoundSchemas,
// APIServiceNamespaces, namespaces, Roles and RoleBindings, and for every
// consumer (with low priority) when the catalog or the offers change.
func (c *Controller) Setup(m *kbmanager.Manager) error {
	r := &run{Controller: c, cache: m.GetCache(), kube: m.Kube, dynamic: m.Dynamic}
	own := func(_ context.Context, o client.Object) []reconcile.Request {
		return request(o.GetNamespace())
	}
	sources := []source.Source{
		kbmanager.WatchKind(m, kbmanager.ExportRequest, own),
		kbmanager.WatchKind(m, kbmanager.Export, own),
		kbmanager.WatchKind(m, kbmanager.BoundSchema, own),
		kbmanager.WatchKind(m, kbmanager.APIServiceNamespace, own),
		// A namespace change re-checks the consumer it belongs to.
		kbmanager.Watch(m, &corev1.Namespace{}, func(_ context.Context, ns *corev1.Namespace) []reconcile.Request {
			if owner := ns.Labels[binding.LabelConsumerNamespace]; owner != "" {
				return request(owner)
			}
			return request(ns.Name)
		}),
		// A Role or RoleBinding changed or deleted by hand comes back.
		kbmanager.Watch(m, &rbacv1.Role{}, func(ctx context.Context, o *rbacv1.Role) []reconcile.Request {
			return r.consumerOf(ctx, o.Namespace)
		}),
		kbmanager.Watch(m, &rbacv1.RoleBinding{}, func(ctx context.Context, o *rbacv1.RoleBinding) []reconcile.Request {
			return r.consumerOf(ctx, o.Namespace)
		}),
		source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			r.queue.Store(&q)
			return nil
		}),
	}
	if err := m.AddController("exports", c.cfg.Workers, r.reconcileAgain, sources...); err != nil {
		return err
	}
	return m.AddRunnable(r.followOffers)
}

// followOffers queues every consumer when an exported CRD or an offer
// changes, until ctx ends. It starts, as every runnable of the leader,
// once the cache has synced.
func (r *run) followOffers(ctx context.Context) error {
	r.log.Info("exports controllers: caches synced, reconciling", "workers", r.cfg.Workers)
	// An exported CRD changed: every consumer may hold an export of it.
	stop, err := r.cfg.Catalog.OnChange(func(string) { r.enqueueAll(ctx) })
	if err != nil {
		return err
	}
	defer stop()
	// A template changed: a decided request may be granted less.
	stopOffers, err := r.cfg.Offers.OnChange(func() { r.enqueueAll(ctx) })
	if err != nil {
		return err
	}
	defer stopOffers()
	<-ctx.Done()
	return nil
}

func request(ns string) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: ns}}}
}

// consumerOf is the consumer namespace that ns is, or was made for.
func (r *run) consumerOf(ctx context.Context, ns string) []reconcile.Request {
	if have, err := r.namespace(ctx, ns); err == nil && have != nil && have.Labels[binding.LabelConsumerNamespace] != "" {
		return request(have.Labels[binding.LabelConsumerNamespace])
	}
	return request(ns)
}

// enqueueAll queues every consumer namespace and every owner of a
// namespace made for an APIServiceNamespace, behind new and changed
// objects.
func (r *run) enqueueAll(ctx context.Context) {
	q := r.queue.Load()
	if q == nil {
		return // not started: its initial list queues every consumer
	}
	list := &corev1.NamespaceList{}
	if err := r.cache.List(ctx, list); err != nil {
		r.log.Warn("exports: cannot list the namespaces to look at again", "error", err)
		return
	}
	var all []reconcile.Request
	for i := range list.Items {
		ns := &list.Items[i]
		if owner := ns.Labels[binding.LabelConsumerNamespace]; owner != "" {
			all = append(all, request(owner)...)
		} else if binding.IsConsumerNamespace(ns) {
			all = append(all, request(ns.Name)...)
		}
	}
	kbmanager.AddLow(*q, all...)
}

// reconcileAgain is reconcile for kbmanager: a requeueAfter is another
// look later, not a failure. Until the catalog and the offers have
// synced, nothing is decided.
func (r *run) reconcileAgain(ctx context.Context, req reconcile.Request) (time.Duration, error) {
	if !r.cfg.Catalog.HasSynced() || !r.cfg.Offers.HasSynced() {
		return 100 * time.Millisecond, nil
	}
	err := r.reconcile(ctx, req.Name)
	if again := (*requeueAfter)(nil); errors.As(err, &again) {
		return again.d, nil
	}
	return 0, err
}

// requeueAfter asks for another pass later without counting as a failure
// (e.g. a namespace still terminating).
type requeueAfter struct {
	d      time.Duration
	reason string
}

func (e *requeueAfter) Error() string { return fmt.Sprintf("again in %s: %s", e.d, e.reason) }
