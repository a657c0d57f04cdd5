// Package kbresources names the kube-bind.io v1alpha1 resources that the
// backend, its controllers and the consumer client read and write through
// dynamic clients: one place instead of a copy in each package.
package kbresources

import "k8s.io/apimachinery/pkg/runtime/schema"

// Group and Version of every kube-bind.io resource here.
const (
	Group   = "kube-bind.io"
	Version = "v1alpha1"
)

var (
	// Provider side, in consumer namespaces.
	ClusterBindings          = gvr("clusterbindings")
	APIServiceExportRequests = gvr("apiserviceexportrequests")
	APIServiceExports        = gvr("apiserviceexports")
	APIServiceNamespaces     = gvr("apiservicenamespaces")
	// Consumer side, cluster-scoped.
	APIServiceBindings = gvr("apiservicebindings")
)

func gvr(resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: Group, Version: Version, Resource: resource}
}
