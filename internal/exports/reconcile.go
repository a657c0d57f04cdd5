package exports

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/kbresources"
)

const fieldManager = "kube-bind-backend"

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
	bound, err := r.syncExports(ctx, nsName, wanted)
	if err != nil {
		return err
	}
	rules := consumerRules(bound)
	if err := r.applyConsumerRBAC(ctx, nsName, nsName, rules); err != nil {
		return fmt.Errorf("granting the consumer its resources in %s: %w", nsName, err)
	}
	return r.syncAPIServiceNamespaces(ctx, nsName, rules)
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

// requested is one entry of a request's spec.resources.
type requested struct {
	Group    string   `json:"group"`
	Resource string   `json:"resource"`
	Versions []string `json:"versions,omitempty"`
}

func (q requested) name() string { return q.Resource + "." + q.Group }

// answerRequests decides every pending request of the namespace and
// returns the export names of all succeeded ones. A decided request is
// never decided again (its phase is terminal).
func (r *run) answerRequests(ctx context.Context, ns string) (map[string]bool, error) {
	wanted := map[string]bool{}
	for _, req := range r.inNamespace(r.requests, ns) {
		phase, _, _ := unstructured.NestedString(req.Object, "status", "phase")
		resources, parseErr := requestedResources(req)
		switch {
		case phase == PhaseSucceeded:
			for _, q := range resources {
				wanted[q.name()] = true
			}
			continue
		case phase == PhaseFailed || req.GetDeletionTimestamp() != nil:
			continue
		}
		problem := ""
		if parseErr != nil {
			problem = parseErr.Error()
		} else {
			problem = r.check(resources)
		}
		if problem != "" {
			if err := r.setPhase(ctx, req, PhaseFailed, problem); err != nil {
				return nil, err
			}
			continue
		}
		for _, q := range resources {
			crd, ok := r.cfg.Catalog.ExportedCRD(q.Group, q.Resource)
			if !ok { // withdrawn since check: decide on the next pass
				return nil, fmt.Errorf("%s was withdrawn while answering %s/%s", q.name(), ns, req.GetName())
			}
			if err := r.applyExport(ctx, ns, crd, nil); err != nil {
				return nil, err
			}
			wanted[q.name()] = true
		}
		if err := r.setPhase(ctx, req, PhaseSucceeded, ""); err != nil {
			return nil, err
		}
	}
	return wanted, nil
}

