package binding

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apiextensionsinformers "k8s.io/apiextensions-apiserver/pkg/client/informers/externalversions"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// ExportedLabel marks a CRD as bindable: kube-bind.io/exported=true.
const ExportedLabel = "kube-bind.io/exported"

// ExportedLabelV2 marks a CRD as bindable the kbind v2 way:
// core.kbind.io/exported=true. The catalog honours either label; the v2
// konnector lists only CRDs with this one (docs/v2.md).
const ExportedLabelV2 = "core.kbind.io/exported"

// exportedLabels are the labels that offer a CRD, each followed by an
// informer of its own: a label selector cannot say "one or the other".
var exportedLabels = []string{ExportedLabel, ExportedLabelV2}

// ExportedAPI is one bindable API as the selection page shows it.
type ExportedAPI struct {
	// Name is the CRD's name, <resource>.<group>.
	Name     string
	Group    string
	Resource string
	Kind     string
	Scope    apiextensionsv1.ResourceScope
	// Versions are the served versions, in the CRD's order.
	Versions []string
	// NoStatusSubresource lists the served versions without a status
	// subresource: the released konnector syncs status back to the
	// consumer only through it, so consumers of those versions never see
	// the status the provider writes.
	NoStatusSubresource []string
}

// Catalog is the set of exported APIs offered to consumers, kept in an
// informer cache of the labelled CRDs so that views never hit the API server.
type Catalog struct {
	scope  Scope
	client apiextensionsclient.Interface
	// factories and informers: one per label of exportedLabels.
	factories []apiextensionsinformers.SharedInformerFactory
	informers []cache.SharedIndexInformer

	mu      sync.Mutex
	lastErr error // last list/watch error, said while the cache is unsynced
	log     *slog.Logger
	warned  map[string]int64 // CRD name -> generation warned about (no status subresource)
}

// CatalogOption changes a Catalog's defaults.
type CatalogOption func(*Catalog)

// WithLogger sets where the catalog's warnings go (default slog.Default()).
func WithLogger(l *slog.Logger) CatalogOption { return func(c *Catalog) { c.log = l } }

// NewCatalog prepares a catalog for the provider cluster of cfg. It does
// not contact the cluster; Start does, and keeps retrying while it is down.
func NewCatalog(cfg *rest.Config, scope Scope, opts ...CatalogOption) (*Catalog, error) {
	if _, err := ParseScope(string(scope)); err != nil {
		return nil, err
	}
	client, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating apiextensions client: %w", err)
	}
	c := &Catalog{scope: scope, client: client, log: slog.Default(), warned: map[string]int64{}}
	for _, o := range opts {
		o(c)
	}
	for _, label := range exportedLabels {
		factory := apiextensionsinformers.NewSharedInformerFactoryWithOptions(client, 0,
			apiextensionsinformers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.LabelSelector = label + "=true"
			}))
		informer := factory.Apiextensions().V1().CustomResourceDefinitions().Informer()
		if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    c.warnNoStatus,
			UpdateFunc: func(_, obj any) { c.warnNoStatus(obj) },
			DeleteFunc: c.forgetWarning,
		}); err != nil {
			return nil, err
		}
		// Remember why the cache cannot follow the cluster, for the
		// readiness check; the reflector retries with backoff on its own.
		_ = informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			c.mu.Lock()
			c.lastErr = err
			c.mu.Unlock()
			cache.DefaultWatchErrorHandler(ctx, r, err)
		})
		c.factories = append(c.factories, factory)
		c.informers = append(c.informers, informer)
	}
	return c, nil
}

// Start runs the informers until ctx ends. It returns at once and never
// fails, even when the cluster is unreachable.
func (c *Catalog) Start(ctx context.Context) {
	for _, f := range c.factories {
		f.Start(ctx.Done())
	}
	go func() {
		<-ctx.Done()
		c.shutdown()
	}()
}

func (c *Catalog) shutdown() {
	for _, f := range c.factories {
		f.Shutdown()
	}
}

// Run fills and follows the cache until ctx ends, and returns when its
// informer stopped.
func (c *Catalog) Run(ctx context.Context) {
	for _, f := range c.factories {
		f.Start(ctx.Done())
	}
	<-ctx.Done()
	c.shutdown()
}

// WaitForSync blocks until the cache holds the cluster's state or ctx ends.
func (c *Catalog) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), c.HasSynced)
}

// HasSynced says whether the cache has been filled from the cluster once.
func (c *Catalog) HasSynced() bool {
	for _, i := range c.informers {
		if !i.HasSynced() {
			return false
		}
	}
	return true
}

// cached returns the cached CRD of that name, from the first informer
// that holds it with its label still "true" (another may hold a copy
// whose label was just taken away), or any copy.
func (c *Catalog) cached(name string) (*apiextensionsv1.CustomResourceDefinition, bool) {
	var stale *apiextensionsv1.CustomResourceDefinition
	for _, i := range c.informers {
		o, found, err := i.GetStore().GetByKey(name)
		if err != nil || !found {
			continue
		}
		crd, ok := o.(*apiextensionsv1.CustomResourceDefinition)
		if !ok {
			continue
		}
		if offeredByLabel(crd) {
			return crd, true
		}
		stale = crd
	}
	return stale, stale != nil
}

// offeredByLabel says whether one of the exported labels is "true".
func offeredByLabel(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, l := range exportedLabels {
		if crd.Labels[l] == "true" {
			return true
		}
	}
	return false
}

// Scope is the consumer scope the catalog filters by.
func (c *Catalog) Scope() Scope { return c.scope }

