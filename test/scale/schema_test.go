package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
)

// schemaKiBEnv sets the size of the bound CRD's schema. A provider's CRDs
// carry schemas of tens to hundreds of KiB (an operator's with every
// field described), and every consumer's namespace holds a copy of each
// CRD it bound (its BoundSchema, and for v1alpha1 konnectors its
// APIServiceExport): a cache that kept the copies whole would grow with
// schema size times consumers, which a toy schema never shows.
const schemaKiBEnv = "KUBE_BIND_SCALE_SCHEMA_KIB"

// createSchemaCRD creates mango's CRD with a schema of about kib KiB of
// JSON: described string fields under spec, unknown fields preserved.
// exampleapis.Prepare keeps a CRD that exists.
func createSchemaCRD(t *testing.T, cp *controlplane.ControlPlane, kib int) {
	t.Helper()
	crd := exampleapis.CRD(mango)
	props := map[string]apiextensionsv1.JSONSchemaProps{}
	description := strings.Repeat("What this field sets, its default and when it takes effect. ", 4)
	size := 0
	for i := 0; size < kib<<10; i++ {
		p := apiextensionsv1.JSONSchemaProps{Type: "string", Description: description, MaxLength: ptr(int64(253))}
		props[fmt.Sprintf("field%04d", i)] = p
		b, _ := json.Marshal(p)
		size += len(b) + 14
	}
	preserve := true
	crd.Spec.Versions[0].Schema.OpenAPIV3Schema = &apiextensionsv1.JSONSchemaProps{
		Type: "object", XPreserveUnknownFields: &preserve,
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"spec": {Type: "object", Properties: props, XPreserveUnknownFields: &preserve},
		},
	}
	client, err := apiextensionsclient.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.ApiextensionsV1().CustomResourceDefinitions().Create(context.Background(), crd, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating %s with a %d KiB schema: %v", crd.Name, kib, err)
	}
	b, _ := json.Marshal(crd.Spec.Versions[0].Schema)
	figure(t, "the bound CRD's schema: %d KiB of JSON", len(b)>>10)
}

func ptr[T any](v T) *T { return &v }
