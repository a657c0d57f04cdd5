package crds

import (
	"encoding/json"
	"testing"
)

// The embedded files decode strictly into CRDs with the names the rest of
// the project uses, and every one follows the shared conventions: the
// kinds both generations share serve v1alpha1 and v1alpha2 with one schema
// and store v1alpha2; the others serve v1alpha2 only.
func TestCRDsDecode(t *testing.T) {
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	shared := map[string]bool{APIServiceExportRequests: true, APIServiceExports: true, APIServiceNamespaces: true, ClusterBindings: true}
	clusterScoped := map[string]bool{APIServiceExportTemplates: true, Collections: true}
	want := []string{APIServiceExportRequests, APIServiceExports, APIServiceExportTemplates, APIServiceNamespaces,
		BoundSchemas, ClusterBindings, Collections}
	if len(crds) != len(want) {
		t.Fatalf("got %d CRDs, want %d", len(crds), len(want))
	}
	for i, crd := range crds {
		if crd.Name != want[i] {
			t.Errorf("CRD %d is %s, want %s", i, crd.Name, want[i])
		}
		scope, category := "Namespaced", "kube-bindings"
		if clusterScoped[crd.Name] {
			scope, category = "Cluster", "kube-bind"
		}
		if crd.Spec.Group != Group || string(crd.Spec.Scope) != scope {
			t.Errorf("%s: group %q scope %q", crd.Name, crd.Spec.Group, crd.Spec.Scope)
		}
		if len(crd.Spec.Names.Categories) != 1 || crd.Spec.Names.Categories[0] != category {
			t.Errorf("%s: categories %v", crd.Name, crd.Spec.Names.Categories)
		}
		wantVersions := []string{"v1alpha2"}
		if shared[crd.Name] {
			wantVersions = []string{"v1alpha2", "v1alpha1"}
			if crd.Spec.Conversion == nil || crd.Spec.Conversion.Strategy != "None" {
				t.Errorf("%s: conversion %+v, want strategy None", crd.Name, crd.Spec.Conversion)
			}
		}
		if len(crd.Spec.Versions) != len(wantVersions) {
			t.Fatalf("%s: versions %+v", crd.Name, crd.Spec.Versions)
		}
		for j, v := range crd.Spec.Versions {
			if v.Name != wantVersions[j] || !v.Served || v.Storage != (v.Name == "v1alpha2") {
				t.Errorf("%s: version %s served %v storage %v", crd.Name, v.Name, v.Served, v.Storage)
			}
			if v.Subresources == nil || v.Subresources.Status == nil {
				t.Errorf("%s %s: no status subresource", crd.Name, v.Name)
			}
			if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil || len(v.Schema.OpenAPIV3Schema.Properties) == 0 {
				t.Errorf("%s %s: no schema", crd.Name, v.Name)
			}
		}
		if len(crd.Spec.Versions) == 2 {
			a, _ := json.Marshal(crd.Spec.Versions[0].Schema)
			b, _ := json.Marshal(crd.Spec.Versions[1].Schema)
			if string(a) != string(b) {
				t.Errorf("%s: the two versions' schemas differ; a field of one would be pruned through the other", crd.Name)
			}
		}
	}
}