// List returns the exported APIs the consumer scope allows, sorted by name.
func (c *Catalog) List() []ExportedAPI {
	seen := map[string]bool{}
	var out []ExportedAPI
	for _, i := range c.informers {
		for _, o := range i.GetStore().List() {
			crd, ok := o.(*apiextensionsv1.CustomResourceDefinition)
			if !ok || seen[crd.Name] {
				continue
			}
			// Judged on the freshest copy any informer holds of it.
			if crd, ok = c.cached(crd.Name); !ok {
				continue
			}
			seen[crd.Name] = true
			if api, ok := c.exported(crd); ok {
				out = append(out, api)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Lookup finds one exported API the consumer scope allows.
func (c *Catalog) Lookup(group, resource string) (ExportedAPI, bool) {
	crd, ok := c.cached(resource + "." + group)
	if !ok {
		return ExportedAPI{}, false
	}
	return c.exported(crd)
}

// exported turns a cached CRD into an ExportedAPI, or says it is not one
// (label removed in a race with the cache, being deleted, nothing served,
// or outside the consumer scope).
func (c *Catalog) exported(crd *apiextensionsv1.CustomResourceDefinition) (ExportedAPI, bool) {
	if !offeredByLabel(crd) || crd.DeletionTimestamp != nil || !c.scope.allows(crd.Spec.Scope) {
		return ExportedAPI{}, false
	}
	api := ExportedAPI{
		Name:     crd.Name,
		Group:    crd.Spec.Group,
		Resource: crd.Spec.Names.Plural,
		Kind:     crd.Spec.Names.Kind,
		Scope:    crd.Spec.Scope,
	}
	for _, v := range crd.Spec.Versions {
		if v.Served {
			api.Versions = append(api.Versions, v.Name)
			if v.Subresources == nil || v.Subresources.Status == nil {
				api.NoStatusSubresource = append(api.NoStatusSubresource, v.Name)
			}
		}
	}
	if len(api.Versions) == 0 {
		return ExportedAPI{}, false
	}
	return api, true
}

// ExportedNow says whether the API <resource>.<group> is exported, read
// from the API server rather than the cache: for decisions that delete,
// which a cache lagging the cluster must not take.
func (c *Catalog) ExportedNow(ctx context.Context, group, resource string) (bool, error) {
	crd, err := c.client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, resource+"."+group, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, ok := c.exported(crd)
	return ok, nil
}

// ExportedCRD returns the cached CRD of an exported API the consumer scope
// allows (see Lookup), for the controllers that mirror it into
// APIServiceExports. The object is the informer's: callers must not modify it.
func (c *Catalog) ExportedCRD(group, resource string) (*apiextensionsv1.CustomResourceDefinition, bool) {
	crd, ok := c.cached(resource + "." + group)
	if !ok {
		return nil, false
	}
	if _, ok := c.exported(crd); !ok {
		return nil, false
	}
	return crd, true
}

// OnChange calls fn with the CRD's name whenever a labelled CRD is added,
// changed or removed (also when its label is taken away), so that
// controllers can follow the catalog without a second watch. The returned
// function stops the calls.
func (c *Catalog) OnChange(fn func(name string)) (stop func(), err error) {
	name := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if crd, ok := obj.(*apiextensionsv1.CustomResourceDefinition); ok {
			fn(crd.Name)
		}
	}
	var regs []cache.ResourceEventHandlerRegistration
	stop = func() {
		for i, reg := range regs {
			_ = c.informers[i].RemoveEventHandler(reg)
		}
	}
	for _, i := range c.informers {
		reg, err := i.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    name,
			UpdateFunc: func(_, obj any) { name(obj) },
			DeleteFunc: name,
		})
		if err != nil {
			stop()
			return nil, err
		}
		regs = append(regs, reg)
	}
	return stop, nil
}

// warnNoStatus logs, at WARN, an offered CRD with a served version that
// has no status subresource: once per CRD and generation (a spec change),
// not on every relist.
func (c *Catalog) warnNoStatus(obj any) {
	crd, ok := obj.(*apiextensionsv1.CustomResourceDefinition)
	if !ok {
		return
	}
	api, offered := c.exported(crd)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !offered || len(api.NoStatusSubresource) == 0 {
		delete(c.warned, crd.Name)
		return
	}
	if gen, done := c.warned[crd.Name]; done && gen == crd.Generation {
		return
	}
	c.warned[crd.Name] = crd.Generation
	c.log.Warn("exported CRD has no status subresource: consumers will never see the status the provider writes "+
		"(the konnector syncs status back only through /status); add subresources.status to these versions",
		"crd", crd.Name, "versions", strings.Join(api.NoStatusSubresource, ","), "generation", crd.Generation)
}

func (c *Catalog) forgetWarning(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if crd, ok := obj.(*apiextensionsv1.CustomResourceDefinition); ok {
		c.mu.Lock()
		delete(c.warned, crd.Name)
		c.mu.Unlock()
	}
}

// Name names the catalog's readiness check.
func (c *Catalog) Name() string { return "provider-cluster" }

// probeTimeout bounds the readiness probe's request to the cluster.
const probeTimeout = 2 * time.Second

// Check is the readiness check: the cache must be synced and the provider
// cluster must answer now (binding needs it).
func (c *Catalog) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	// /version is readable by every client, authenticated or not.
	err := c.client.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("provider cluster unreachable: %w", err)
	}
	if !c.HasSynced() {
		c.mu.Lock()
		lastErr := c.lastErr
		c.mu.Unlock()
		if lastErr != nil {
			return fmt.Errorf("exported API cache not synced: %w", lastErr)
		}
		return errors.New("exported API cache not synced yet")
	}
	return nil
}
