package crds

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

func gvr(resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: Group, Version: "v1alpha1", Resource: resource}
}

func gvr2(resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: Group, Version: "v1alpha2", Resource: resource}
}

// previousRelease turns the shared CRDs back into what the previous
// release installed: v1alpha1 only, stored as v1alpha1.
func previousRelease(t *testing.T) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	all, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, crd := range all {
		for _, v := range crd.Spec.Versions {
			if v.Name == "v1alpha1" {
				v.Storage = true
				crd.Spec.Versions = []apiextensionsv1.CustomResourceDefinitionVersion{v}
				crd.Spec.Conversion = nil
				out = append(out, crd)
				break
			}
		}
	}
	return out
}

// installPrevious creates the previous release's CRDs and an export
// through them, as a provider has them before the upgrade.
func installPrevious(t *testing.T, ctx context.Context, cfg *rest.Config, ns string) {
	t.Helper()
	api := apiextensionsclient.NewForConfigOrDie(cfg).ApiextensionsV1().CustomResourceDefinitions()
	for _, crd := range previousRelease(t) {
		if _, err := api.Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			t.Fatalf("installing the previous release's %s: %v", crd.Name, err)
		}
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := dynamic.NewForConfigOrDie(cfg).Resource(gvr("apiserviceexports")).Namespace(ns).Create(ctx, obj(t, oldExport), metav1.CreateOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatal("creating an export through the previous release's CRD never worked")
	}
}

// oldExport is an export as the previous release wrote it.
const oldExport = `
apiVersion: kube-bind.io/v1alpha1
kind: APIServiceExport
metadata: {name: olds.example.com}
spec:
  group: example.com
  names: {plural: olds, kind: Old}
  scope: Namespaced
  informerScope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]`

