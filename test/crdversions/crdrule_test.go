// Package crdversions pins down how the real kube-apiserver treats a CRD
// that serves two versions with `conversion: {strategy: None}` and different
// schemas: the "CRD rule" docs/v1alpha2.md §3 rests on.
//
// Observed (kube-apiserver of hack/install-test-binaries.sh): None only
// rewrites apiVersion, and the object is then pruned to the schema of the
// version it is converted to, on every write (to the storage version) and on
// every read (to the requested version). So with different schemas a field
// absent from the storage version's schema is dropped when written, whatever
// version the client used, and a field absent from the requested version's
// schema is invisible when read. A read-modify-write through the other
// version (PUT, or a /status update, which keeps the old spec as read
// through the writer's version) therefore also drops every field the writer
// cannot see. With one combined schema in both versions every field
// survives writes and reads through either version, server-side apply by
// two managers through the two versions included.
package crdversions

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/testutil"
)

const group = "crdrule.example.com"

// fields is an object's spec (or status) as field name -> string value.
type fields map[string]string

// observed is what each step leaves visible, through each version.
type observed struct {
	createdV1, createdV2 fields // created through v1alpha1 with {a, shared}
	updatedV1, updatedV2 fields // then read through v1alpha2, b set, PUT through v1alpha2
	statusV1, statusV2   fields // then read through v1alpha1, status.phase set, PUT /status through v1alpha1 (spec shown)
}

func TestCRDRule(t *testing.T) {
	cp := controlplane.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	crds := apiextensionsclient.NewForConfigOrDie(cp.AdminConfig())
	dyn := dynamic.NewForConfigOrDie(cp.AdminConfig())

	for _, c := range []struct {
		name     string
		storage  string
		combined bool
		want     observed
	}{{
		// Upstream's shape. `a` is not in the storage schema: dropped on
		// create although v1alpha1 accepted it, so it is gone through
		// v1alpha1 too. `b` is stored but invisible through v1alpha1, and a
		// v1alpha1 /status write strips it (the spec is kept as read
		// through v1alpha1, then pruned).
		name: "split schemas, storage v1alpha2", storage: "v1alpha2",
		want: observed{
			createdV1: fields{"shared": "s"}, createdV2: fields{"shared": "s"},
			updatedV1: fields{"shared": "s"}, updatedV2: fields{"b": "b", "shared": "s"},
			statusV1: fields{"shared": "s"}, statusV2: fields{"shared": "s"},
		},
	}, {
		// `a` is stored, visible through v1alpha1 only. The PUT through
		// v1alpha2 loses `a` (the writer never saw it) and `b` too (not in
		// the storage schema): only `shared` is left.
		name: "split schemas, storage v1alpha1", storage: "v1alpha1",
		want: observed{
			createdV1: fields{"a": "a", "shared": "s"}, createdV2: fields{"shared": "s"},
			updatedV1: fields{"shared": "s"}, updatedV2: fields{"shared": "s"},
			statusV1: fields{"shared": "s"}, statusV2: fields{"shared": "s"},
		},
	}, {
		// The design's schema: {a, b, shared} in both versions. Nothing is
		// lost, whatever version writes or reads.
		name: "combined schema, storage v1alpha2", storage: "v1alpha2", combined: true,
		want: observed{
			createdV1: fields{"a": "a", "shared": "s"}, createdV2: fields{"a": "a", "shared": "s"},
			updatedV1: fields{"a": "a", "b": "b", "shared": "s"}, updatedV2: fields{"a": "a", "b": "b", "shared": "s"},
			statusV1: fields{"a": "a", "b": "b", "shared": "s"}, statusV2: fields{"a": "a", "b": "b", "shared": "s"},
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			gr := installCRD(ctx, t, crds, c.storage, c.combined)
			v1 := dyn.Resource(gr.WithVersion("v1alpha1")).Namespace("default")
			v2 := dyn.Resource(gr.WithVersion("v1alpha2")).Namespace("default")
			const name = "obj"

			obj := newObject(gr, "v1alpha1", name)
			obj.Object["spec"] = map[string]any{"a": "a", "shared": "s"}
			if _, err := v1.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			check(ctx, t, "created", v1, v2, name, "spec", c.want.createdV1, c.want.createdV2)

			got, err := v2.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := unstructured.SetNestedField(got.Object, "b", "spec", "b"); err != nil {
				t.Fatal(err)
			}
			if _, err := v2.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			check(ctx, t, "updated through v1alpha2", v1, v2, name, "spec", c.want.updatedV1, c.want.updatedV2)

			got, err = v1.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := unstructured.SetNestedField(got.Object, "Ready", "status", "phase"); err != nil {
				t.Fatal(err)
			}
			if _, err := v1.UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			check(ctx, t, "status written through v1alpha1", v1, v2, name, "spec", c.want.statusV1, c.want.statusV2)
			// status.phase is in every schema: kept through both versions.
			check(ctx, t, "status written through v1alpha1", v1, v2, name, "status", fields{"phase": "Ready"}, fields{"phase": "Ready"})

			if !c.combined {
				return
			}
			// The dual export's write pattern: two managers, each applying its
			// own fields through its own version. Each keeps the other's.
			apply := func(r dynamic.ResourceInterface, version, manager string, spec map[string]any) {
				t.Helper()
				o := newObject(gr, version, "applied")
				o.Object["spec"] = spec
				if _, err := r.Apply(ctx, "applied", o, metav1.ApplyOptions{FieldManager: manager}); err != nil {
					t.Fatal(err)
				}
			}
			apply(v2, "v1alpha2", "gen2", map[string]any{"b": "b", "shared": "s"})
			apply(v1, "v1alpha1", "gen1", map[string]any{"a": "a", "shared": "s"})
			apply(v2, "v1alpha2", "gen2", map[string]any{"b": "b2", "shared": "s"})
			all := fields{"a": "a", "b": "b2", "shared": "s"}
			check(ctx, t, "applied by two managers", v1, v2, "applied", "spec", all, all)
		})
	}
}

