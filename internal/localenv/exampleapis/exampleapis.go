// Package exampleapis prepares a provider cluster for bindings in the local
// demo and the tests: the kube-bind.io CRDs, the consumer ClusterRoles, and
// example CRDs that are (or are not) exported.
package exampleapis

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apiextensionsv1client "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/typed/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kbprovider/backend/deploy/crds"
	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
)

// API is an example namespaced API served as a CRD.
type API struct {
	Group, Plural, Kind string
	// Exported labels the CRD kube-bind.io/exported=true.
	Exported bool
}

// Version is the one version every example API serves.
const Version = "v1alpha1"

// Name is the CRD's name, <plural>.<group>.
func (a API) Name() string { return a.Plural + "." + a.Group }

// GVR is the resource of a, for dynamic clients.
func (a API) GVR() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: a.Group, Version: Version, Resource: a.Plural}
}

// Resource is a as the catalog and the provisioner name it.
func (a API) Resource() binding.Resource { return binding.Resource{Group: a.Group, Resource: a.Plural} }

// Examples used across tests and the demo.
var (
	MangoDB     = API{Group: "mangodb.com", Plural: "mangodbs", Kind: "MangoDB", Exported: true}
	Redis       = API{Group: "cache.example.com", Plural: "redises", Kind: "Redis", Exported: true}
	SecretThing = API{Group: "internal.example.com", Plural: "secretthings", Kind: "SecretThing"}
)

// CRD returns the CRD of a: one served version v1alpha1 that keeps any
// fields, with a status subresource (the released konnector syncs status
// back to the consumer only through it).
func CRD(a API) *apiextensionsv1.CustomResourceDefinition {
	labels := map[string]string{}
	if a.Exported {
		labels[binding.ExportedLabel] = "true"
	}
	preserve := true
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: a.Name(), Labels: labels},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: a.Group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: a.Plural, Kind: a.Kind, ListKind: a.Kind + "List", Singular: strings.ToLower(a.Kind),
			},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: Version, Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{
					Status: &apiextensionsv1.CustomResourceSubresourceStatus{},
				},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: &preserve,
				}},
			}},
		},
	}
}

// Prepare installs the kube-bind.io CRDs and the consumer ClusterRoles,
// waits until resource quotas count kube-bind objects (the backend's
// per-consumer quota), and creates the CRDs of apis (an existing one is kept), waiting until every
// CRD is established.
func Prepare(ctx context.Context, cp *controlplane.ControlPlane, apis ...API) error {
	admin := cp.AdminConfig()
	if err := crds.Install(ctx, admin); err != nil {
		return err
	}
	if err := binding.InstallClusterRoles(ctx, admin); err != nil {
		return err
	}
	if err := AwaitQuotaCounting(ctx, cp); err != nil {
		return err
	}
	client, err := apiextensionsclient.NewForConfig(admin)
	if err != nil {
		return err
	}
	crdClient := client.ApiextensionsV1().CustomResourceDefinitions()
	for _, a := range apis {
		if _, err := crdClient.Create(ctx, CRD(a), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating CRD %s: %w", a.Name(), err)
		}
		if err := WaitEstablished(ctx, crdClient, a.Name()); err != nil {
			return err
		}
	}
	return nil
}

// WaitEstablished waits (at most 30 s) until the CRD name is established,
// that is served.
func WaitEstablished(ctx context.Context, crds apiextensionsv1client.CustomResourceDefinitionInterface, name string) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s not established: %w", name, err)
	}
	return nil
}

// AwaitQuotaCounting returns once resource quotas on cp count the
// kube-bind objects the quota the backend gives each consumer limits
// (APIServiceExportRequests and APIServiceNamespaces): tests and the demo
// bind right after installing the CRDs.
func AwaitQuotaCounting(ctx context.Context, cp *controlplane.ControlPlane) error {
	return cp.AwaitQuotaCounting(ctx, QuotaCounted...)
}

// QuotaCounted are the quota resource names of the kube-bind objects the
// backend's per-consumer quota counts.
var QuotaCounted = []corev1.ResourceName{"count/" + crds.APIServiceExportRequests, "count/" + crds.APIServiceNamespaces}
