package exportrequests

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// A namespace made for an APIServiceNamespace that this controller's
// cache has not seen yet (another controller made it during a leader
// handover, or the two watches lag one another) is kept; it goes once the
// APIServiceNamespace is really gone.
func TestLaggingCacheKeepsNamespaceOfLiveAPIServiceNamespace(t *testing.T) {
	cp := controlplane.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := exampleapis.Prepare(ctx, cp); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(cp.AdminConfig())
	dyn := dynamic.NewForConfigOrDie(cp.AdminConfig())
	const consumerNS, name = "kbx-lagging", "default"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:        consumerNS,
		Labels:      map[string]string{binding.LabelManagedBy: binding.ManagedByValue},
		Annotations: map[string]string{binding.AnnotationIssuer: "https://idp.example.com", binding.AnnotationSubject: "alice", binding.AnnotationCluster: "c1"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	apiNS := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kbresources.APIServiceNamespacesV1alpha2.GroupVersion().String(), "kind": "APIServiceNamespace",
		"metadata": map[string]any{"name": name}, "spec": map[string]any{},
	}}
	if _, err := dyn.Resource(kbresources.APIServiceNamespacesV1alpha2).Namespace(consumerNS).Create(ctx, apiNS, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	child, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ChildNamespaceName("kbx-", consumerNS, name),
		Labels: map[string]string{binding.LabelManagedBy: binding.ManagedByValue, binding.LabelConsumerNamespace: consumerNS,
			LabelAPIServiceNamespace: name},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// The run's cache holds the child namespace but no APIServiceNamespace.
	cached := fake.NewClientBuilder().WithObjects(child).
		WithIndex(&corev1.Namespace{}, kbmanager.IndexConsumerNamespace, kbmanager.ConsumerNamespaceOf).Build()
	r := &run{Controller: &Controller{log: slog.New(slog.DiscardHandler)}, cache: cached, kube: kube, dynamic: dyn}
	for _, keep := range []map[string]bool{{}, nil} {
		if err := r.removeChildren(ctx, consumerNS, keep); err != nil {
			t.Fatal(err)
		}
		got, err := kube.CoreV1().Namespaces().Get(ctx, child.Name, metav1.GetOptions{})
		if err != nil || got.DeletionTimestamp != nil {
			t.Fatalf("keep %v: the namespace of a live APIServiceNamespace was deleted (%v)", keep, err)
		}
	}

	// Gone for real: the namespace goes.
	if err := dyn.Resource(kbresources.APIServiceNamespacesV1alpha2).Namespace(consumerNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r.removeChildren(ctx, consumerNS, map[string]bool{}); err != nil {
		t.Fatal(err)
	}
	got, err := kube.CoreV1().Namespaces().Get(ctx, child.Name, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) && (err != nil || got.DeletionTimestamp == nil) {
		t.Fatalf("the namespace of a deleted APIServiceNamespace was kept: %v", err)
	}
}

// An export whose CRD the catalog's cache does not show exported yet (a
// CRD labelled just now, exported by another controller) is kept; it goes
// once the CRD is really not exported.
func TestLaggingCatalogKeepsExport(t *testing.T) {
	cp := controlplane.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api := exampleapis.API{Group: "lagging.example.com", Plural: "lags", Kind: "Lag", Exported: true}
	if err := exampleapis.Prepare(ctx, cp, api); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(cp.AdminConfig())
	dyn := dynamic.NewForConfigOrDie(cp.AdminConfig())
	const ns = "kbx-lagging-catalog"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	export, err := dyn.Resource(kbresources.APIServiceExportsV1alpha2).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kbresources.APIServiceExportsV1alpha2.GroupVersion().String(), "kind": "APIServiceExport",
		"metadata": map[string]any{"name": api.Name()},
		"spec": map[string]any{"informerScope": "Namespaced", "isolation": "Prefixed",
			"resources": []any{map[string]any{"group": api.Group, "resource": api.Plural}}},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A catalog never started: its cache shows nothing exported.
	catalog, err := binding.NewCatalog(cp.AdminConfig(), binding.ScopeNamespaced)
	if err != nil {
		t.Fatal(err)
	}
	r := &run{Controller: &Controller{cfg: Config{Catalog: catalog}, log: slog.New(slog.DiscardHandler)}, kube: kube, dynamic: dyn}
	var again *requeueAfter
	if err := r.deleteExport(ctx, ns, export, api.Name()); !errors.As(err, &again) {
		t.Fatalf("deleteExport of an export whose CRD is exported: %v, want a look again later", err)
	}
	if _, err := dyn.Resource(kbresources.APIServiceExportsV1alpha2).Namespace(ns).Get(ctx, api.Name(), metav1.GetOptions{}); err != nil {
		t.Fatalf("the export of an exported CRD was deleted: %v", err)
	}

	patch := []byte(`{"metadata":{"labels":{"` + binding.ExportedLabel + `":null}}}`)
	crds := apiextensionsclient.NewForConfigOrDie(cp.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()
	if _, err := crds.Patch(ctx, api.Name(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r.deleteExport(ctx, ns, export, api.Name()); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(kbresources.APIServiceExportsV1alpha2).Namespace(ns).Get(ctx, api.Name(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the export of a CRD no longer exported was kept: %v", err)
	}
}
