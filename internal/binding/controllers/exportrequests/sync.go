package exportrequests

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/binding/kbcache"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// syncExports keeps every wanted or existing export of the namespace in
// step with its CRDs and deletes those with a CRD gone or no longer
// exported, or no longer offered. An export whose request is gone is
// judged against today's offers as its request would be. It returns the
// exported CRDs the consumer has bound and every export kept.
func (r *run) syncExports(ctx context.Context, ns string, wanted map[string]*wantedExport) ([]*apiextensionsv1.CustomResourceDefinition, []*wantedExport, error) {
	exports, err := r.inNamespace(ctx, kbmanager.Export, ns)
	if err != nil {
		return nil, nil, err
	}
	existing := map[string]*unstructured.Unstructured{}
	for _, e := range exports {
		existing[e.GetName()] = e
		if wanted[e.GetName()] == nil {
			w := fromExport(e)
			if _, err := r.regrant(ctx, w); err != nil {
				return nil, nil, err
			}
			wanted[e.GetName()] = w
		}
	}
	holders, err := r.exportHolders(ctx, ns)
	if err != nil {
		return nil, nil, err
	}
	names := make([]string, 0, len(wanted))
	for n := range wanted {
		names = append(names, n)
	}
	sort.Strings(names)
	var bound []*apiextensionsv1.CustomResourceDefinition
	var kept []*wantedExport
	seen := map[string]bool{}
	for _, name := range names {
		w, have := wanted[name], existing[name]
		if have == nil && exportedElsewhere(holders, w) != "" {
			// A request decided before the upgrade, whose resource an
			// export of another name holds: leave that one alone.
			continue
		}
		if w.withdrawn {
			if err := r.deleteExport(ctx, ns, have, ""); err != nil {
				return nil, nil, err
			}
			continue
		}
		crds, missing := r.exportedCRDs(w)
		if missing != "" {
			if err := r.deleteExport(ctx, ns, have, missing); err != nil {
				return nil, nil, err
			}
			continue
		}
		if err := r.applyExport(ctx, ns, w, crds, have); err != nil {
			return nil, nil, err
		}
		kept = append(kept, w)
		for _, crd := range crds {
			if !seen[crd.Name] {
				seen[crd.Name] = true
				bound = append(bound, crd)
			}
		}
	}
	return bound, kept, nil
}

// exportedCRDs returns the CRD of each resource of w, or the name of the
// first one that is not exported.
func (r *run) exportedCRDs(w *wantedExport) ([]*apiextensionsv1.CustomResourceDefinition, string) {
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, res := range w.spec.Resources {
		crd, ok := r.cfg.Catalog.ExportedCRD(res.Group, res.Resource)
		if !ok {
			return nil, res.Name()
		}
		out = append(out, crd)
	}
	if len(out) == 0 {
		return nil, w.name
	}
	return out, ""
}

// deleteExport deletes have: a CRD of it (missing) is no longer
// exported, or, with missing "", no offer holds any of its resources.
func (r *run) deleteExport(ctx context.Context, ns string, have *unstructured.Unstructured, missing string) error {
	if have == nil || have.GetDeletionTimestamp() != nil {
		return nil
	}
	if missing != "" {
		// The catalog's cache may lag a CRD labelled just now, which
		// another controller (a leader handover) has already exported:
		// ask the API server before deleting.
		resource, group, _ := strings.Cut(missing, ".")
		exported, err := r.cfg.Catalog.ExportedNow(ctx, group, resource)
		if err != nil {
			return fmt.Errorf("checking whether %s is exported: %w", missing, err)
		}
		if exported {
			return &requeueAfter{d: time.Second, reason: "the catalog has not seen " + missing + " exported yet"}
		}
	}
	uid := have.GetUID()
	err := r.dynamic.Resource(kbresources.APIServiceExportsV1alpha2).Namespace(ns).Delete(ctx, have.GetName(),
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting APIServiceExport %s/%s: %w", ns, have.GetName(), err)
	}
	if missing == "" {
		r.log.Info("exports: APIServiceExport deleted, no offer holds it any more", "namespace", ns, "export", have.GetName())
		return nil
	}
	r.log.Info("exports: APIServiceExport deleted, a CRD of it is no longer exported", "namespace", ns,
		"export", have.GetName(), "crd", missing)
	return nil
}

// applyExport creates or updates the export w in ns: its v1alpha2 fields
// and, for a dual export, the v1alpha1 fields (the CRD copy), each under
// its own field manager, each only when it differs from have (the cached
// export).
func (r *run) applyExport(ctx context.Context, ns string, w *wantedExport, crds []*apiextensionsv1.CustomResourceDefinition, have *unstructured.Unstructured) error {
	scope := informerScope(r.cfg.Catalog.Scope())
	v2 := map[string]any{"resources": w.resources, "informerScope": scope, "isolation": v1alpha2.IsolationPrefixed}
	absent := []string{}
	if len(w.claims) > 0 {
		v2["permissionClaims"] = w.claims
	} else {
		// Claims no longer offered: applying without them drops them.
		absent = append(absent, "permissionClaims")
	}
	if err := r.applyExportFields(ctx, ns, w.name, fieldManagerV1alpha2, v2, have, absent...); err != nil {
		return err
	}
	if !w.dual {
		return nil
	}
	v1, err := desiredExportSpec(crds[0], r.cfg.Catalog.Scope())
	if err != nil {
		return err
	}
	return r.applyExportFields(ctx, ns, w.name, fieldManager, v1, have)
}

