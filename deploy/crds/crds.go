// Package crds ships the CustomResourceDefinitions of group kube-bind.io
// that the provider side uses, as the YAML files next to this file (the Helm
// chart copies the same files), and installs them for tests, the local demo
// and the backend. The four kinds both generations share serve v1alpha1 and
// v1alpha2 with one schema (the union of their fields) and store v1alpha2;
// the kinds only v1alpha2 has serve v1alpha2 alone.
package crds

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"
)

//go:embed *.yaml
var files embed.FS

// Group is the API group of every CRD in this package.
const Group = "kube-bind.io"

// Names of the CRDs in this package.
const (
	ClusterBindings          = "clusterbindings." + Group
	APIServiceExports        = "apiserviceexports." + Group
	APIServiceExportRequests = "apiserviceexportrequests." + Group
	APIServiceNamespaces     = "apiservicenamespaces." + Group
	// v1alpha2 only.
	BoundSchemas              = "boundschemas." + Group
	APIServiceExportTemplates = "apiserviceexporttemplates." + Group
	Collections               = "collections." + Group
)

// Files returns the embedded YAML files by file name.
func Files() map[string][]byte {
	out := map[string][]byte{}
	entries, _ := fs.ReadDir(files, ".")
	for _, e := range entries {
		b, err := files.ReadFile(e.Name())
		if err == nil {
			out[e.Name()] = b
		}
	}
	return out
}

// CRDs decodes the embedded YAML files, sorted by CRD name.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	for name, b := range Files() {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(b, crd); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", name, err)
		}
		out = append(out, crd)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// establishTimeout bounds how long Install waits for the API server to
// serve a CRD it accepted.
const establishTimeout = 30 * time.Second

// Install creates the CRDs, or updates their spec when they exist, then
// waits until every one is Established (served by the API server).
func Install(ctx context.Context, cfg *rest.Config) error {
	crds, err := CRDs()
	if err != nil {
		return err
	}
	client, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating apiextensions client: %w", err)
	}
	api := client.ApiextensionsV1().CustomResourceDefinitions()
	for _, want := range crds {
		_, err := api.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				have, err := api.Get(ctx, want.Name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				have.Spec = want.Spec
				if have.Labels == nil {
					have.Labels = map[string]string{}
				}
				for k, v := range want.Labels {
					have.Labels[k] = v
				}
				_, err = api.Update(ctx, have, metav1.UpdateOptions{})
				return err
			})
		}
		if err != nil {
			return fmt.Errorf("installing CRD %s: %w", want.Name, err)
		}
	}
	for _, want := range crds {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, establishTimeout, true, func(ctx context.Context) (bool, error) {
			have, err := api.Get(ctx, want.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range have.Status.Conditions {
				if c.Type == apiextensionsv1.NamesAccepted && c.Status == apiextensionsv1.ConditionFalse {
					return false, fmt.Errorf("names not accepted: %s", c.Message)
				}
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("waiting for CRD %s to be established: %w", want.Name, err)
		}
	}
	return nil
}
