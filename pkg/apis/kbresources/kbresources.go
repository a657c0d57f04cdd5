// Package kbresources names the kube-bind.io resources that the backend,
// its controllers and the consumer client read and write through dynamic
// clients: one place instead of a copy in each package.
//
// The four kinds both protocol generations share are served as v1alpha1
// and v1alpha2 with one schema (deploy/crds), so either version reads and
// writes every field. The provider-side controllers that know v1alpha2 use
// the *V1alpha2 names; the rest, and the consumer side, stay on v1alpha1.
package kbresources

import "k8s.io/apimachinery/pkg/runtime/schema"

// Group and versions of every kube-bind.io resource here.
const (
	Group    = "kube-bind.io"
	Version  = "v1alpha1"
	Version2 = "v1alpha2"
)

var (
	// Provider side, in consumer namespaces.
	ClusterBindings          = gvr(Version, "clusterbindings")
	APIServiceExportRequests = gvr(Version, "apiserviceexportrequests")
	APIServiceExports        = gvr(Version, "apiserviceexports")
	APIServiceNamespaces     = gvr(Version, "apiservicenamespaces")
	// Consumer side, cluster-scoped.
	APIServiceBindings = gvr(Version, "apiservicebindings")
)

var (
	// The shared provider-side kinds, through v1alpha2.
	ClusterBindingsV1alpha2          = gvr(Version2, "clusterbindings")
	APIServiceExportRequestsV1alpha2 = gvr(Version2, "apiserviceexportrequests")
	APIServiceExportsV1alpha2        = gvr(Version2, "apiserviceexports")
	APIServiceNamespacesV1alpha2     = gvr(Version2, "apiservicenamespaces")
	// BoundSchemas live in consumer namespaces, one per bound resource.
	BoundSchemas = gvr(Version2, "boundschemas")
	// The provider's offers, cluster-scoped.
	APIServiceExportTemplates = gvr(Version2, "apiserviceexporttemplates")
	Collections               = gvr(Version2, "collections")
)

func gvr(version, resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: Group, Version: version, Resource: resource}
}
