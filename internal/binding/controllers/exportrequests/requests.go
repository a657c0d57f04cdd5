package exportrequests

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/binding/kbcache"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// wantedExport is one APIServiceExport a consumer namespace should have:
// from a succeeded request of its name, else from the export as stored.
type wantedExport struct {
	name string
	spec v1alpha2.APIServiceExportRequestSpec
	// resources and claims as stored (defaults applied), so that what is
	// applied compares equal to an export already in step.
	resources, claims []any
	// dual: v1alpha1 can express it (one resource, named after it, no
	// claims, no namespaces), so the export also carries the v1alpha1
	// fields for konnectors before v0.5.
	dual bool
	// withdrawn: no offer holds any of its resources any more (regrant).
	withdrawn bool
}

// fromRequest is the export a request asks for.
func fromRequest(req *unstructured.Unstructured) (*wantedExport, error) {
	spec, err := requestSpec(req)
	if err != nil {
		return nil, err
	}
	w := &wantedExport{name: req.GetName(), spec: spec}
	w.resources, _, _ = unstructured.NestedSlice(req.Object, "spec", "resources")
	w.claims, _, _ = unstructured.NestedSlice(req.Object, "spec", "permissionClaims")
	w.dual = len(spec.Resources) == 1 && spec.Resources[0].Name() == req.GetName() &&
		len(spec.PermissionClaims) == 0 && len(spec.Namespaces) == 0
	return w, nil
}

// fromExport is an export as stored: its v1alpha2 resources, or, for one
// written before v1alpha2, the one resource its v1alpha1 fields name.
func fromExport(e *unstructured.Unstructured) *wantedExport {
	w := &wantedExport{name: e.GetName()}
	w.resources, _, _ = unstructured.NestedSlice(e.Object, "spec", "resources")
	w.claims, _, _ = unstructured.NestedSlice(e.Object, "spec", "permissionClaims")
	group, hasGroup, _ := unstructured.NestedString(e.Object, "spec", "group")
	w.dual = hasGroup
	if len(w.resources) == 0 && hasGroup {
		plural, _, _ := unstructured.NestedString(e.Object, "spec", "names", "plural")
		w.resources = []any{map[string]any{"group": group, "resource": plural}}
	}
	_ = convert(map[string]any{"resources": w.resources, "permissionClaims": w.claims}, &w.spec)
	return w
}

func requestSpec(req *unstructured.Unstructured) (v1alpha2.APIServiceExportRequestSpec, error) {
	var spec v1alpha2.APIServiceExportRequestSpec
	raw, found, _ := unstructured.NestedMap(req.Object, "spec")
	if !found {
		return spec, fmt.Errorf("spec.resources is missing")
	}
	if err := convert(raw, &spec); err != nil || len(spec.Resources) == 0 {
		return spec, fmt.Errorf("spec.resources must list at least one {group, resource}")
	}
	return spec, nil
}

