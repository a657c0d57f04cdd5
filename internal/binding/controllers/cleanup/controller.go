// Package cleanup removes consumers the provider no longer wants on its
// cluster: those it revoked (label kube-bind.io/revoked=true on the
// consumer namespace, revoke.go) and, after a configurable time, bindings
// nobody uses: a bind cut short that left a half-made namespace, and a
// complete bind whose response was never handed out (gc.go). Both end in
// binding.Provisioner.UnbindNamespace: the token is revoked first, then
// the namespace and the namespaces made for its APIServiceNamespaces are
// deleted.
//
// One reconcile covers one consumer namespace, from the controllers' one
// cache of the backend's namespaces, ClusterBindings, requests and
// APIServiceNamespaces; every decision to delete is checked again against
// the API server first.
package cleanup

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
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
	Logger  *slog.Logger
	// Clock is for tests; nil means the real clock.
	Clock clock.WithTicker
}

// Controller runs the cleanup; Setup adds it to a leadership term's
// manager.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
}

// New checks the configuration and registers the metrics; it does not
// contact the cluster.
func New(cfg Config) (*Controller, error) {
	if cfg.Unbinder == nil {
		return nil, errors.New("cleanup: an Unbinder is required")
	}
	if cfg.GCAfter < 0 {
		cfg.GCAfter = 0
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, log: cfg.Logger, metrics: m}, nil
}

// run is one leadership term's state.
type run struct {
	*Controller
	cache   client.Reader
	dynamic dynamic.Interface

	mu sync.Mutex
	// dryRunReported and removed remember, per namespace name, the UID of
	// the dry-run candidate already reported and of the namespace whose
	// removal was already handled, so that another look does not repeat
	// them.
	dryRunReported map[string]types.UID
	removed        map[string]types.UID
}

// Setup adds the controller to m: a reconcile per consumer namespace, on
// every change of it and of what the garbage collection looks at in it (a
// heartbeat, a delivery mark, a first request), from m's cache; every
// decision to delete is checked again against the API server first.
func (c *Controller) Setup(m *kbmanager.Manager) error {
	r := &run{
		Controller:     c,
		cache:          m.GetCache(),
		dynamic:        m.Dynamic,
		dryRunReported: map[string]types.UID{},
		removed:        map[string]types.UID{},
	}
	// Deleted namespaces are looked at too: what remembered them is
	// forgotten.
	namespaces := kbmanager.Watch(m, &corev1.Namespace{}, func(_ context.Context, ns *corev1.Namespace) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: ns.Name}}}
	})
	byNamespace := func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetNamespace()}}}
	}
	sources := []source.Source{namespaces}
	for _, gvk := range []schema.GroupVersionKind{kbmanager.ClusterBinding, kbmanager.ExportRequest, kbmanager.APIServiceNamespace} {
		sources = append(sources, kbmanager.WatchKind(m, gvk, byNamespace))
	}
	if c.cfg.GCAfter > 0 {
		c.log.Info("cleanup: revocation on, garbage collection of unused bindings on", "gc_after", c.cfg.GCAfter.String(), "dry_run", c.cfg.DryRun)
	} else {
		c.log.Info("cleanup: revocation on, garbage collection of unused bindings off")
	}
	return m.AddController("cleanup", 1, r.reconcile, sources...)
}

// reconcile handles one consumer namespace and says when to look again
// (when an unused binding reaches the age to be collected).
func (r *run) reconcile(ctx context.Context, req reconcile.Request) (time.Duration, error) {
	ns := &corev1.Namespace{}
	if err := r.cache.Get(ctx, req.NamespacedName, ns); err != nil {
		if client.IgnoreNotFound(err) == nil {
			r.forget(r.dryRunReported, req.Name)
			r.forget(r.removed, req.Name)
		}
		return 0, client.IgnoreNotFound(err)
	}
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

// once says whether ns is not in set yet (by its UID), and adds it.
func (r *run) once(set map[string]types.UID, ns *corev1.Namespace) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if set[ns.Name] == ns.UID {
		return false
	}
	set[ns.Name] = ns.UID
	return true
}

func (r *run) forget(set map[string]types.UID, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(set, name)
}

func consumerOf(ns *corev1.Namespace) string {
	return binding.Consumer{Issuer: ns.Annotations[binding.AnnotationIssuer], Subject: ns.Annotations[binding.AnnotationSubject]}.ID()
}
