package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/deploy/crds"
	"github.com/kbprovider/backend/internal/binding"
)

// exampleAPIs are the provider's APIs that consumers can bind in the demo.
var exampleAPIs = []struct {
	group, plural, kind string
	spec                map[string]apiextensionsv1.JSONSchemaProps
}{
	{"mangodb.com", "mangodbs", "MangoDB", map[string]apiextensionsv1.JSONSchemaProps{
		"tier":   {Type: "string", Enum: []apiextensionsv1.JSON{{Raw: []byte(`"Dedicated"`)}, {Raw: []byte(`"Shared"`)}}, Description: "Dedicated or Shared"},
		"backup": {Type: "boolean", Description: "whether the database is backed up daily"},
	}},
	{"cache.example.com", "redises", "Redis", map[string]apiextensionsv1.JSONSchemaProps{
		"memory": {Type: "string", Description: "memory limit, such as 256Mi"},
	}},
}

func exampleNames() []string {
	var names []string
	for _, a := range exampleAPIs {
		names = append(names, a.plural+"."+a.group)
	}
	return names
}

// installAPIs installs what the backend needs on the provider cluster (the
// kube-bind.io CRDs and the ClusterRoles its consumers get) and the example
// APIs, labelled as exported, and waits until they are served.
func installAPIs(ctx context.Context, admin *rest.Config) error {
	if err := crds.Install(ctx, admin); err != nil {
		return err
	}
	if err := binding.InstallClusterRoles(ctx, admin); err != nil {
		return err
	}
	ext, err := apiextensionsclient.NewForConfig(admin)
	if err != nil {
		return err
	}
	crdClient := ext.ApiextensionsV1().CustomResourceDefinitions()
	for _, a := range exampleAPIs {
		crd := &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: a.plural + "." + a.group, Labels: map[string]string{binding.ExportedLabel: "true"}},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: a.group,
				Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: a.plural, Kind: a.kind, ListKind: a.kind + "List", Singular: strings.ToLower(a.kind)},
				Scope: apiextensionsv1.NamespaceScoped,
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
					Name: "v1alpha1", Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object",
						Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"spec": {Type: "object", Properties: a.spec},
						},
					}},
				}},
			},
		}
		if _, err := crdClient.Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("CRD %s: %w", crd.Name, err)
		}
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := crdClient.Get(ctx, crd.Name, metav1.GetOptions{})
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
			return fmt.Errorf("CRD %s not established: %w", crd.Name, err)
		}
	}
	return nil
}