func convert(in any, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

// answerRequests decides every pending request of the namespace and
// returns the exports of all succeeded ones by name, each narrowed to what
// today's offers still hold (regrant). A decided request is never decided
// again (its phase is terminal), but what it is granted is judged on every
// pass: its status may have been written by anyone, and offers change.
func (r *run) answerRequests(ctx context.Context, ns string) (map[string]*wantedExport, error) {
	holders, err := r.exportHolders(ctx, ns)
	if err != nil {
		return nil, err
	}
	requests, err := r.inNamespace(ctx, kbmanager.ExportRequest, ns)
	if err != nil {
		return nil, err
	}
	wanted := map[string]*wantedExport{}
	for _, req := range requests {
		phase, _, _ := unstructured.NestedString(req.Object, "status", "phase")
		if phase == PhaseFailed || phase != PhaseSucceeded && req.GetDeletionTimestamp() != nil {
			continue
		}
		w, err := fromRequest(req)
		if phase == PhaseSucceeded {
			if err == nil {
				g, err := r.regrant(ctx, w)
				if err != nil {
					return nil, err
				}
				if err := r.setGranted(ctx, req, g); err != nil {
					return nil, err
				}
				wanted[w.name] = w
			}
			continue
		}
		problem := ""
		if err != nil {
			problem = err.Error()
		} else if _, problem = r.cfg.Offers.Cover(w.spec); problem == "" {
			problem = exportedElsewhere(holders, w)
		}
		if problem != "" {
			if err := r.setPhase(ctx, req, PhaseFailed, problem); err != nil {
				return nil, err
			}
			continue
		}
		if err := r.answer(ctx, ns, req, w); err != nil {
			return nil, err
		}
		wanted[w.name] = w
		for _, res := range w.spec.Resources {
			holders[res.Name()] = w.name
		}
	}
	return wanted, nil
}

// regrant narrows w to what today's offers still hold (offers.Regrant):
// never more than it asked for. An export left without resources is
// withdrawn. The catalog's cache may lag a CRD labelled just now, which
// another controller (a leader handover) has already granted: a resource
// dropped as not exported is asked of the API server first.
func (r *run) regrant(ctx context.Context, w *wantedExport) (offers.Grant, error) {
	g := r.cfg.Offers.Regrant(w.spec)
	if len(g.Resources) != len(w.resources) || len(g.Claims) != len(w.claims) {
		// The stored lists do not match their decoded form: grant nothing.
		g = offers.Grant{Resources: make([]bool, len(w.resources)), Claims: make([]bool, len(w.claims)),
			Namespaces: make([]bool, len(w.spec.Namespaces)), Reason: offers.ReasonOfferWithdrawn,
			Message: "the request cannot be read; nothing is granted"}
	}
	for i, res := range w.spec.Resources {
		if i >= len(g.Resources) || g.Resources[i] {
			continue
		}
		if _, ok := r.cfg.Catalog.ExportedCRD(res.Group, res.Resource); ok {
			continue
		}
		exported, err := r.cfg.Catalog.ExportedNow(ctx, res.Group, res.Resource)
		if err != nil {
			return g, fmt.Errorf("checking whether %s is exported: %w", res.Name(), err)
		}
		if exported {
			return g, &requeueAfter{d: time.Second, reason: "the catalog has not seen " + res.Name() + " exported yet"}
		}
	}
	w.spec.Resources = keep(w.spec.Resources, g.Resources)
	w.resources = keep(w.resources, g.Resources)
	w.spec.PermissionClaims = keep(w.spec.PermissionClaims, g.Claims)
	w.claims = keep(w.claims, g.Claims)
	w.spec.Namespaces = keep(w.spec.Namespaces, g.Namespaces)
	w.withdrawn = len(w.spec.Resources) == 0
	return g, nil
}

// keep returns the items of s whose mask entry is true.
func keep[T any](s []T, mask []bool) []T {
	var out []T
	for i, v := range s {
		if i < len(mask) && mask[i] {
			out = append(out, v)
		}
	}
	return out
}

// Granted condition of a request: False with the reason and message of
// offers.Grant while it is granted less than it asked for; True again when
// everything it asked for is offered once more. Absent: fully granted.
const (
	ConditionGranted = "Granted"
	reasonOffered    = "Offered"
	grantedManager   = "kube-bind-backend/granted"
)

// setGranted writes the Granted condition of req when it differs from g.
// Server-side apply owns only this condition; the resourceVersion makes a
// write from a stale cache fail and the next pass look again.
func (r *run) setGranted(ctx context.Context, req *unstructured.Unstructured, g offers.Grant) error {
	var have map[string]any
	conds, _, _ := unstructured.NestedSlice(req.Object, "status", "conditions")
	for _, c := range conds {
		if c, ok := c.(map[string]any); ok && c["type"] == ConditionGranted {
			have = c
		}
	}
	status, reason, message := string(metav1.ConditionFalse), g.Reason, cutCondition(g.Message)
	if g.Reason == "" {
		if have == nil {
			return nil
		}
		status, reason, message = string(metav1.ConditionTrue), reasonOffered, "everything this request asks for is offered"
	}
	if have != nil && have["status"] == status && have["reason"] == reason && have["message"] == message {
		return nil
	}
	since := metav1.Now().UTC().Format(time.RFC3339)
	if t, ok := have["lastTransitionTime"].(string); ok && have["status"] == status {
		since = t
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kbresources.APIServiceExportRequestsV1alpha2.GroupVersion().String(),
		"kind":       "APIServiceExportRequest",
		"metadata": map[string]any{
			"name": req.GetName(), "namespace": req.GetNamespace(), "resourceVersion": req.GetResourceVersion(),
		},
		"status": map[string]any{"conditions": []any{map[string]any{
			"type": ConditionGranted, "status": status, "reason": reason, "message": message, "lastTransitionTime": since,
		}}},
	}}
	_, err := r.dynamic.Resource(kbresources.APIServiceExportRequestsV1alpha2).Namespace(req.GetNamespace()).
		ApplyStatus(ctx, req.GetName(), obj, metav1.ApplyOptions{FieldManager: grantedManager, Force: true})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if apierrors.IsConflict(err) {
		return &requeueAfter{d: time.Second, reason: "request " + req.GetName() + " changed while its grant was judged"}
	}
	if err != nil {
		return fmt.Errorf("setting the Granted condition of %s/%s: %w", req.GetNamespace(), req.GetName(), err)
	}
	r.log.Info("exports: request's grant judged", "namespace", req.GetNamespace(), "request", req.GetName(),
		"granted", status, "reason", reason, "message", message)
	return nil
}

