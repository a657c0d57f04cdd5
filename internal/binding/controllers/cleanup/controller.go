// Package cleanup removes consumers the provider no longer wants on its
// cluster: those it revoked (label kube-bind.io/revoked=true on the
// consumer namespace, revoke.go) and, after a configurable time, bindings
// nobody uses: a bind cut short that left a half-made namespace, and a
// complete bind whose response was never handed out (gc.go). Both end in
// binding.Provisioner.UnbindNamespace: the token is revoked first, then
// the namespace and the namespaces made for its APIServiceNamespaces are
// deleted.
//
// One reconcile covers one consumer namespace, from caches of the
// backend's namespaces, ClusterBindings, requests and APIServiceNamespaces;
// every decision to delete is checked again against the API server first.
package cleanup

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/workloop"
	"github.com/kbprovider/backend/internal/binding/kbcache"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// Unbinder removes a consumer namespace (implemented by
// *binding.Provisioner).
type Unbinder interface {
	UnbindNamespace(ctx context.Context, name string, uid types.UID) error
}

// Config configures the controller; Options.Validate checks the
// operator's GCAfter and DryRun.
type Config struct {
	Unbinder Unbinder
	// GCAfter is how long an unused binding (half-made, or complete but
	// never delivered) is kept; 0 turns the garbage collection off.
	// Revocation is always on.
	GCAfter time.Duration
	// DryRun logs what the garbage collection would delete, and counts
	// it, instead of deleting.
	DryRun bool
	// Metrics, if set, gets the counters of deletions.
	Metrics prometheus.Registerer
	// Resync re-checks every consumer namespace this often; 0 means 10m.
	Resync time.Duration
	Logger *slog.Logger
	// Clock is for tests; nil means the real clock.
	Clock clock.WithTicker
}

// Controller runs the cleanup. Run may be called again after it returned.
type Controller struct {
	cfg     Config
	kube    kubernetes.Interface
	dynamic dynamic.Interface
	log     *slog.Logger
	metrics *metrics
}

// New checks the configuration and registers the metrics; it does not
// contact the cluster.
func New(rc *rest.Config, cfg Config) (*Controller, error) {
	if cfg.Unbinder == nil {
		return nil, errors.New("cleanup: an Unbinder is required")
	}
	if cfg.GCAfter < 0 {
		cfg.GCAfter = 0
	}
	cfg.Resync, cfg.Logger, cfg.Clock = workloop.Defaults(cfg.Resync, cfg.Logger, cfg.Clock)
	kube, dyn, err := workloop.Clients(rc)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, kube: kube, dynamic: dyn, log: cfg.Logger, metrics: m}, nil
}

// run is one Run's state.
type run struct {
	*Controller
	queue      workqueue.TypedRateLimitingInterface[string]
	namespaces cache.SharedIndexInformer
	bindings   cache.SharedIndexInformer
	requests   cache.SharedIndexInformer
	apiNS      cache.SharedIndexInformer

	mu sync.Mutex
	// dryRunReported and removed remember, per namespace UID, the dry-run
	// candidates already reported and the namespaces whose removal was
	// already handled, so that resyncs do not repeat them.
	dryRunReported map[types.UID]bool
	removed        map[types.UID]bool
}

