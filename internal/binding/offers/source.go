package offers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// DefaultMaxNamespaces bounds the namespaces one template may ask for: each
// becomes a provider namespace with RBAC per consumer.
const DefaultMaxNamespaces = 16

// DefaultClaimableResources are what a template may claim unless the
// provider says otherwise: core Secrets and ConfigMaps.
var DefaultClaimableResources = []schema.GroupResource{{Resource: "secrets"}, {Resource: "configmaps"}}

// Config configures a Source.
type Config struct {
	// ClaimableResources a template's permission claims may name; nil
	// means DefaultClaimableResources.
	ClaimableResources []schema.GroupResource
	// MaxNamespaces a template may list; 0 means DefaultMaxNamespaces.
	MaxNamespaces int
	Logger        *slog.Logger
}

// Source keeps the offers: the catalog's exported CRDs and the provider's
// templates and collections, read through informers so that listing never
// hits the API server.
type Source struct {
	catalog     *binding.Catalog
	dynamic     dynamic.Interface
	cfg         Config
	factory     dynamicinformer.DynamicSharedInformerFactory
	templates   cache.SharedIndexInformer
	collections cache.SharedIndexInformer
}

// New prepares a Source for the provider cluster of rc. It does not
// contact the cluster; Start does. The caller starts the catalog.
func New(rc *rest.Config, catalog *binding.Catalog, cfg Config) (*Source, error) {
	if catalog == nil {
		return nil, errors.New("offers: a catalog is required")
	}
	if cfg.ClaimableResources == nil {
		cfg.ClaimableResources = DefaultClaimableResources
	}
	if cfg.MaxNamespaces <= 0 {
		cfg.MaxNamespaces = DefaultMaxNamespaces
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("offers: %w", err)
	}
	factory := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	return &Source{
		catalog:     catalog,
		dynamic:     dyn,
		cfg:         cfg,
		factory:     factory,
		templates:   factory.ForResource(kbresources.APIServiceExportTemplates).Informer(),
		collections: factory.ForResource(kbresources.Collections).Informer(),
	}, nil
}

// Start runs the informers until ctx ends. It returns at once and never
// fails, even when the cluster is unreachable.
func (s *Source) Start(ctx context.Context) {
	s.factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		s.factory.Shutdown()
	}()
}

// Run fills and follows the caches until ctx ends.
func (s *Source) Run(ctx context.Context) {
	s.factory.Start(ctx.Done())
	<-ctx.Done()
	s.factory.Shutdown()
}

// HasSynced says whether the templates, the collections and the catalog
// have been read from the cluster once.
func (s *Source) HasSynced() bool {
	return s.templates.HasSynced() && s.collections.HasSynced() && s.catalog.HasSynced()
}

// OnChange calls fn whenever a template or collection changes; the
// catalog has its own OnChange. The returned function stops the calls.
func (s *Source) OnChange(fn func()) (stop func(), err error) {
	h := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { fn() }, UpdateFunc: func(any, any) { fn() }, DeleteFunc: func(any) { fn() },
	}
	regT, err := s.templates.AddEventHandler(h)
	if err != nil {
		return nil, err
	}
	regC, err := s.collections.AddEventHandler(h)
	if err != nil {
		_ = s.templates.RemoveEventHandler(regT)
		return nil, err
	}
	return func() {
		_ = s.templates.RemoveEventHandler(regT)
		_ = s.collections.RemoveEventHandler(regC)
	}, nil
}

// List returns every offer, sorted by name.
func (s *Source) List() []Offer {
	return build(s.catalog, s.cachedTemplates(), s.cfg)
}

// Get returns the offer of that name.
func (s *Source) Get(name string) (Offer, bool) {
	for _, o := range s.List() {
		if o.Name == name {
			return o, true
		}
	}
	return Offer{}, false
}

