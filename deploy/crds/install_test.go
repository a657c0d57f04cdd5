package crds

import (
	"context"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kbprovider/backend/internal/testutil/controlplane"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

func gvr(resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: Group, Version: "v1alpha1", Resource: resource}
}

func obj(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(y), &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}

// The real API server accepts the CRDs (structural schemas, valid CEL),
// Install is idempotent, and the schemas enforce what the facts say.
func TestInstallAndValidation(t *testing.T) {
	cp := controlplane.Get(t)
	ctx := context.Background()
	cfg := cp.AdminConfig()
	if err := Install(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, cfg); err != nil {
		t.Fatalf("second install: %v", err)
	}
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	ns := "crd-test"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	create := func(resource, y string) (*unstructured.Unstructured, error) {
		return dyn.Resource(gvr(resource)).Namespace(ns).Create(ctx, obj(t, y), metav1.CreateOptions{})
	}
	mustCreate := func(resource, y string) *unstructured.Unstructured {
		t.Helper()
		u, err := create(resource, y)
		if err != nil {
			t.Fatalf("valid %s refused: %v", resource, err)
		}
		return u
	}
	mustRefuse := func(what string, err error, msg string) {
		t.Helper()
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: want Invalid mentioning %q, got %v", what, msg, err)
		}
	}

	// ClusterBinding.
	mustCreate("clusterbindings", `
apiVersion: kube-bind.io/v1alpha1
kind: ClusterBinding
metadata: {name: cluster}
spec: {kubeconfigSecretRef: {name: kubeconfig, key: kubeconfig}, providerPrettyName: Acme, serviceProviderSpec: {any: [thing]}}`)
	_, err := create("clusterbindings", `
apiVersion: kube-bind.io/v1alpha1
kind: ClusterBinding
metadata: {name: other}
spec: {kubeconfigSecretRef: {name: kubeconfig, key: kubeconfig}, providerPrettyName: Acme}`)
	mustRefuse("ClusterBinding not named cluster", err, `must be named "cluster"`)
	_, err = create("clusterbindings", `
apiVersion: kube-bind.io/v1alpha1
kind: ClusterBinding
metadata: {name: cluster}
spec: {kubeconfigSecretRef: {name: kubeconfig, key: other}, providerPrettyName: ""}`)
	mustRefuse("ClusterBinding with bad key", err, "spec.kubeconfigSecretRef.key")
	mustRefuse("ClusterBinding with empty pretty name", err, "spec.providerPrettyName")

	// APIServiceExportRequest: phase defaults to Pending, resources and
	// parameters are immutable, at least one resource, phase enum.
	req := mustCreate("apiserviceexportrequests", `
apiVersion: kube-bind.io/v1alpha1
kind: APIServiceExportRequest
metadata: {name: widgets.example.com}
spec:
  resources: [{group: example.com, resource: widgets, versions: [v1]}]
  parameters: {size: 3}`)
	if phase, _, _ := unstructured.NestedString(req.Object, "status", "phase"); phase != "Pending" {
		t.Errorf("phase %q, want the default Pending", phase)
	}
	r := dyn.Resource(gvr("apiserviceexportrequests")).Namespace(ns)
	_, err = r.Patch(ctx, "widgets.example.com", types.MergePatchType,
		[]byte(`{"spec":{"resources":[{"group":"example.com","resource":"gadgets"}]}}`), metav1.PatchOptions{})
	mustRefuse("changing resources", err, "resources are immutable")
	_, err = r.Patch(ctx, "widgets.example.com", types.MergePatchType, []byte(`{"spec":{"parameters":null}}`), metav1.PatchOptions{})
	mustRefuse("removing parameters", err, "parameters are immutable")
	_, err = r.Patch(ctx, "widgets.example.com", types.MergePatchType, []byte(`{"spec":{"parameters":{"size":4}}}`), metav1.PatchOptions{})
	mustRefuse("changing parameters", err, "parameters are immutable")
	_, err = r.Patch(ctx, "widgets.example.com", types.MergePatchType, []byte(`{"status":{"phase":"Done"}}`), metav1.PatchOptions{}, "status")
	mustRefuse("unknown phase", err, "status.phase")
	if _, err := r.Patch(ctx, "widgets.example.com", types.MergePatchType, []byte(`{"status":{"phase":"Succeeded"}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("setting phase Succeeded: %v", err)
	}
	_, err = create("apiserviceexportrequests", `
apiVersion: kube-bind.io/v1alpha1
kind: APIServiceExportRequest
metadata: {name: empty}
spec: {resources: []}`)
	mustRefuse("no resources", err, "spec.resources")

	// APIServiceExport: name <plural>.<group>, enums, isolation only for
	// cluster-scoped resources.
	mustCreate("apiserviceexports", `
apiVersion: kube-bind.io/v1alpha1
kind: APIServiceExport
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {plural: widgets, kind: Widget}
  scope: Namespaced
  informerScope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, properties: {spec: {type: object}}}}
    subresources: {status: {}}`)
	_, err = create("apiserviceexports", `
apiVersion: kube-bind.io/v1alpha1
kind: APIServiceExport
metadata: {name: wrong.example.com}
spec: {group: example.com, names: {plural: widgets, kind: Widget}, scope: Namespaced, informerScope: Namespaced, versions: [{name: v1, served: true, storage: true}]}`)
	mustRefuse("export with the wrong name", err, "<spec.names.plural>.<spec.group>")
	_, err = create("apiserviceexports", `
apiVersion: kube-bind.io/v1alpha1
kind: APIServiceExport
metadata: {name: gadgets.example.com}
spec: {group: example.com, names: {plural: gadgets, kind: Gadget}, scope: Namespaced, informerScope: Somewhere, versions: [{name: v1, served: true, storage: true}]}`)
	mustRefuse("bad informerScope", err, "spec.informerScope")
	_, err = create("apiserviceexports", `
apiVersion: kube-bind.io/v1alpha1
kind: APIServiceExport
metadata: {name: gadgets.example.com}
spec: {group: example.com, names: {plural: gadgets, kind: Gadget}, scope: Namespaced, informerScope: Cluster, clusterScopedIsolation: Prefixed, versions: [{name: v1, served: true, storage: true}]}`)
	mustRefuse("isolation on a namespaced resource", err, "clusterScopedIsolation applies only")
	mustCreate("apiserviceexports", `
apiVersion: kube-bind.io/v1alpha1
kind: APIServiceExport
metadata: {name: gadgets.example.com}
spec: {group: example.com, names: {plural: gadgets, kind: Gadget}, scope: Cluster, informerScope: Cluster, clusterScopedIsolation: Prefixed, versions: [{name: v1, served: true, storage: true}]}`)

	// APIServiceNamespace: the name is a consumer namespace name.
	mustCreate("apiservicenamespaces", `
apiVersion: kube-bind.io/v1alpha1
kind: APIServiceNamespace
metadata: {name: default}
spec: {}`)
	_, err = create("apiservicenamespaces", `
apiVersion: kube-bind.io/v1alpha1
kind: APIServiceNamespace
metadata: {name: not.a.label}
spec: {}`)
	mustRefuse("APIServiceNamespace with a dotted name", err, "DNS-1123 label")

	// kubectl get kube-bindings lists all four kinds.
	_, res, err := kube.Discovery().ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}
	inCategory := 0
	for _, l := range res {
		for _, r := range l.APIResources {
			for _, c := range r.Categories {
				if c == "kube-bindings" {
					inCategory++
				}
			}
		}
	}
	if inCategory != 4 {
		t.Errorf("%d resources in category kube-bindings, want 4", inCategory)
	}
}
