package exportrequests

import (
	"encoding/json"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/kbprovider/backend/internal/binding"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// The v1alpha1 fields of an APIServiceExport spec (the CRD copy konnectors
// before v0.5 read), with exactly the fields of
// deploy/crds/kube-bind.io_apiserviceexports.yaml (the API server prunes
// anything else, and a mirror that differs from what is stored would be
// written again on every pass).
type exportSpec struct {
	Group                  string                                        `json:"group"`
	Names                  apiextensionsv1.CustomResourceDefinitionNames `json:"names"`
	Scope                  apiextensionsv1.ResourceScope                 `json:"scope"`
	InformerScope          string                                        `json:"informerScope"`
	ClusterScopedIsolation string                                        `json:"clusterScopedIsolation,omitempty"`
	Versions               []exportVersion                               `json:"versions"`
}

type exportVersion struct {
	Name                     string                                           `json:"name"`
	Served                   bool                                             `json:"served"`
	Storage                  bool                                             `json:"storage"`
	Deprecated               bool                                             `json:"deprecated,omitempty"`
	DeprecationWarning       *string                                          `json:"deprecationWarning,omitempty"`
	Schema                   *apiextensionsv1.CustomResourceValidation        `json:"schema,omitempty"`
	Subresources             *apiextensionsv1.CustomResourceSubresources      `json:"subresources,omitempty"`
	AdditionalPrinterColumns []apiextensionsv1.CustomResourceColumnDefinition `json:"additionalPrinterColumns,omitempty"`
}

// desiredBoundSchemaSpec is crd as a BoundSchema spec, as the unstructured
// map the dynamic client reads back (see desiredExportSpec).
func desiredBoundSchemaSpec(crd *apiextensionsv1.CustomResourceDefinition, scope binding.Scope) (map[string]any, error) {
	spec := v1alpha2.BoundSchemaSpec{
		InformerScope: informerScope(scope),
		Group:         crd.Spec.Group,
		Names:         crd.Spec.Names,
		Scope:         crd.Spec.Scope,
	}
	for _, v := range crd.Spec.Versions {
		schema := json.RawMessage(`{}`)
		if v.Schema != nil {
			b, err := json.Marshal(v.Schema)
			if err != nil {
				return nil, err
			}
			schema = b
		}
		spec.Versions = append(spec.Versions, v1alpha2.BoundSchemaVersion{
			Name:                     v.Name,
			Served:                   v.Served,
			Storage:                  v.Storage,
			Deprecated:               v.Deprecated,
			DeprecationWarning:       v.DeprecationWarning,
			Schema:                   schema,
			Subresources:             v.Subresources,
			AdditionalPrinterColumns: v.AdditionalPrinterColumns,
		})
	}
	return toMap(spec)
}

func toMap(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := utiljson.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// informerScope is what the konnector is told: with the Namespaced
// consumer scope it only ever watches the consumer's namespaces.
func informerScope(s binding.Scope) string {
	if s == binding.ScopeCluster {
		return "Cluster"
	}
	return "Namespaced"
}

// desiredExportSpec mirrors crd into an APIServiceExport spec, as the
// unstructured map the dynamic client reads back (integers as int64), so
// that it compares equal to an export that is already in step.
func desiredExportSpec(crd *apiextensionsv1.CustomResourceDefinition, scope binding.Scope) (map[string]any, error) {
	spec := exportSpec{
		Group:         crd.Spec.Group,
		Names:         crd.Spec.Names,
		Scope:         crd.Spec.Scope,
		InformerScope: informerScope(scope),
	}
	if crd.Spec.Scope == apiextensionsv1.ClusterScoped {
		// Objects of consumers are kept apart by a name prefix.
		spec.ClusterScopedIsolation = "Prefixed"
	}
	for _, v := range crd.Spec.Versions {
		spec.Versions = append(spec.Versions, exportVersion{
			Name:                     v.Name,
			Served:                   v.Served,
			Storage:                  v.Storage,
			Deprecated:               v.Deprecated,
			DeprecationWarning:       v.DeprecationWarning,
			Schema:                   v.Schema,
			Subresources:             v.Subresources,
			AdditionalPrinterColumns: v.AdditionalPrinterColumns,
		})
	}
	return toMap(spec)
}
