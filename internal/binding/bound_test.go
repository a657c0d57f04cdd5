package binding

import (
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

func exportsOf(t testing.TB, docs ...string) []unstructured.Unstructured {
	t.Helper()
	var out []unstructured.Unstructured
	for _, d := range docs {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(d), &obj); err != nil {
			t.Fatal(err)
		}
		out = append(out, unstructured.Unstructured{Object: obj})
	}
	return out
}

// The exports' resources, v1alpha2 or v1alpha1, are read by type; fields
// of the wrong type are skipped, not trusted and not a panic. A resource
// bound under another request name is refused, naming both; the same
// name (a rebind) and unbound resources are not.
func TestAlreadyBound(t *testing.T) {
	holders := exportHolders(exportsOf(t,
		`{metadata: {name: widgets.example.com}, spec: {resources: [{group: example.com, resource: widgets}, {resource: configmaps}]}}`,
		`{metadata: {name: gadgets.example.com}, spec: {group: example.com, names: {plural: gadgets, kind: Gadget}}}`,
		`{metadata: {name: odd}, spec: {resources: [7, {group: [x], resource: sprockets}, {group: example.com, resource: {a: b}}, null]}}`,
		`{metadata: {name: odd2}, spec: {resources: "all", group: 3, names: [gizmos]}}`,
		`{metadata: {name: nospec}, spec: [widgets]}`,
		`{metadata: {name: also}, spec: {resources: [{group: example.com, resource: widgets}]}}`,
	))
	want := map[schema.GroupResource][]string{
		{Group: "example.com", Resource: "widgets"}: {"also", "widgets.example.com"},
		{Resource: "configmaps"}:                    {"widgets.example.com"},
		{Group: "example.com", Resource: "gadgets"}: {"gadgets.example.com"},
		{Resource: "sprockets"}:                     {"odd"},
	}
	if len(holders) != len(want) {
		t.Errorf("holders %v, want %v", holders, want)
	}
	for gr, names := range want {
		if got := holders[gr]; len(got) != len(names) || got[0] != names[0] || got[len(got)-1] != names[len(names)-1] {
			t.Errorf("%s held by %v, want %v", gr, got, names)
		}
	}

	one := exportHolders(exportsOf(t, `{metadata: {name: gadgets.example.com}, spec: {group: example.com, names: {plural: gadgets}}}`))
	for _, tc := range []struct {
		resources []Resource
		by        string // "" for no refusal
	}{
		{[]Resource{{Group: "example.com", Resource: "gadgets"}}, ""},
		{[]Resource{{Group: "example.com", Resource: "gadgets", Request: "gadgets.example.com"}}, ""},
		{[]Resource{{Group: "example.com", Resource: "widgets", Request: "gizmo-kit"}}, ""},
		{[]Resource{{Group: "example.com", Resource: "widgets", Request: "gizmo-kit"}, {Group: "example.com", Resource: "gadgets", Request: "gizmo-kit"}}, "gadgets.example.com"},
		{[]Resource{{Group: "example.com", Resource: "gadgets", Request: "gadgets"}}, "gadgets.example.com"},
	} {
		err := alreadyBound(one, tc.resources)
		var bound *AlreadyBoundError
		switch {
		case tc.by == "" && err != nil:
			t.Errorf("%+v refused: %v", tc.resources, err)
		case tc.by != "" && (!errors.As(err, &bound) || bound.By != tc.by || bound.Resource.String() != "gadgets.example.com"):
			t.Errorf("%+v: %v, want gadgets.example.com refused as bound by %s", tc.resources, err, tc.by)
		}
	}
	// The request a resource two exports hold is bound by is neither: refused.
	if err := alreadyBound(holders, []Resource{{Group: "example.com", Resource: "widgets", Request: "also"}}); err == nil {
		t.Error("widgets, which two exports hold, bound again through one of them")
	}
}

// exportHolders reads exports anyone may have edited: whatever their
// fields hold, it neither panics nor reports a holder without a name or
// a resource without a resource name.
func FuzzExportHolders(f *testing.F) {
	f.Add(`{"metadata":{"name":"widgets.example.com"},"spec":{"resources":[{"group":"example.com","resource":"widgets"}]}}`)
	f.Add(`{"metadata":{"name":"gadgets.example.com"},"spec":{"group":"example.com","names":{"plural":"gadgets"}}}`)
	f.Add(`{"metadata":{"name":"x"},"spec":{"resources":[1,null,{"resource":["a"]}],"names":"n"}}`)
	f.Add(`{"metadata":{"name":7},"spec":null}`)
	f.Fuzz(func(t *testing.T, raw string) {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(raw), &obj); err != nil || obj == nil {
			return
		}
		// GetName panics on nothing, but reports "" for a name of the wrong type.
		holders := exportHolders([]unstructured.Unstructured{{Object: obj}})
		for gr, names := range holders {
			if gr.Resource == "" || len(names) != 1 || names[0] == "" {
				t.Fatalf("holders %v", holders)
			}
			if err := alreadyBound(holders, []Resource{{Group: gr.Group, Resource: gr.Resource, Request: names[0]}}); err != nil {
				t.Fatalf("a rebind through its own request refused: %v", err)
			}
		}
	})
}