// cutCondition fits a condition message to what the caches keep, so that
// the comparison with the cached condition holds.
func cutCondition(m string) string {
	if len(m) <= kbcache.MaxConditionText {
		return m
	}
	return kbcache.Truncate(m, kbcache.MaxConditionText-len("…")) + "…"
}

// answer makes what a request was granted (its BoundSchemas first, then
// the export: konnector v0.8 needs both) and only then reports success,
// so a client that sees Succeeded finds them.
func (r *run) answer(ctx context.Context, ns string, req *unstructured.Unstructured, w *wantedExport) error {
	crds, missing := r.exportedCRDs(w)
	if missing != "" { // withdrawn since Cover: decide on the next pass
		return fmt.Errorf("%s was withdrawn while answering %s/%s", missing, ns, req.GetName())
	}
	for _, crd := range crds {
		if err := r.applyBoundSchema(ctx, ns, crd, nil); err != nil {
			return err
		}
	}
	if err := r.applyExport(ctx, ns, w, crds, nil); err != nil {
		return err
	}
	return r.setPhase(ctx, req, PhaseSucceeded, "")
}

// exportHolders maps each resource ("<resource>.<group>") exported in ns
// to the export holding it.
func (r *run) exportHolders(ctx context.Context, ns string) (map[string]string, error) {
	exports, err := r.inNamespace(ctx, kbmanager.Export, ns)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range exports {
		for _, res := range fromExport(e).spec.Resources {
			out[res.Name()] = e.GetName()
		}
	}
	return out, nil
}

// exportedElsewhere refuses a second export of a resource: the two would
// fight over the consumer's CRD.
func exportedElsewhere(holders map[string]string, w *wantedExport) string {
	var problems []string
	for _, res := range w.spec.Resources {
		if other, ok := holders[res.Name()]; ok && other != w.name {
			problems = append(problems, fmt.Sprintf("%s is already bound in this namespace by %q", res.Name(), other))
		}
	}
	return strings.Join(problems, "; ")
}

// setPhase decides a request. The patch carries the resourceVersion the
// decision was taken on: if the request changed meanwhile (another
// replica, a stale cache), the API server refuses it and the next pass
// looks again, so a decided request is never flipped.
func (r *run) setPhase(ctx context.Context, req *unstructured.Unstructured, phase, message string) error {
	status := map[string]any{"phase": phase}
	if message != "" {
		status["terminalMessage"] = cutMessage(message)
	}
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": req.GetResourceVersion()},
		"status":   status,
	})
	_, err := r.dynamic.Resource(kbresources.APIServiceExportRequestsV1alpha2).Namespace(req.GetNamespace()).
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

// maxMessage is the schema's bound on terminalMessage and condition
// messages (deploy/crds).
const maxMessage = 4096

// cutMessage fits a message to maxMessage, marking a cut with "…".
func cutMessage(m string) string {
	if len(m) <= maxMessage {
		return m
	}
	return kbcache.Truncate(m, maxMessage-len("…")) + "…"
}