// Collections returns the provider's collections, sorted by name, each
// listing only the templates that are offered (a collection left with
// none is dropped).
func (s *Source) Collections() []Collection {
	offered := map[string]bool{}
	for _, o := range s.List() {
		offered[o.Name] = true
	}
	var out []Collection
	for _, obj := range s.collections.GetStore().List() {
		var c v1alpha2.Collection
		if !decode(obj, &c) {
			continue
		}
		col := Collection{Name: c.Metadata.Name, Description: c.Spec.Description}
		for _, t := range c.Spec.Templates {
			if offered[t.Name] {
				col.Offers = append(col.Offers, t.Name)
			}
		}
		if len(col.Offers) > 0 {
			out = append(out, col)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Templates returns each template with why it is not offered ("" when it
// is), for the Ready condition and for logs.
func (s *Source) Templates() map[string]Verdict {
	out := map[string]Verdict{}
	for _, t := range s.cachedTemplates() {
		out[t.Metadata.Name] = judge(s.catalog, t, s.cfg)
	}
	return out
}

func (s *Source) cachedTemplates() []v1alpha2.APIServiceExportTemplate {
	objs := s.templates.GetStore().List()
	out := make([]v1alpha2.APIServiceExportTemplate, 0, len(objs))
	for _, obj := range objs {
		var t v1alpha2.APIServiceExportTemplate
		if decode(obj, &t) && t.Metadata.DeletionTimestamp == nil {
			out = append(out, t)
		}
	}
	return out
}

// decode turns a cached object into one of our types through JSON; an
// object that does not fit (the schema should prevent it) is skipped.
func decode(obj any, into any) bool {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return false
	}
	b, err := json.Marshal(u.Object)
	return err == nil && json.Unmarshal(b, into) == nil
}

// Reasons a template is not offered (the Ready condition's reason).
const (
	ReasonResourceNotExported = "ResourceNotExported"
	ReasonScopeNotOffered     = "ScopeNotOffered"
	ReasonClaimNotAllowed     = "ClaimNotAllowed"
	ReasonTooManyNamespaces   = "TooManyNamespaces"
)

// Verdict says whether a template is offered and, if not, why.
type Verdict struct {
	Reason  string
	Message string
}

// Offered says whether the verdict lets the template be offered.
func (v Verdict) Offered() bool { return v.Reason == "" }

// build makes the offers: one implicit offer per exported CRD, replaced
// by an offered template of the same name, plus every other offered
// template. A template that is not offered leaves the implicit offer of
// its name in place: the label on the CRD alone already makes it bindable.
func build(catalog *binding.Catalog, templates []v1alpha2.APIServiceExportTemplate, cfg Config) []Offer {
	byName := map[string]Offer{}
	for _, api := range catalog.List() {
		byName[api.Name] = Implicit(api)
	}
	for _, t := range templates {
		if judge(catalog, t, cfg).Offered() {
			byName[t.Metadata.Name] = explicit(catalog, t)
		}
	}
	out := make([]Offer, 0, len(byName))
	for _, o := range byName {
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Implicit is the offer made from one exported API: the API alone, its
// schema updated always, named as the API is.
func Implicit(api binding.ExportedAPI) Offer {
	return Offer{
		Name:               api.Name,
		Description:        api.Kind,
		Resources:          []v1alpha2.Resource{{Group: api.Group, Resource: api.Resource, Versions: api.Versions}},
		SchemaUpdatePolicy: v1alpha2.SchemaUpdateAlways,
		Implicit:           true,
	}
}

// explicit makes the offer of a template judged offered; a resource that
// lists no versions is offered with every served version.
func explicit(catalog *binding.Catalog, t v1alpha2.APIServiceExportTemplate) Offer {
	o := Offer{
		Name:               t.Metadata.Name,
		Description:        t.Spec.Description,
		PermissionClaims:   t.Spec.PermissionClaims,
		Namespaces:         t.Spec.Namespaces,
		SchemaUpdatePolicy: t.Spec.SchemaUpdatePolicy,
	}
	if o.SchemaUpdatePolicy == "" {
		o.SchemaUpdatePolicy = v1alpha2.SchemaUpdateAlways
	}
	for _, r := range t.Spec.Resources {
		if len(r.Versions) == 0 {
			api, _ := catalog.Lookup(r.Group, r.Resource)
			r.Versions = api.Versions
		}
		o.Resources = append(o.Resources, r)
	}
	return o
}

// judge says whether a template stays within what the provider offers.
func judge(catalog *binding.Catalog, t v1alpha2.APIServiceExportTemplate, cfg Config) Verdict {
	if t.Spec.Scope == "Cluster" && catalog.Scope() != binding.ScopeCluster {
		return Verdict{ReasonScopeNotOffered, "scope Cluster is not offered by this provider (consumer scope " + string(catalog.Scope()) + ")"}
	}
	if len(t.Spec.Resources) == 0 {
		return Verdict{ReasonResourceNotExported, "the template lists no resources"}
	}
	for _, r := range t.Spec.Resources {
		if problem := servesAll(catalog, r); problem != "" {
			return Verdict{ReasonResourceNotExported, problem}
		}
	}
	for _, c := range t.Spec.PermissionClaims {
		if !claimable(cfg.ClaimableResources, c) {
			return Verdict{ReasonClaimNotAllowed, fmt.Sprintf("resource %q of group %q may not be claimed", c.Resource, c.Group)}
		}
	}
	if len(t.Spec.Namespaces) > cfg.MaxNamespaces {
		return Verdict{ReasonTooManyNamespaces, fmt.Sprintf("%d namespaces, at most %d", len(t.Spec.Namespaces), cfg.MaxNamespaces)}
	}
	return Verdict{}
}

// servesAll checks one resource against the catalog: exported, in the
// consumer scope, serving every version listed. A CRD that exists but is
// not exported gets the same answer as one that does not exist, so
// consumers cannot probe the provider's internal APIs.
func servesAll(catalog *binding.Catalog, r v1alpha2.Resource) string {
	api, ok := catalog.Lookup(r.Group, r.Resource)
	if !ok {
		return (&binding.NotExportedError{Group: r.Group, Resource: r.Resource}).Error()
	}
	var problems []string
	for _, v := range r.Versions {
		if !slices.Contains(api.Versions, v) {
			problems = append(problems, fmt.Sprintf("version %q of %s is not served by this provider (served: %s)",
				v, r.Name(), strings.Join(api.Versions, ", ")))
		}
	}
	return strings.Join(problems, "; ")
}

func claimable(allowed []schema.GroupResource, c v1alpha2.PermissionClaim) bool {
	for _, gr := range allowed {
		if gr.Group == c.Group && gr.Resource == c.Resource {
			return true
		}
	}
	return false
}

// Cover decides a request: the name of an offer holding every resource it
// asks for (with the versions asked for), every permission claim (the same
// selector) and every namespace, or a problem for the consumer to read.
func (s *Source) Cover(spec v1alpha2.APIServiceExportRequestSpec) (offer string, problem string) {
	return cover(s.List(), s.catalog, spec)
}

func cover(offers []Offer, catalog *binding.Catalog, spec v1alpha2.APIServiceExportRequestSpec) (string, string) {
	if len(spec.Resources) == 0 {
		return "", "spec.resources must list at least one {group, resource}"
	}
	var problems []string
	for _, r := range spec.Resources {
		if p := servesAll(catalog, r); p != "" {
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		return "", strings.Join(problems, "; ")
	}
	for _, o := range offers {
		if covers(o, spec) {
			return o.Name, ""
		}
	}
	return "", "no single offer of this provider holds all of these resources" + claimsAndNamespaces(spec)
}

func claimsAndNamespaces(spec v1alpha2.APIServiceExportRequestSpec) string {
	switch {
	case len(spec.PermissionClaims) > 0 && len(spec.Namespaces) > 0:
		return " with these permission claims and namespaces"
	case len(spec.PermissionClaims) > 0:
		return " with these permission claims"
	case len(spec.Namespaces) > 0:
		return " with these namespaces"
	}
	return ""
}

// covers says whether o holds everything spec asks for.
func covers(o Offer, spec v1alpha2.APIServiceExportRequestSpec) bool {
	for _, r := range spec.Resources {
		if !holdsResource(o, r) {
			return false
		}
	}
	for _, c := range spec.PermissionClaims {
		if !holdsClaim(o, c) {
			return false
		}
	}
	for _, n := range spec.Namespaces {
		if !holdsNamespace(o, n.Name) {
			return false
		}
	}
	return true
}

func holdsResource(o Offer, r v1alpha2.Resource) bool {
	for _, have := range o.Resources {
		if have.Group != r.Group || have.Resource != r.Resource {
			continue
		}
		for _, v := range r.Versions {
			if !slices.Contains(have.Versions, v) {
				return false
			}
		}
		return true
	}
	return false
}

// holdsClaim compares whole claims: a consumer may accept fewer claims
// than offered, never a wider selector.
func holdsClaim(o Offer, c v1alpha2.PermissionClaim) bool {
	want, _ := json.Marshal(c)
	for _, have := range o.PermissionClaims {
		if b, _ := json.Marshal(have); string(b) == string(want) {
			return true
		}
	}
	return false
}

func holdsNamespace(o Offer, name string) bool {
	for _, n := range o.Namespaces {
		if n.Name == name {
			return true
		}
	}
	return false
}

// CatalogOnly decides requests by the implicit offers alone (no
// templates), for a controller run without a Source.
func CatalogOnly(catalog *binding.Catalog) *CatalogCoverer { return &CatalogCoverer{catalog: catalog} }

// CatalogCoverer is what CatalogOnly returns.
type CatalogCoverer struct{ catalog *binding.Catalog }

// Cover is Source.Cover without templates.
func (c *CatalogCoverer) Cover(spec v1alpha2.APIServiceExportRequestSpec) (string, string) {
	return cover(build(c.catalog, nil, Config{}), c.catalog, spec)
}

// HasSynced is the catalog's.
func (c *CatalogCoverer) HasSynced() bool { return c.catalog.HasSynced() }

// Reasons a decided request is granted less than it asked for (the
// Granted condition of the request).
const (
	// ReasonOfferNarrowed: some resources, claims or namespaces are no
	// longer offered; the rest stays granted.
	ReasonOfferNarrowed = "OfferNarrowed"
	// ReasonOfferWithdrawn: no offer holds any of its resources.
	ReasonOfferWithdrawn = "OfferWithdrawn"
)

// Grant is what a decided request (or an export whose request is gone)
// still gets from today's offers: per item of its spec, whether it is
// kept. It never holds more than the spec.
type Grant struct {
	Resources, Claims, Namespaces []bool
	// Reason is "" when everything is kept, else ReasonOfferNarrowed or
	// ReasonOfferWithdrawn; Message says what was dropped.
	Reason, Message string
}

// Regrant judges a decided spec against today's offers: a resource is kept
// while some offer holds it (any versions: RBAC does not tell versions
// apart), a claim or namespace while an offer holding every kept resource
// still has it exactly, and a claim only on a claimable resource.
func (s *Source) Regrant(spec v1alpha2.APIServiceExportRequestSpec) Grant {
	return regrant(s.List(), s.catalog, s.cfg.ClaimableResources, spec)
}

// ClaimableResources are the resources a template's claims may name.
func (s *Source) ClaimableResources() []schema.GroupResource {
	return slices.Clone(s.cfg.ClaimableResources)
}

func regrant(offers []Offer, catalog *binding.Catalog, claimableRes []schema.GroupResource, spec v1alpha2.APIServiceExportRequestSpec) Grant {
	g := Grant{
		Resources:  make([]bool, len(spec.Resources)),
		Claims:     make([]bool, len(spec.PermissionClaims)),
		Namespaces: make([]bool, len(spec.Namespaces)),
	}
	var dropped, kept []string
	var keptRes []v1alpha2.Resource
	for i, r := range spec.Resources {
		name := v1alpha2.Resource{Group: r.Group, Resource: r.Resource}.Name()
		_, exported := catalog.Lookup(r.Group, r.Resource)
		for _, o := range offers {
			if exported && offersResource(o, r) {
				g.Resources[i] = true
				break
			}
		}
		if g.Resources[i] {
			keptRes = append(keptRes, r)
			kept = append(kept, name)
		} else {
			dropped = append(dropped, "resource "+name)
		}
	}
	// The offers that could still have decided what is kept.
	var holders []Offer
	for _, o := range offers {
		if len(keptRes) > 0 && covers(o, v1alpha2.APIServiceExportRequestSpec{Resources: unversioned(keptRes)}) {
			holders = append(holders, o)
		}
	}
	for i, c := range spec.PermissionClaims {
		if claimable(claimableRes, c) {
			for _, o := range holders {
				if holdsClaim(o, c) {
					g.Claims[i] = true
					break
				}
			}
		}
		if !g.Claims[i] {
			dropped = append(dropped, "permission claim on "+strings.TrimSuffix(v1alpha2.Resource{Group: c.Group, Resource: c.Resource}.Name(), "."))
		}
	}
	for i, n := range spec.Namespaces {
		for _, o := range holders {
			if holdsNamespace(o, n.Name) {
				g.Namespaces[i] = true
				break
			}
		}
		if !g.Namespaces[i] {
			dropped = append(dropped, "namespace "+n.Name)
		}
	}
	switch {
	case len(kept) == 0:
		g.Reason = ReasonOfferWithdrawn
		g.Message = "no offer of this provider holds these resources any more; nothing is granted"
	case len(dropped) > 0:
		g.Reason = ReasonOfferNarrowed
		g.Message = "no longer offered, so no longer granted: " + strings.Join(dropped, ", ")
	}
	return g
}

// offersResource is holdsResource without versions.
func offersResource(o Offer, r v1alpha2.Resource) bool {
	return holdsResource(o, v1alpha2.Resource{Group: r.Group, Resource: r.Resource})
}

func unversioned(rs []v1alpha2.Resource) []v1alpha2.Resource {
	out := make([]v1alpha2.Resource, len(rs))
	for i, r := range rs {
		out[i] = v1alpha2.Resource{Group: r.Group, Resource: r.Resource}
	}
	return out
}

// Regrant is Source.Regrant without templates.
func (c *CatalogCoverer) Regrant(spec v1alpha2.APIServiceExportRequestSpec) Grant {
	return regrant(build(c.catalog, nil, Config{}), c.catalog, nil, spec)
}

// OnChange does nothing: the catalog has its own.
func (c *CatalogCoverer) OnChange(func()) (func(), error) { return func() {}, nil }
