// Package v1alpha2 holds the kube-bind.io/v1alpha2 types this backend
// speaks with the released kubectl-bind v0.7/v0.8 CLIs and konnector v0.8:
// the HTTP wire types (discovery, BindingResponse, the template bind
// request, errors) and the provider-side objects the backend and the
// konnector share. JSON names follow the released tools exactly; see
// docs/v1alpha2.md.
package v1alpha2

import (
	"encoding/json"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

const (
	// ProviderAPIVersion is the bare apiVersion of a BindingProvider.
	ProviderAPIVersion = "v1alpha2"
	// Group and Version of the provider objects.
	Group   = "kube-bind.io"
	Version = "v1alpha2"
	// GroupVersion is the apiVersion of every object but the BindingProvider.
	GroupVersion = Group + "/" + Version

	KindBindingProvider              = "BindingProvider"
	KindBindingResponse              = "BindingResponse"
	KindAPIServiceExportRequest      = "APIServiceExportRequest"
	KindAPIServiceExport             = "APIServiceExport"
	KindBoundSchema                  = "BoundSchema"
	KindAPIServiceExportTemplate     = "APIServiceExportTemplate"
	KindAPIServiceExportTemplateList = "APIServiceExportTemplateList"
	KindCollection                   = "Collection"
	KindCollectionList               = "CollectionList"
	KindError                        = "Error"

	MethodOAuth2CodeGrant     = v1alpha1.MethodOAuth2CodeGrant
	MethodOAuth2CodeGrantPoll = v1alpha1.MethodOAuth2CodeGrantPoll

	// OwnerLabel marks a claimed object the konnector syncs.
	OwnerLabel = "kube-bind.io/owner"
)

// The discovery document has the same shape in both generations; only
// its apiVersion differs.
type (
	BindingProvider      = v1alpha1.BindingProvider
	AuthenticationMethod = v1alpha1.AuthenticationMethod
	OAuth2CodeGrant      = v1alpha1.OAuth2CodeGrant
	OAuth2CodeGrantPoll  = v1alpha1.OAuth2CodeGrantPoll
	// BindingAuthentication says how the consumer was authenticated.
	BindingAuthentication   = v1alpha1.BindingAuthentication
	CodeGrantAuthentication = v1alpha1.CodeGrantAuthentication
	// NameMeta is the part of ObjectMeta a request in a response carries.
	NameMeta = v1alpha1.NameMeta
)

// BindingResponse is what a consumer receives at the end of a bind.
type BindingResponse struct {
	APIVersion     string                `json:"apiVersion"`
	Kind           string                `json:"kind"`
	Authentication BindingAuthentication `json:"authentication"`
	// Kubeconfig is the kubeconfig YAML; JSON carries it as base64.
	Kubeconfig []byte `json:"kubeconfig"`
	// Requests are APIServiceExportRequestResponse objects, kept raw so
	// that a client passes them on unchanged.
	Requests          []json.RawMessage `json:"requests"`
	ProviderNamespace string            `json:"providerNamespace,omitempty"`
	BindingName       string            `json:"bindingName,omitempty"`
}

// APIServiceExportRequestResponse is one entry of BindingResponse.Requests.
type APIServiceExportRequestResponse struct {
	APIVersion string                      `json:"apiVersion"`
	Kind       string                      `json:"kind"`
	Metadata   NameMeta                    `json:"metadata"`
	Spec       APIServiceExportRequestSpec `json:"spec"`
}

// BindableResourcesRequest is the body of POST /api/bind.
type BindableResourcesRequest struct {
	APIVersion string                       `json:"apiVersion,omitempty"`
	Kind       string                       `json:"kind,omitempty"`
	Metadata   NameMeta                     `json:"metadata"`
	Spec       BindableResourcesRequestSpec `json:"spec"`
}

// BindableResourcesRequestSpec names the template and the consumer cluster.
type BindableResourcesRequestSpec struct {
	TemplateRef     NameRef         `json:"templateRef"`
	ClusterIdentity ClusterIdentity `json:"clusterIdentity"`
}

// NameRef refers to an object by name.
type NameRef struct {
	Name string `json:"name"`
}

// ClusterIdentity is what the CLI says identifies the consumer cluster
// (the UID of its kube-system namespace). It is not proven.
type ClusterIdentity struct {
	Identity string `json:"identity"`
}

// Error is the body of every error answer on /api/*.
type Error struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Message    string `json:"message"`
	Code       string `json:"code"`
	Details    string `json:"details,omitempty"`
}

// Error codes.
const (
	ErrorAuthenticationFailed = "AUTHENTICATION_FAILED"
	ErrorAuthorizationFailed  = "AUTHORIZATION_FAILED"
	ErrorResourceNotFound     = "RESOURCE_NOT_FOUND"
	ErrorInternal             = "INTERNAL_ERROR"
	ErrorBadRequest           = "BAD_REQUEST"
	ErrorUnavailable          = "CLUSTER_CONNECTION_FAILED"
)

// NewError returns an Error body.
func NewError(code, message string) Error {
	return Error{APIVersion: GroupVersion, Kind: KindError, Code: code, Message: message}
}

// APIServiceExportRequestSpec is what a consumer asks to bind.
type APIServiceExportRequestSpec struct {
	Parameters         json.RawMessage   `json:"parameters,omitempty"`
	Resources          []Resource        `json:"resources"`
	PermissionClaims   []PermissionClaim `json:"permissionClaims,omitempty"`
	Namespaces         []NameRef         `json:"namespaces,omitempty"`
	SchemaUpdatePolicy string            `json:"schemaUpdatePolicy,omitempty"`
}

