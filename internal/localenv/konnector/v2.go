package konnector

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/kbprovider/backend/internal/localenv/exampleapis"
)

// InstallV2CRDs creates the released kbind v2 CRDs (Connection,
// ClusterBinding, Binding) in the cluster of cfg, as upstream's chart
// does for a consumer cluster (the konnector installs none), and waits
// until they are served.
func InstallV2CRDs(ctx context.Context, cfg *rest.Config) error {
	dir, err := V2Dir()
	if err != nil {
		return err
	}
	files, err := filepath.Glob(filepath.Join(dir, "crds", "*.yaml"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no CRDs in %s/crds", dir)
	}
	client, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	crds := client.ApiextensionsV1().CustomResourceDefinitions()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(b, &crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if _, err := crds.Create(ctx, &crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
		}
		if err := exampleapis.WaitEstablished(ctx, crds, crd.Name); err != nil {
			return err
		}
	}
	return nil
}
