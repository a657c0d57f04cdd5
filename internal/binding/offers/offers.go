// Package offers says what a consumer may bind: the exported CRDs of the
// catalog, each an implicit offer of one resource, and the provider's
// APIServiceExportTemplates that stay within the catalog, grouped by
// Collections. The HTTP API lists offers and binds them; the exports
// controller decides a request by the offer that covers it.
package offers

import (
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// Offer is one thing a consumer can pick.
type Offer struct {
	// Name is the template's name, or "<resource>.<group>" for an
	// implicit offer.
	Name        string
	Description string
	// Resources list every resource with the versions offered.
	Resources          []v1alpha2.Resource
	PermissionClaims   []v1alpha2.PermissionClaim
	Namespaces         []v1alpha2.NameRef
	SchemaUpdatePolicy string
	// Implicit: made from one exported CRD, not from a template.
	Implicit bool
}

// Collection groups offers by name, in the order the provider listed them.
type Collection struct {
	Name        string
	Description string
	Offers      []string
}
