package exports

import (
	"encoding/json"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/kbprovider/backend/internal/binding"
)

// The APIServiceExport spec, with exactly the fields of
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
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := utiljson.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// splitName splits "<resource>.<group>" at the first dot.
func splitName(name string) (group, resource string) {
	resource, group, _ = strings.Cut(name, ".")
	return group, resource
}