func check(ctx context.Context, t *testing.T, step string, v1, v2 dynamic.ResourceInterface, name, field string, want1, want2 fields) {
	t.Helper()
	for _, r := range []struct {
		version string
		client  dynamic.ResourceInterface
		want    fields
	}{{"v1alpha1", v1, want1}, {"v1alpha2", v2, want2}} {
		o, err := r.client.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := o.GetAPIVersion(); got != group+"/"+r.version {
			t.Errorf("%s: read through %s: apiVersion %s", step, r.version, got)
		}
		m, _, err := unstructured.NestedStringMap(o.Object, field)
		if err != nil {
			t.Fatal(err)
		}
		if got := fields(m); !maps.Equal(got, r.want) {
			t.Errorf("%s, read through %s: %s = %v, want %v", step, r.version, field, got, r.want)
		}
	}
}

func newObject(gr schema.GroupResource, version, name string) *unstructured.Unstructured {
	o := &unstructured.Unstructured{Object: map[string]any{}}
	o.SetAPIVersion(gr.Group + "/" + version)
	o.SetKind(kindOf(gr.Resource))
	o.SetName(name)
	o.SetNamespace("default")
	return o
}

func kindOf(plural string) string { return "K" + plural[:len(plural)-1] }

// installCRD creates a namespaced CRD serving v1alpha1 and v1alpha2 with
// conversion None and a status subresource, and waits until both versions
// answer. Split schemas: v1alpha1 spec {a, shared}, v1alpha2 spec {b,
// shared}. Combined: {a, b, shared} in both. Status {phase} in both.
func installCRD(ctx context.Context, t *testing.T, crds apiextensionsclient.Interface, storage string, combined bool) schema.GroupResource {
	t.Helper()
	split := "split"
	if combined {
		split = "combined"
	}
	plural := fmt.Sprintf("%s%ss", split, storage) // e.g. splitv1alpha2s
	str := apiextensionsv1.JSONSchemaProps{Type: "string"}
	schemaOf := func(specFields ...string) *apiextensionsv1.CustomResourceValidation {
		spec := apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{}}
		for _, f := range specFields {
			spec.Properties[f] = str
		}
		return &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
			Type: "object",
			Properties: map[string]apiextensionsv1.JSONSchemaProps{
				"spec":   spec,
				"status": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"phase": str}},
			},
		}}
	}
	s1, s2 := schemaOf("a", "shared"), schemaOf("b", "shared")
	if combined {
		s1, s2 = schemaOf("a", "b", "shared"), schemaOf("a", "b", "shared")
	}
	status := &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}
	kind := kindOf(plural)
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group:      group,
			Names:      apiextensionsv1.CustomResourceDefinitionNames{Plural: plural, Kind: kind, ListKind: kind + "List"},
			Scope:      apiextensionsv1.NamespaceScoped,
			Conversion: &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1alpha1", Served: true, Storage: storage == "v1alpha1", Schema: s1, Subresources: status},
				{Name: "v1alpha2", Served: true, Storage: storage == "v1alpha2", Schema: s2, Subresources: status},
			},
		},
	}
	if _, err := crds.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gr := schema.GroupResource{Group: group, Resource: plural}
	dyn := dynamic.NewForConfigOrDie(controlplane.Get(t).AdminConfig())
	testutil.Await(t, plural+" served in both versions", func() bool {
		for _, v := range []string{"v1alpha1", "v1alpha2"} {
			if _, err := dyn.Resource(gr.WithVersion(v)).Namespace("default").List(ctx, metav1.ListOptions{}); err != nil {
				return false
			}
		}
		return true
	})
	return gr
}