func requestedResources(req *unstructured.Unstructured) ([]requested, error) {
	raw, found, err := unstructured.NestedFieldNoCopy(req.Object, "spec", "resources")
	if err != nil || !found {
		return nil, fmt.Errorf("spec.resources is missing")
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	var out []requested
	if err := json.Unmarshal(b, &out); err != nil || len(out) == 0 {
		return nil, fmt.Errorf("spec.resources must list at least one {group, resource}")
	}
	return out, nil
}

// check says what is wrong with a request, or "" when every resource is
// exported and serves the versions asked for. A CRD that exists but is not
// exported gets the same answer as one that does not exist, so consumers
// cannot probe the provider's internal APIs.
func (r *run) check(resources []requested) string {
	var problems []string
	for _, q := range resources {
		crd, ok := r.cfg.Catalog.ExportedCRD(q.Group, q.Resource)
		if !ok {
			problems = append(problems, (&binding.NotExportedError{Group: q.Group, Resource: q.Resource}).Error())
			continue
		}
		served := servedVersions(crd)
		for _, v := range q.Versions {
			if !contains(served, v) {
				problems = append(problems, fmt.Sprintf("version %q of %s is not served by this provider (served: %s)",
					v, q.name(), strings.Join(served, ", ")))
			}
		}
	}
	return strings.Join(problems, "; ")
}

func servedVersions(crd *apiextensionsv1.CustomResourceDefinition) []string {
	var out []string
	for _, v := range crd.Spec.Versions {
		if v.Served {
			out = append(out, v.Name)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// setPhase decides a request. The patch carries the resourceVersion the
// decision was taken on: if the request changed meanwhile (another
// replica, a stale cache), the API server refuses it and the next pass
// looks again, so a decided request is never flipped.
func (r *run) setPhase(ctx context.Context, req *unstructured.Unstructured, phase, message string) error {
	status := map[string]any{"phase": phase}
	if message != "" {
		status["terminalMessage"] = message
	}
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": req.GetResourceVersion()},
		"status":   status,
	})
	_, err := r.dynamic.Resource(kbresources.APIServiceExportRequests).Namespace(req.GetNamespace()).
		Patch(ctx, req.GetName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("setting %s/%s to %s: %w", req.GetNamespace(), req.GetName(), phase, err)
	}
	r.log.Info("exports: request answered", "namespace", req.GetNamespace(), "request", req.GetName(), "phase", phase,
		"message", message, "since_creation", time.Since(req.GetCreationTimestamp().Time).Round(time.Millisecond).String())
	return nil
}

// syncExports mirrors the CRD of every wanted or existing export of the
// namespace and deletes those whose CRD is gone or no longer exported. It
// returns the exported CRDs the consumer has bound.
func (r *run) syncExports(ctx context.Context, ns string, wanted map[string]bool) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	existing := map[string]*unstructured.Unstructured{}
	for _, e := range r.inNamespace(r.exports, ns) {
		existing[e.GetName()] = e
		wanted[e.GetName()] = true
	}
	names := make([]string, 0, len(wanted))
	for n := range wanted {
		names = append(names, n)
	}
	sort.Strings(names)
	var bound []*apiextensionsv1.CustomResourceDefinition
	for _, name := range names {
		have := existing[name]
		crd, ok := r.cfg.Catalog.ExportedCRD(splitName(name))
		if !ok {
			if have != nil && have.GetDeletionTimestamp() == nil {
				uid := have.GetUID()
				err := r.dynamic.Resource(kbresources.APIServiceExports).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
				if err != nil && !apierrors.IsNotFound(err) {
					return nil, fmt.Errorf("deleting APIServiceExport %s/%s: %w", ns, name, err)
				}
				r.log.Info("exports: APIServiceExport deleted, its CRD is no longer exported", "namespace", ns, "export", name)
			}
			continue
		}
		if err := r.applyExport(ctx, ns, crd, have); err != nil {
			return nil, err
		}
		bound = append(bound, crd)
	}
	return bound, nil
}

// applyExport creates or updates the APIServiceExport of crd in ns,
// unless have (the cached export) is already in step.
func (r *run) applyExport(ctx context.Context, ns string, crd *apiextensionsv1.CustomResourceDefinition, have *unstructured.Unstructured) error {
	spec, err := desiredExportSpec(crd, r.cfg.Catalog.Scope())
	if err != nil {
		return err
	}
	if have != nil && have.GetDeletionTimestamp() == nil && have.GetLabels()[binding.LabelManagedBy] == binding.ManagedByValue {
		if haveSpec, _, _ := unstructured.NestedMap(have.Object, "spec"); equality.Semantic.DeepEqual(haveSpec, spec) {
			return nil
		}
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kbresources.APIServiceExports.GroupVersion().String(),
		"kind":       "APIServiceExport",
		"metadata": map[string]any{
			"name":      crd.Name,
			"namespace": ns,
			"labels":    map[string]any{binding.LabelManagedBy: binding.ManagedByValue},
		},
		"spec": spec,
	}}
	_, err = r.dynamic.Resource(kbresources.APIServiceExports).Namespace(ns).Apply(ctx, crd.Name, obj, metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("applying APIServiceExport %s/%s: %w", ns, crd.Name, err)
	}
	r.log.Info("exports: APIServiceExport applied", "namespace", ns, "export", crd.Name, "crd_generation", crd.Generation)
	return nil
}