// Schema update policies.
const (
	SchemaUpdateNever  = "Never"
	SchemaUpdateAlways = "Always"
)

// Resource is one group/resource of a request, template or export.
type Resource struct {
	Group    string   `json:"group,omitempty"`
	Resource string   `json:"resource"`
	Versions []string `json:"versions,omitempty"`
}

// Name is "<resource>.<group>", the name of its BoundSchema.
func (r Resource) Name() string { return r.Resource + "." + r.Group }

// PermissionClaim asks for objects of a resource the consumer does not
// bind (Secrets, ConfigMaps), selected by name or label.
type PermissionClaim struct {
	Group    string   `json:"group,omitempty"`
	Resource string   `json:"resource"`
	Selector Selector `json:"selector"`
}

// Selector picks the claimed objects.
type Selector struct {
	NamedResources []NamedResource       `json:"namedResources,omitempty"`
	LabelSelector  *metav1.LabelSelector `json:"labelSelector,omitempty"`
	References     []json.RawMessage     `json:"references,omitempty"`
}

// NamedResource is one claimed object by name.
type NamedResource struct {
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

// APIServiceExportSpec is the v1alpha2 part of an APIServiceExport.
type APIServiceExportSpec struct {
	Resources        []Resource        `json:"resources"`
	PermissionClaims []PermissionClaim `json:"permissionClaims,omitempty"`
	InformerScope    string            `json:"informerScope"`
	Isolation        string            `json:"isolation,omitempty"`
	// ClusterScopedIsolation is read by v1alpha1 konnectors.
	ClusterScopedIsolation string `json:"clusterScopedIsolation,omitempty"`
}

// Isolation of cluster-scoped objects on the provider.
const IsolationPrefixed = "Prefixed"

// BoundSchemaSpec is a CRD's spec as the konnector makes the consumer's
// CRD from it.
type BoundSchemaSpec struct {
	InformerScope string                                        `json:"informerScope"`
	Group         string                                        `json:"group"`
	Names         apiextensionsv1.CustomResourceDefinitionNames `json:"names"`
	Scope         apiextensionsv1.ResourceScope                 `json:"scope"`
	Versions      []BoundSchemaVersion                          `json:"versions"`
}

// BoundSchemaVersion is one version of a BoundSchema; Schema holds the
// CustomResourceValidation ({"openAPIV3Schema": …}).
type BoundSchemaVersion struct {
	Name                     string                                           `json:"name"`
	Served                   bool                                             `json:"served"`
	Storage                  bool                                             `json:"storage"`
	Deprecated               bool                                             `json:"deprecated,omitempty"`
	DeprecationWarning       *string                                          `json:"deprecationWarning,omitempty"`
	Schema                   json.RawMessage                                  `json:"schema"`
	Subresources             *apiextensionsv1.CustomResourceSubresources      `json:"subresources,omitempty"`
	AdditionalPrinterColumns []apiextensionsv1.CustomResourceColumnDefinition `json:"additionalPrinterColumns,omitempty"`
}

// APIServiceExportTemplate is a provider's offer: resources bound
// together, with claims and namespaces.
type APIServiceExportTemplate struct {
	APIVersion string                       `json:"apiVersion"`
	Kind       string                       `json:"kind"`
	Metadata   metav1.ObjectMeta            `json:"metadata"`
	Spec       APIServiceExportTemplateSpec `json:"spec"`
	Status     ConditionsStatus             `json:"status,omitempty"`
}

// APIServiceExportTemplateSpec says what a template offers.
type APIServiceExportTemplateSpec struct {
	Description        string            `json:"description,omitempty"`
	Scope              string            `json:"scope,omitempty"`
	Resources          []Resource        `json:"resources"`
	PermissionClaims   []PermissionClaim `json:"permissionClaims,omitempty"`
	Namespaces         []NameRef         `json:"namespaces,omitempty"`
	SchemaUpdatePolicy string            `json:"schemaUpdatePolicy,omitempty"`
}

// APIServiceExportTemplateList is the answer of GET /api/templates.
type APIServiceExportTemplateList struct {
	APIVersion string                     `json:"apiVersion"`
	Kind       string                     `json:"kind"`
	Metadata   metav1.ListMeta            `json:"metadata"`
	Items      []APIServiceExportTemplate `json:"items"`
}

// Collection groups templates for the consumer to pick from.
type Collection struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       CollectionSpec    `json:"spec"`
	Status     ConditionsStatus  `json:"status,omitempty"`
}

// CollectionSpec lists a collection's templates by name.
type CollectionSpec struct {
	Description string    `json:"description,omitempty"`
	Templates   []NameRef `json:"templates"`
}

// CollectionList is the answer of GET /api/collections.
type CollectionList struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   metav1.ListMeta `json:"metadata"`
	Items      []Collection    `json:"items"`
}

// ConditionsStatus is a status of conditions only.
type ConditionsStatus struct {
	Conditions []Condition `json:"conditions,omitempty"`
}

// Condition is a kube-bind condition (a metav1.Condition with an optional
// severity and no observedGeneration).
type Condition struct {
	Type               string      `json:"type"`
	Status             string      `json:"status"`
	Severity           string      `json:"severity,omitempty"`
	LastTransitionTime metav1.Time `json:"lastTransitionTime"`
	Reason             string      `json:"reason,omitempty"`
	Message            string      `json:"message,omitempty"`
}
