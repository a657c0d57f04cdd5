package crds

import "testing"

// The embedded files decode strictly into CRDs with the names the rest of
// the project uses, and every one follows the shared conventions.
func TestCRDsDecode(t *testing.T) {
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{APIServiceExportRequests, APIServiceExports, APIServiceNamespaces, ClusterBindings}
	if len(crds) != len(want) {
		t.Fatalf("got %d CRDs, want %d", len(crds), len(want))
	}
	for i, crd := range crds {
		if crd.Name != want[i] {
			t.Errorf("CRD %d is %s, want %s", i, crd.Name, want[i])
		}
		if crd.Spec.Group != Group || crd.Spec.Scope != "Namespaced" {
			t.Errorf("%s: group %q scope %q", crd.Name, crd.Spec.Group, crd.Spec.Scope)
		}
		if len(crd.Spec.Names.Categories) != 1 || crd.Spec.Names.Categories[0] != "kube-bindings" {
			t.Errorf("%s: categories %v", crd.Name, crd.Spec.Names.Categories)
		}
		if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != "v1alpha1" {
			t.Fatalf("%s: versions %+v", crd.Name, crd.Spec.Versions)
		}
		v := crd.Spec.Versions[0]
		if v.Subresources == nil || v.Subresources.Status == nil {
			t.Errorf("%s: no status subresource", crd.Name)
		}
		if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil || len(v.Schema.OpenAPIV3Schema.Properties) == 0 {
			t.Errorf("%s: no schema", crd.Name)
		}
	}
}