// Run cleans up until ctx ends. It returns an error only when the caches
// could not be set up; a cluster that is down is waited for.
func (c *Controller) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &run{
		Controller:     c,
		queue:          workloop.NewQueue("cleanup", c.cfg.Clock),
		dryRunReported: map[types.UID]bool{},
		removed:        map[types.UID]bool{},
	}
	defer r.queue.ShutDown()
	managed := func(o *metav1.ListOptions) { o.LabelSelector = binding.LabelManagedBy + "=" + binding.ManagedByValue }
	nsFactory := informers.NewSharedInformerFactoryWithOptions(c.kube, c.cfg.Resync, informers.WithTweakListOptions(managed))
	r.namespaces = nsFactory.Core().V1().Namespaces().Informer()
	cbFactory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(c.dynamic, 0, metav1.NamespaceAll, managed)
	r.bindings = cbFactory.ForResource(kbresources.ClusterBindings).Informer()
	dynFactory := dynamicinformer.NewDynamicSharedInformerFactory(c.dynamic, 0)
	r.requests = dynFactory.ForResource(kbresources.APIServiceExportRequests).Informer()
	r.apiNS = dynFactory.ForResource(kbresources.APIServiceNamespaces).Informer()
	// The caches keep only what the cleanup reads: consumers write these
	// objects, and a cache must not grow with what they stored. Of
	// requests and APIServiceNamespaces only their existence counts.
	existence := kbcache.Transform(kbcache.Options{Drop: [][]string{{"spec"}, {"status"}}})
	for inf, t := range map[cache.SharedIndexInformer]cache.TransformFunc{
		r.namespaces: kbcache.Transform(kbcache.Options{
			Annotations: []string{binding.AnnotationIssuer, binding.AnnotationSubject, binding.AnnotationCluster,
				binding.AnnotationProvisionedAt, binding.AnnotationDeliveredAt},
			Labels: []string{binding.LabelManagedBy, binding.LabelConsumerNamespace, binding.LabelRevoked},
		}),
		r.bindings: kbcache.Transform(kbcache.Options{
			Annotations: []string{binding.AnnotationProvisionedAt, binding.AnnotationDeliveredAt},
		}),
		r.requests: existence,
		r.apiNS:    existence,
	} {
		if err := inf.SetTransform(t); err != nil {
			return err
		}
	}

	onNamespace := func(obj any) {
		if ns, ok := obj.(*corev1.Namespace); ok && binding.IsConsumerNamespace(ns) {
			r.queue.Add(ns.Name)
		}
	}
	if _, err := r.namespaces.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onNamespace, UpdateFunc: func(_, o any) { onNamespace(o) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if ns, ok := obj.(*corev1.Namespace); ok {
				r.mu.Lock()
				delete(r.dryRunReported, ns.UID)
				delete(r.removed, ns.UID)
				r.mu.Unlock()
			}
		},
	}); err != nil {
		return err
	}
	// A change of what the garbage collection looks at re-checks the
	// namespace (a heartbeat, a delivery mark, a first request).
	byNamespace := workloop.OnChange(func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			if ns, _, err := cache.SplitMetaNamespaceKey(key); err == nil && ns != "" {
				r.queue.Add(ns)
			}
		}
	})
	for _, inf := range []cache.SharedIndexInformer{r.bindings, r.requests, r.apiNS} {
		if _, err := inf.AddEventHandler(byNamespace); err != nil {
			return err
		}
	}
	nsFactory.Start(ctx.Done())
	cbFactory.Start(ctx.Done())
	dynFactory.Start(ctx.Done())
	defer nsFactory.Shutdown()
	defer cbFactory.Shutdown()
	defer dynFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), r.namespaces.HasSynced, r.bindings.HasSynced, r.requests.HasSynced, r.apiNS.HasSynced) {
		return ctx.Err()
	}
	if c.cfg.GCAfter > 0 {
		c.log.Info("cleanup: caches synced; revocation on, garbage collection of unused bindings on",
			"gc_after", c.cfg.GCAfter.String(), "dry_run", c.cfg.DryRun)
	} else {
		c.log.Info("cleanup: caches synced; revocation on, garbage collection of unused bindings off")
	}
	workloop.Run(ctx, r.queue, 1, r.reconcile, r.log, "cleanup")
	return nil
}

// reconcile handles one consumer namespace and says when to look again
// (when an unused binding reaches the age to be collected).
func (r *run) reconcile(ctx context.Context, name string) (time.Duration, error) {
	o, ok, _ := r.namespaces.GetStore().GetByKey(name)
	if !ok {
		return 0, nil
	}
	ns := o.(*corev1.Namespace)
	if !binding.IsConsumerNamespace(ns) {
		return 0, nil
	}
	switch {
	case ns.DeletionTimestamp != nil:
		return 0, r.deleted(ctx, ns)
	case binding.IsRevoked(ns.Labels):
		return 0, r.revoke(ctx, ns)
	case r.cfg.GCAfter > 0:
		return r.collect(ctx, ns)
	}
	return 0, nil
}

// once says whether uid is not in set yet, and adds it.
func (r *run) once(set map[types.UID]bool, uid types.UID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if set[uid] {
		return false
	}
	set[uid] = true
	return true
}

func (r *run) forget(set map[types.UID]bool, uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(set, uid)
}

func consumerOf(ns *corev1.Namespace) string {
	return binding.Consumer{Issuer: ns.Annotations[binding.AnnotationIssuer], Subject: ns.Annotations[binding.AnnotationSubject]}.ID()
}
