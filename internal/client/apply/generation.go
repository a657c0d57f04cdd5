package apply

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"

	"github.com/kbprovider/backend/pkg/apis/kbresources"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// Protocol generations a Binding comes in (the bare apiVersion of the
// provider's discovery document).
const (
	ProtocolV1alpha1 = v1alpha1.ProviderAPIVersion
	ProtocolV1alpha2 = v1alpha2.ProviderAPIVersion
)

// The konnector releases each generation deploys. v0.8.2's image must be
// named exactly so: the released kubectl-bind reads the version of
// Deployment kube-bind/konnector from the tag of an image of this
// repository, and leaves one of its own version or newer alone.
const (
	DefaultKonnectorV1alpha2 = "ghcr.io/kbind-dev/konnector:v0.8.2"
	// BundleCRDName is the second CRD konnector v0.8 installs itself.
	BundleCRDName = "apiservicebindingbundles.kube-bind.io"
	// LabelProviderKubeconfig marks the kubeconfig Secret as the released
	// v0.8 CLI does.
	LabelProviderKubeconfig = "kube-bind.io/provider-kubeconfig"
)

// Kube-bind resources of v1alpha2: the bindings in the consumer cluster
// (kbresources has the provider side only) and the requests on the
// provider.
var (
	BindingV1alpha2GVR       = schema.GroupVersionResource{Group: kbresources.Group, Version: kbresources.Version2, Resource: "apiservicebindings"}
	BindingBundleV1alpha2GVR = schema.GroupVersionResource{Group: kbresources.Group, Version: kbresources.Version2, Resource: "apiservicebindingbundles"}
	RequestV1alpha2GVR       = kbresources.APIServiceExportRequestsV1alpha2
)

// generation is what differs between the two protocol generations in the
// consumer cluster.
type generation struct {
	protocol     string
	groupVersion string
	bindingGVR   schema.GroupVersionResource
	requestGVR   schema.GroupVersionResource
	konnector    string // default image
}

var (
	genV1alpha1 = generation{ProtocolV1alpha1, v1alpha1.GroupVersion, BindingGVR, RequestGVR, DefaultKonnector}
	genV1alpha2 = generation{ProtocolV1alpha2, v1alpha2.GroupVersion, BindingV1alpha2GVR, RequestV1alpha2GVR, DefaultKonnectorV1alpha2}
)

func generationOf(protocol string) (generation, error) {
	switch protocol {
	case "", ProtocolV1alpha1:
		return genV1alpha1, nil
	case ProtocolV1alpha2:
		return genV1alpha2, nil
	}
	return generation{}, fmt.Errorf("consumer: unknown protocol generation %q", protocol)
}

// firstV1alpha2Konnector is the first konnector release that speaks
// v1alpha2 (and only it).
var firstV1alpha2Konnector = version.MustParseSemantic("v0.5.0")

// konnectorGeneration is the generation the konnector image speaks, by its
// tag; fallback for a tag that is no version (a custom build).
func konnectorGeneration(image string, fallback generation) generation {
	v, err := version.ParseSemantic(tag(image))
	if err != nil {
		return fallback
	}
	if v.LessThan(firstV1alpha2Konnector) {
		return genV1alpha1
	}
	return genV1alpha2
}

// groupResourceOfName splits a v1alpha1-style binding name
// <resource>.<group>; ok is false for names without a dot.
func groupResourceOfName(name string) (GroupResource, bool) {
	resource, group, ok := strings.Cut(name, ".")
	if !ok || resource == "" || group == "" {
		return GroupResource{}, false
	}
	return GroupResource{Group: group, Resource: resource}, true
}
