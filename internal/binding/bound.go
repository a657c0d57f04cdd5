package binding

import (
	"context"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// A consumer namespace binds a resource through one export request: the
// controllers refuse a request for a resource that an export of another
// name holds there. A bind that would hand the CLI such a request is
// refused before anything is made or issued, since the CLI would only
// find out after the bind, holding a new credential and a failed request.

// AlreadyBoundError: a selected resource is bound in the consumer's
// namespace already, by an export of another name than the request the
// bind would make for it.
type AlreadyBoundError struct {
	Resource schema.GroupResource
	// By names the export (the request) that binds it; Request the one
	// the bind would make.
	By, Request string
}

func (e *AlreadyBoundError) Error() string {
	return fmt.Sprintf("%s is already bound in this cluster by %q (this bind's request is %q)", e.Resource, e.By, e.Request)
}

// RequestName is the name of the request r is bound through: r.Request,
// or, when that is empty, the resource's own name (<resource>.<group>),
// the name of its implicit offer.
func (r Resource) RequestName() string {
	if r.Request != "" {
		return r.Request
	}
	return schema.GroupResource{Group: r.Group, Resource: r.Resource}.String()
}

// checkBound refuses resources that the exports in namespace ns bind
// under another request name. One list, in a namespace the backend may
// list cluster-wide anyway (BackendClusterRole), so it needs no grant in
// the namespace first.
func (p *Provisioner) checkBound(ctx context.Context, ns string, resources []Resource) error {
	list, err := p.dynamic.Resource(kbresources.APIServiceExportsV1alpha2).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("binding in provider namespace %s: listing what is bound there: %w", ns, err)
	}
	return alreadyBound(exportHolders(list.Items), resources)
}

// alreadyBound returns an *AlreadyBoundError for the first of resources
// that holders (exportHolders) bind under a name other than its request's.
func alreadyBound(holders map[schema.GroupResource][]string, resources []Resource) error {
	for _, r := range resources {
		gr := schema.GroupResource{Group: r.Group, Resource: r.Resource}
		for _, by := range holders[gr] {
			if by != r.RequestName() {
				return &AlreadyBoundError{Resource: gr, By: by, Request: r.RequestName()}
			}
		}
	}
	return nil
}

// exportHolders maps each resource the exports bind to the names of the
// exports holding it, sorted. Exports carry v1alpha2 resources, or, when
// written before v1alpha2, the one resource of their v1alpha1 fields.
// The backend writes them, but the consumer may write their status and
// anyone with rights may edit them: every field is checked for its type,
// and anything else is skipped.
func exportHolders(exports []unstructured.Unstructured) map[schema.GroupResource][]string {
	out := map[schema.GroupResource][]string{}
	add := func(gr schema.GroupResource, name string) {
		if gr.Resource == "" || slices.Contains(out[gr], name) {
			return
		}
		out[gr] = append(out[gr], name)
		slices.Sort(out[gr])
	}
	for _, e := range exports {
		name := e.GetName()
		spec, ok := e.Object["spec"].(map[string]any)
		if name == "" || !ok {
			continue
		}
		resources, _ := spec["resources"].([]any)
		for _, item := range resources {
			m, ok := item.(map[string]any)
			if !ok {
				continue
			}
			group, _ := m["group"].(string)
			resource, _ := m["resource"].(string)
			add(schema.GroupResource{Group: group, Resource: resource}, name)
		}
		if len(resources) == 0 {
			group, _ := spec["group"].(string)
			names, _ := spec["names"].(map[string]any)
			plural, _ := names["plural"].(string)
			add(schema.GroupResource{Group: group, Resource: plural}, name)
		}
	}
	return out
}
