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
// taken from the same view of its requests, exports and namespaces. Every
// write goes to a namespace the backend made, with the backend's namespace
// role (binding.BackendNamespaceClusterRole).
package exportrequests

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/workloop"
	"github.com/kbprovider/backend/internal/binding/kbcache"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
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
	// Workers reconcile namespaces in parallel; 0 means 2.
	Workers int
	// Resync re-checks every consumer namespace this often (a Role
	// deleted by hand comes back); 0 means 10 minutes.
	Resync time.Duration
	Logger *slog.Logger
}

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

// Controller runs the reconcilers. Run may be called again after it
// returned (a new leadership term): every run starts with fresh caches.
type Controller struct {
	cfg     Config
	kube    kubernetes.Interface
	dynamic dynamic.Interface
	log     *slog.Logger
}

// New checks the configuration; it does not contact the cluster.
func New(rc *rest.Config, cfg Config) (*Controller, error) {
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
		cfg.Workers = 2
	}
	cfg.Resync, cfg.Logger, _ = workloop.Defaults(cfg.Resync, cfg.Logger, nil)
	kube, dyn, err := workloop.Clients(rc)
	if err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, kube: kube, dynamic: dyn, log: cfg.Logger}, nil
}

// byOwner indexes the namespaces made for APIServiceNamespaces by the
// consumer namespace they belong to.
const byOwner = "owner"

// run is one Run's state: caches and the queue of consumer namespaces.
type run struct {
	*Controller
	queue      workqueue.TypedRateLimitingInterface[string]
	namespaces cache.SharedIndexInformer
	requests   cache.SharedIndexInformer
	exports    cache.SharedIndexInformer
	apiNS      cache.SharedIndexInformer
	schemas    cache.SharedIndexInformer

	mu      sync.Mutex
	applied map[string]appliedRoles // namespace -> last Role applied there
}

type appliedRoles struct {
	fingerprint string
	at          time.Time
}

// Run reconciles until ctx ends. It returns an error only when the caches
// could not be set up; a cluster that is down is waited for.
func (c *Controller) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &run{
		Controller: c,
		queue:      workloop.NewQueue("exports", nil),
		applied:    map[string]appliedRoles{},
	}
	defer r.queue.ShutDown()

	nsFactory := informers.NewSharedInformerFactoryWithOptions(c.kube, c.cfg.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = binding.LabelManagedBy + "=" + binding.ManagedByValue
		}))
	r.namespaces = nsFactory.Core().V1().Namespaces().Informer()
	if err := r.namespaces.AddIndexers(cache.Indexers{byOwner: func(obj any) ([]string, error) {
		if ns, ok := obj.(*corev1.Namespace); ok && ns.Labels[binding.LabelConsumerNamespace] != "" {
			return []string{ns.Labels[binding.LabelConsumerNamespace]}, nil
		}
		return nil, nil
	}}); err != nil {
		return err
	}
	dynFactory := dynamicinformer.NewDynamicSharedInformerFactory(c.dynamic, 0)
	r.requests = dynFactory.ForResource(kbresources.APIServiceExportRequestsV1alpha2).Informer()
	r.exports = dynFactory.ForResource(kbresources.APIServiceExportsV1alpha2).Informer()
	r.apiNS = dynFactory.ForResource(kbresources.APIServiceNamespacesV1alpha2).Informer()
	r.schemas = dynFactory.ForResource(kbresources.BoundSchemas).Informer()
	// The caches keep only what the reconcile reads: consumers write these
	// objects, and a cache must not grow with what they stored.
	ownedOnly := kbcache.Transform(kbcache.Options{Labels: []string{binding.LabelManagedBy}, Drop: [][]string{{"status"}}})
	for inf, t := range map[cache.SharedIndexInformer]cache.TransformFunc{
		r.namespaces: kbcache.Transform(kbcache.Options{
			Annotations: []string{binding.AnnotationIssuer, binding.AnnotationSubject, binding.AnnotationCluster},
			Labels:      []string{binding.LabelManagedBy, binding.LabelConsumerNamespace, LabelAPIServiceNamespace},
		}),
		r.requests: kbcache.Transform(kbcache.Options{}),
		r.apiNS:    kbcache.Transform(kbcache.Options{}),
		r.exports:  ownedOnly,
		r.schemas:  ownedOnly,
	} {
		if err := inf.SetTransform(t); err != nil {
			return err
		}
	}

	// Any change in a namespace's kube-bind objects re-checks that namespace.
	byNamespace := workloop.OnChange(func(obj any) {
		if m, err := metaAccessor(obj); err == nil {
			r.queue.Add(m.GetNamespace())
		}
	})
	for _, inf := range []cache.SharedIndexInformer{r.requests, r.exports, r.apiNS, r.schemas} {
		if _, err := inf.AddEventHandler(byNamespace); err != nil {
			return err
		}
	}
	// A namespace change re-checks the consumer it belongs to.
	if _, err := r.namespaces.AddEventHandler(workloop.OnChange(func(obj any) {
		ns, ok := obj.(*corev1.Namespace)
		if !ok {
			return
		}
		if owner := ns.Labels[binding.LabelConsumerNamespace]; owner != "" {
			r.queue.Add(owner)
			return
		}
		r.queue.Add(ns.Name)
	})); err != nil {
		return err
	}
	// An exported CRD changed: every consumer may hold an export of it.
	stop, err := c.cfg.Catalog.OnChange(func(string) { r.enqueueAll() })
	if err != nil {
		return err
	}
	defer stop()
	// A template changed: a decided request may be granted less.
	stopOffers, err := c.cfg.Offers.OnChange(r.enqueueAll)
	if err != nil {
		return err
	}
	defer stopOffers()

	nsFactory.Start(ctx.Done())
	dynFactory.Start(ctx.Done())
	defer nsFactory.Shutdown()
	defer dynFactory.Shutdown()
	c.log.Info("exports controllers: waiting for caches")
	start := time.Now()
	if !cache.WaitForCacheSync(ctx.Done(), r.namespaces.HasSynced, r.requests.HasSynced, r.exports.HasSynced,
		r.apiNS.HasSynced, r.schemas.HasSynced, c.cfg.Catalog.HasSynced, c.cfg.Offers.HasSynced) {
		return ctx.Err()
	}
	c.log.Info("exports controllers: caches synced, reconciling", "took", time.Since(start).Round(time.Millisecond).String(),
		"workers", c.cfg.Workers)
	r.enqueueAll()

	workloop.Run(ctx, r.queue, c.cfg.Workers, r.reconcileAgain, r.log, "exports controllers")
	c.log.Info("exports controllers: stopped")
	return nil
}

// enqueueAll queues every consumer namespace and every owner of a
// namespace made for an APIServiceNamespace.
func (r *run) enqueueAll() {
	for _, o := range r.namespaces.GetStore().List() {
		ns := o.(*corev1.Namespace)
		if owner := ns.Labels[binding.LabelConsumerNamespace]; owner != "" {
			r.queue.Add(owner)
		} else if binding.IsConsumerNamespace(ns) {
			r.queue.Add(ns.Name)
		}
	}
}

// reconcileAgain is reconcile for workloop: a requeueAfter is another
// look later, not a failure.
func (r *run) reconcileAgain(ctx context.Context, ns string) (time.Duration, error) {
	err := r.reconcile(ctx, ns)
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