// refusedExport is an APIServiceExport the schema refuses with an error
// mentioning want.
type refusedExport struct{ what, name, spec, want string }

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
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	ns := "crd-test"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The upgrade: the CRDs apply over the previous release's, and what
	// was stored as v1alpha1 reads the same through both versions.
	installPrevious(t, ctx, cfg, ns)
	if err := Install(ctx, cfg); err != nil {
		t.Fatalf("installing over the previous release's CRDs: %v", err)
	}
	if err := Install(ctx, cfg); err != nil {
		t.Fatalf("second install: %v", err)
	}
	for _, g := range []schema.GroupVersionResource{gvr("apiserviceexports"), gvr2("apiserviceexports")} {
		u, err := dyn.Resource(g).Namespace(ns).Get(ctx, "olds.example.com", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the export made before the upgrade, through %s: %v", g.Version, err)
		}
		if kind, _, _ := unstructured.NestedString(u.Object, "spec", "names", "kind"); kind != "Old" {
			t.Errorf("the export made before the upgrade, through %s, lost its names: %v", g.Version, u.Object["spec"])
		}
	}

	// create uses the version the object names.
	create := func(resource, y string) (*unstructured.Unstructured, error) {
		o := obj(t, y)
		g := gvr(resource)
		g.Version = o.GroupVersionKind().Version
		return dyn.Resource(g).Namespace(ns).Create(ctx, o, metav1.CreateOptions{})
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
	// refuseExports creates each export of version (v1alpha1, v1alpha2),
	// which the schema must refuse.
	refuseExports := func(version string, exports []refusedExport) {
		t.Helper()
		for _, e := range exports {
			_, err := create("apiserviceexports", fmt.Sprintf("apiVersion: kube-bind.io/%s\nkind: APIServiceExport\nmetadata: {name: %s}\nspec: %s",
				version, e.name, e.spec))
			mustRefuse(e.what, err, e.want)
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

	// APIServiceExportRequest: phase defaults to Pending, the whole spec is
	// immutable, at least one resource, phase enum.
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
	for _, version := range []string{"v1alpha1", "v1alpha2"} {
		r := dyn.Resource(schema.GroupVersionResource{Group: Group, Version: version, Resource: "apiserviceexportrequests"}).Namespace(ns)
		for what, patch := range map[string]string{
			"changing resources":           `{"spec":{"resources":[{"group":"example.com","resource":"gadgets"}]}}`,
			"removing parameters":          `{"spec":{"parameters":null}}`,
			"changing parameters":          `{"spec":{"parameters":{"size":4}}}`,
			"adding permission claims":     `{"spec":{"permissionClaims":[{"group":"*","resource":"*","selector":{}}]}}`,
			"adding namespaces":            `{"spec":{"namespaces":[{"name":"kube-system"}]}}`,
			"setting a schemaUpdatePolicy": `{"spec":{"schemaUpdatePolicy":"Never"}}`,
		} {
			_, err := r.Patch(ctx, "widgets.example.com", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			mustRefuse(what+" through "+version, err, "spec is immutable")
		}
	}
	r := dyn.Resource(gvr("apiserviceexportrequests")).Namespace(ns)
	// Metadata stays writable (the CLI and the konnector label requests).
	if _, err := r.Patch(ctx, "widgets.example.com", types.MergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("labelling a request: %v", err)
	}
	// Parameters are flat and bounded; a nested or long value is refused.
	for name, params := range map[string]string{
		"nested":   `{deep: {a: [1, 2]}}`,
		"long":     `{text: "` + strings.Repeat("x", 1025) + `"}`,
		"long key": `{` + strings.Repeat("k", 64) + `: 1}`,
		"too many": `{` + manyKeys(33) + `}`,
	} {
		_, err = create("apiserviceexportrequests", `
apiVersion: kube-bind.io/v1alpha2
kind: APIServiceExportRequest
metadata: {name: params.example.com}
spec:
  resources: [{group: example.com, resource: widgets}]
  parameters: `+params)
		mustRefuse("parameters "+name, err, "spec.parameters")
	}
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
	refuseExports("v1alpha1", []refusedExport{
		{"export with the wrong name", "wrong.example.com",
			"{group: example.com, names: {plural: widgets, kind: Widget}, scope: Namespaced, informerScope: Namespaced, versions: [{name: v1, served: true, storage: true}]}",
			"<spec.names.plural>.<spec.group>"},
		{"bad informerScope", "gadgets.example.com",
			"{group: example.com, names: {plural: gadgets, kind: Gadget}, scope: Namespaced, informerScope: Somewhere, versions: [{name: v1, served: true, storage: true}]}",
			"spec.informerScope"},
		{"isolation on a namespaced resource", "gadgets.example.com",
			"{group: example.com, names: {plural: gadgets, kind: Gadget}, scope: Namespaced, informerScope: Cluster, clusterScopedIsolation: Prefixed, versions: [{name: v1, served: true, storage: true}]}",
			"clusterScopedIsolation applies only"},
	})
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

	// A dual export (both generations' fields) applied through v1alpha2 and
	// status-updated through v1alpha1 (konnector v0.4.8) keeps every
	// field, read through either version; so does a v1alpha2 status write.
	exports2 := dyn.Resource(gvr2("apiserviceexports")).Namespace(ns)
	_, err = exports2.Apply(ctx, "duals.example.com", obj(t, `
apiVersion: kube-bind.io/v1alpha2
kind: APIServiceExport
metadata: {name: duals.example.com}
spec:
  resources: [{group: example.com, resource: duals, versions: [v1]}]
  permissionClaims: [{resource: secrets, selector: {labelSelector: {matchLabels: {app: x}}}}]
  informerScope: Namespaced
  isolation: Prefixed
  group: example.com
  names: {plural: duals, kind: Dual}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]`), metav1.ApplyOptions{FieldManager: "test"})
	if err != nil {
		t.Fatalf("applying a dual export: %v", err)
	}
	v1 := dyn.Resource(gvr("apiserviceexports")).Namespace(ns)
	u, err := v1.Get(ctx, "duals.example.com", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(u.Object, []any{"v1"}, "status", "storedVersions")
	_ = unstructured.SetNestedField(u.Object, "Dual", "status", "acceptedNames", "kind")
	_ = unstructured.SetNestedField(u.Object, "duals", "status", "acceptedNames", "plural")
	if _, err := v1.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("a v1alpha1 status update: %v", err)
	}
	_, err = exports2.Patch(ctx, "duals.example.com", types.MergePatchType, []byte(`{"status":{"conditions":[{"type":"Ready","status":"True","severity":"","lastTransitionTime":"2026-01-01T00:00:00Z","reason":"Synced","message":"ok"}]}}`), metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatalf("a v1alpha2 status write with upstream's condition shape: %v", err)
	}
	for _, r := range []interface {
		Get(context.Context, string, metav1.GetOptions, ...string) (*unstructured.Unstructured, error)
	}{v1, exports2} {
		u, err := r.Get(ctx, "duals.example.com", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range [][]string{
			{"spec", "resources"}, {"spec", "permissionClaims"}, {"spec", "isolation"}, {"spec", "group"}, {"spec", "names"},
			{"spec", "versions"}, {"status", "storedVersions"}, {"status", "acceptedNames"}, {"status", "conditions"},
		} {
			if _, found, _ := unstructured.NestedFieldNoCopy(u.Object, path...); !found {
				t.Errorf("dual export read as %s lost %s", u.GetAPIVersion(), strings.Join(path, "."))
			}
		}
	}
	// A v1alpha2-only export is valid; one of neither generation is not.
	mustCreate("apiserviceexports", `
apiVersion: kube-bind.io/v1alpha2
kind: APIServiceExport
metadata: {name: bundle}
spec: {resources: [{group: example.com, resource: widgets}, {group: example.com, resource: gadgets}], informerScope: Namespaced, isolation: Prefixed}`)
	refuseExports("v1alpha2", []refusedExport{
		{"export without resources or group", "nothing", "{informerScope: Namespaced}", "an export needs resources"},
		{"export with group but no names", "half.example.com",
			"{resources: [{group: example.com, resource: half}], group: example.com, informerScope: Namespaced}", "set together"},
	})

	// A v1alpha2 request with claims and namespaces.
	mustCreate("apiserviceexportrequests", `
apiVersion: kube-bind.io/v1alpha2
kind: APIServiceExportRequest
metadata: {name: with-claims}
spec:
  resources: [{group: example.com, resource: widgets}]
  permissionClaims: [{resource: secrets, selector: {namedResources: [{name: a, namespace: b}]}}]
  namespaces: [{name: team-a}]
  schemaUpdatePolicy: Always`)

	// BoundSchema, template and collection.
	bs, err := dyn.Resource(gvr2("boundschemas")).Namespace(ns).Create(ctx, obj(t, `
apiVersion: kube-bind.io/v1alpha2
kind: BoundSchema
metadata: {name: widgets.example.com}
spec:
  informerScope: Namespaced
  group: example.com
  names: {plural: widgets, kind: Widget}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, properties: {spec: {type: object}}}}, subresources: {status: {}}}]`), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("valid BoundSchema refused: %v", err)
	}
	if _, found, _ := unstructured.NestedMap(bs.Object, "spec", "versions"); found {
		t.Error("versions is a list")
	}
	vs, _, _ := unstructured.NestedSlice(bs.Object, "spec", "versions")
	if _, found, _ := unstructured.NestedMap(vs[0].(map[string]any), "schema", "openAPIV3Schema", "properties", "spec"); !found {
		t.Errorf("the BoundSchema's schema was pruned: %v", vs[0])
	}
	_, err = dyn.Resource(gvr2("boundschemas")).Namespace(ns).Patch(ctx, "widgets.example.com", types.MergePatchType,
		[]byte(`{"status":{"acceptedNames":{"plural":"widgets","kind":"Widget"},"storedVersions":["v1"],"instantiations":2}}`), metav1.PatchOptions{}, "status")
	if err != nil {
		t.Errorf("the konnector's BoundSchema status write: %v", err)
	}
	_, err = dyn.Resource(gvr2("boundschemas")).Namespace(ns).Create(ctx, obj(t, `
apiVersion: kube-bind.io/v1alpha2
kind: BoundSchema
metadata: {name: wrong.example.com}
spec: {informerScope: Namespaced, group: example.com, names: {plural: widgets, kind: Widget}, scope: Namespaced, versions: [{name: v1, served: true, storage: true, schema: {}}]}`), metav1.CreateOptions{})
	mustRefuse("BoundSchema with the wrong name", err, "<spec.names.plural>.<spec.group>")
	if _, err := dyn.Resource(gvr2("apiserviceexporttemplates")).Create(ctx, obj(t, `
apiVersion: kube-bind.io/v1alpha2
kind: APIServiceExportTemplate
metadata: {name: crd-test-template}
spec:
  description: Widgets with their Secrets
  scope: Namespaced
  resources: [{group: example.com, resource: widgets, versions: [v1]}]
  permissionClaims: [{resource: secrets, selector: {labelSelector: {matchLabels: {app: widget}}}}]
  namespaces: [{name: team-a}]
  schemaUpdatePolicy: Never`), metav1.CreateOptions{}); err != nil {
		t.Errorf("valid template refused: %v", err)
	}
	if _, err := dyn.Resource(gvr2("collections")).Create(ctx, obj(t, `
apiVersion: kube-bind.io/v1alpha2
kind: Collection
metadata: {name: crd-test-collection}
spec: {description: All of it, templates: [{name: crd-test-template}]}`), metav1.CreateOptions{}); err != nil {
		t.Errorf("valid collection refused: %v", err)
	}

	// kubectl get kube-bindings lists the five namespaced kinds.
	_, res, err := kube.Discovery().ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}
	inCategory := map[string]bool{}
	for _, l := range res {
		for _, r := range l.APIResources {
			for _, c := range r.Categories {
				if c == "kube-bindings" {
					inCategory[r.Name] = true
				}
			}
		}
	}
	if len(inCategory) != 5 {
		t.Errorf("resources in category kube-bindings: %v, want 5", inCategory)
	}
}

// manyKeys is a YAML flow map body with n distinct keys.
func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "k%d: %d", i, i)
	}
	return b.String()
}
