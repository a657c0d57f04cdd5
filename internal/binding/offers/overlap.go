package offers

import (
	"slices"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// A consumer namespace binds a resource through one export request only:
// two offers that both hold a resource cannot both be picked, since each
// becomes a request and the second would be refused, leaving the bind
// half made. A template and the implicit offer of a CRD it holds are the
// usual pair.

// Overlap is a resource two offers both hold.
type Overlap struct {
	// First and Second name the offers, in the order they were given.
	First, Second string
	Resource      schema.GroupResource
}

// FirstOverlap returns the first resource that two of picked hold, or
// false when no two of them share a resource. An offer given twice is
// not an overlap with itself.
func FirstOverlap(picked []Offer) (Overlap, bool) {
	heldBy := map[schema.GroupResource]string{}
	for _, o := range picked {
		for _, gr := range o.groupResources() {
			if other, taken := heldBy[gr]; taken && other != o.Name {
				return Overlap{First: other, Second: o.Name, Resource: gr}, true
			}
			heldBy[gr] = o.Name
		}
	}
	return Overlap{}, false
}

// Overlapping maps the name of each offer of list that shares a resource
// with another to the names of those others, sorted.
func Overlapping(list []Offer) map[string][]string {
	holders := map[schema.GroupResource][]string{}
	for _, o := range list {
		for _, gr := range o.groupResources() {
			if !slices.Contains(holders[gr], o.Name) {
				holders[gr] = append(holders[gr], o.Name)
			}
		}
	}
	out := map[string][]string{}
	for _, names := range holders {
		for _, a := range names {
			for _, b := range names {
				if a != b && !slices.Contains(out[a], b) {
					out[a] = append(out[a], b)
				}
			}
		}
	}
	for _, others := range out {
		slices.Sort(others)
	}
	return out
}

// Distinct is list with every implicit offer left out that a template of
// list repeats: the same one resource with the same versions and schema
// policy, and no claims or namespaces. Both would bind the same, and only
// one of them may be picked, so a page shows the template alone. An
// implicit offer that grants less than the templates holding its
// resource stays: it is the way to bind the CRD without their claims.
func Distinct(list []Offer) []Offer {
	out := make([]Offer, 0, len(list))
	for _, o := range list {
		if o.Implicit && slices.ContainsFunc(list, func(t Offer) bool { return !t.Implicit && repeats(t, o) }) {
			continue
		}
		out = append(out, o)
	}
	return out
}

// repeats says whether template t binds exactly what implicit offer o
// binds.
func repeats(t, o Offer) bool {
	if len(t.Resources) != 1 || len(o.Resources) != 1 || len(t.PermissionClaims) > 0 || len(t.Namespaces) > 0 ||
		t.SchemaUpdatePolicy != o.SchemaUpdatePolicy {
		return false
	}
	a, b := t.Resources[0], o.Resources[0]
	return a.Group == b.Group && a.Resource == b.Resource && sameSet(a.Versions, b.Versions)
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// groupResources are the resources o holds, each once.
func (o Offer) groupResources() []schema.GroupResource {
	var out []schema.GroupResource
	for _, r := range o.Resources {
		gr := schema.GroupResource{Group: r.Group, Resource: r.Resource}
		if !slices.Contains(out, gr) {
			out = append(out, gr)
		}
	}
	return out
}