func (r *run) applyExportFields(ctx context.Context, ns, name, manager string, spec map[string]any, have *unstructured.Unstructured, absent ...string) error {
	if inStep(have, spec, absent...) {
		return nil
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kbresources.APIServiceExportsV1alpha2.GroupVersion().String(),
		"kind":       v1alpha2.KindAPIServiceExport,
		"metadata": map[string]any{
			"name":      name,
			"namespace": ns,
			"labels":    map[string]any{binding.LabelManagedBy: binding.ManagedByValue},
		},
		"spec": spec,
	}}
	_, err := r.dynamic.Resource(kbresources.APIServiceExportsV1alpha2).Namespace(ns).Apply(ctx, name, obj,
		metav1.ApplyOptions{FieldManager: manager, Force: true})
	if err != nil {
		return fmt.Errorf("applying APIServiceExport %s/%s: %w", ns, name, err)
	}
	r.log.Info("exports: APIServiceExport applied", "namespace", ns, "export", name, "fields", manager)
	return nil
}

// inStep says whether have (a cached object of the backend's) already
// holds every field of spec with the same value, and none of absent. The
// cache holds some fields only as their digest (kbmanager.DigestedSpec).
func inStep(have *unstructured.Unstructured, spec map[string]any, absent ...string) bool {
	if have == nil || have.GetDeletionTimestamp() != nil || have.GetLabels()[binding.LabelManagedBy] != binding.ManagedByValue {
		return false
	}
	haveSpec, _, _ := unstructured.NestedMap(have.Object, "spec")
	for _, k := range absent {
		if _, ok := haveSpec[k]; ok {
			return false
		}
	}
	for k, v := range spec {
		if slices.Contains(kbmanager.DigestedSpec, k) {
			if haveSpec[k] != kbcache.Digest(v) {
				return false
			}
			continue
		}
		if !equality.Semantic.DeepEqual(haveSpec[k], v) {
			return false
		}
	}
	return true
}

// syncBoundSchemas keeps one BoundSchema per bound CRD in step with it and
// deletes the BoundSchemas no export of the namespace uses any more.
func (r *run) syncBoundSchemas(ctx context.Context, ns string, bound []*apiextensionsv1.CustomResourceDefinition) error {
	schemas, err := r.inNamespace(ctx, kbmanager.BoundSchema, ns)
	if err != nil {
		return err
	}
	have := map[string]*unstructured.Unstructured{}
	for _, s := range schemas {
		have[s.GetName()] = s
	}
	for _, crd := range bound {
		if err := r.applyBoundSchema(ctx, ns, crd, have[crd.Name]); err != nil {
			return err
		}
		delete(have, crd.Name)
	}
	for name, s := range have {
		if s.GetDeletionTimestamp() != nil || s.GetLabels()[binding.LabelManagedBy] != binding.ManagedByValue {
			continue
		}
		uid := s.GetUID()
		err := r.dynamic.Resource(kbresources.BoundSchemas).Namespace(ns).Delete(ctx, name,
			metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting BoundSchema %s/%s: %w", ns, name, err)
		}
		r.log.Info("exports: BoundSchema deleted, no export uses it", "namespace", ns, "boundschema", name)
	}
	return nil
}

// applyBoundSchema makes the BoundSchema of crd in ns, unless have is
// already in step. Only the spec: the konnector owns the status.
func (r *run) applyBoundSchema(ctx context.Context, ns string, crd *apiextensionsv1.CustomResourceDefinition, have *unstructured.Unstructured) error {
	spec, err := desiredBoundSchemaSpec(crd, r.cfg.Catalog.Scope())
	if err != nil {
		return err
	}
	if inStep(have, spec) {
		return nil
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kbresources.BoundSchemas.GroupVersion().String(),
		"kind":       v1alpha2.KindBoundSchema,
		"metadata": map[string]any{
			"name":      crd.Name,
			"namespace": ns,
			"labels":    map[string]any{binding.LabelManagedBy: binding.ManagedByValue},
		},
		"spec": spec,
	}}
	_, err = r.dynamic.Resource(kbresources.BoundSchemas).Namespace(ns).Apply(ctx, crd.Name, obj,
		metav1.ApplyOptions{FieldManager: fieldManagerV1alpha2, Force: true})
	if err != nil {
		return fmt.Errorf("applying BoundSchema %s/%s: %w", ns, crd.Name, err)
	}
	r.log.Info("exports: BoundSchema applied", "namespace", ns, "boundschema", crd.Name, "crd_generation", crd.Generation)
	return nil
}
