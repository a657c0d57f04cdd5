package exportrequests_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/exportrequests"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

func wantForbidden(t *testing.T, what string, err error) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: want Forbidden, got %v", what, err)
	}
}

// The CLI's path: a request created with the issued kubeconfig reaches
// Succeeded, the export mirrors the CRD, and the consumer may then use the
// bound resource in its namespace, and only that one, only there.
func TestRequestSucceedsAndExportMirrorsCRD(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	c := e.bind(t, "alice", mangodb)

	if err := c.create(t, kbresources.APIServiceExportRequests, c.namespace, request("mangodbs.mangodb.com", "mangodb.com", "mangodbs")); err != nil {
		t.Fatalf("creating the request with the issued kubeconfig: %v", err)
	}
	phase, msg, took := c.waitPhase(t, "mangodbs.mangodb.com")
	if phase != exportrequests.PhaseSucceeded {
		t.Fatalf("phase %s (%s), want Succeeded", phase, msg)
	}
	t.Logf("request created -> Succeeded, seen by a 5 ms poll: %v", took.Round(time.Millisecond))

	// The konnector reads the export with the same kubeconfig.
	exp, err := c.dyn.Resource(kbresources.APIServiceExports).Namespace(c.namespace).Get(ctx, "mangodbs.mangodb.com", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the APIServiceExport, as the consumer: %v", err)
	}
	crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "mangodbs.mangodb.com", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkMirror(t, exp, crd)
	if got, _, _ := unstructured.NestedString(exp.Object, "spec", "informerScope"); got != "Namespaced" {
		t.Errorf("informerScope %q, want Namespaced (consumer scope Namespaced)", got)
	}
	if _, found, _ := unstructured.NestedFieldNoCopy(exp.Object, "spec", "clusterScopedIsolation"); found {
		t.Error("clusterScopedIsolation set for a namespaced resource")
	}

	// A decided request stays decided: a second pass changes nothing.
	req, _ := c.dyn.Resource(kbresources.APIServiceExportRequests).Namespace(c.namespace).Get(ctx, "mangodbs.mangodb.com", metav1.GetOptions{})
	rv := exp.GetResourceVersion()
	time.Sleep(300 * time.Millisecond)
	again, _ := c.dyn.Resource(kbresources.APIServiceExports).Namespace(c.namespace).Get(ctx, "mangodbs.mangodb.com", metav1.GetOptions{})
	if again.GetResourceVersion() != rv {
		t.Error("the export in step with its CRD was written again")
	}
	if p, _, _ := unstructured.NestedString(req.Object, "status", "phase"); p != exportrequests.PhaseSucceeded {
		t.Errorf("phase later %q", p)
	}

	// The consumer may use mangodbs in its namespace (the Role follows the
	// export), not redises, and not elsewhere.
	if err := c.create(t, exampleapis.MangoDB.GVR(), c.namespace, object(exampleapis.MangoDB.GVR(), "MangoDB", "db1")); err != nil {
		t.Errorf("creating a MangoDB in the consumer namespace: %v", err)
	}
	_, err = c.dyn.Resource(exampleapis.Redis.GVR()).Namespace(c.namespace).Create(ctx, object(exampleapis.Redis.GVR(), "Redis", "r1"), metav1.CreateOptions{})
	wantForbidden(t, "creating a Redis (not bound)", err)
	_, err = c.dyn.Resource(exampleapis.MangoDB.GVR()).Namespace("default").Create(ctx, object(exampleapis.MangoDB.GVR(), "MangoDB", "db1"), metav1.CreateOptions{})
	wantForbidden(t, "creating a MangoDB in default", err)
	_, err = c.dyn.Resource(exampleapis.MangoDB.GVR()).List(ctx, metav1.ListOptions{})
	wantForbidden(t, "listing MangoDBs cluster-wide", err)
}

// checkMirror compares an export with its CRD field by field.
func checkMirror(t *testing.T, exp *unstructured.Unstructured, crd *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	var spec struct {
		Group    string                                        `json:"group"`
		Names    apiextensionsv1.CustomResourceDefinitionNames `json:"names"`
		Scope    apiextensionsv1.ResourceScope                 `json:"scope"`
		Versions []apiextensionsv1.CustomResourceDefinitionVersion
	}
	b, _ := json.Marshal(exp.Object["spec"])
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Group != crd.Spec.Group || spec.Scope != crd.Spec.Scope || spec.Names.Kind != crd.Spec.Names.Kind ||
		spec.Names.Plural != crd.Spec.Names.Plural || spec.Names.ListKind != crd.Spec.Names.ListKind || spec.Names.Singular != crd.Spec.Names.Singular {
		t.Errorf("export spec %s does not mirror the CRD %+v", b, crd.Spec.Names)
	}
	if len(spec.Versions) != len(crd.Spec.Versions) {
		t.Fatalf("export has %d versions, CRD %d", len(spec.Versions), len(crd.Spec.Versions))
	}
	for i, v := range crd.Spec.Versions {
		got := spec.Versions[i]
		want, _ := json.Marshal(v.Schema)
		have, _ := json.Marshal(got.Schema)
		if got.Name != v.Name || got.Served != v.Served || got.Storage != v.Storage || string(want) != string(have) {
			t.Errorf("version %d: export %s %v %v %s, CRD %s %v %v %s", i, got.Name, got.Served, got.Storage, have, v.Name, v.Served, v.Storage, want)
		}
		wantCols, _ := json.Marshal(v.AdditionalPrinterColumns)
		haveCols, _ := json.Marshal(got.AdditionalPrinterColumns)
		wantSub, _ := json.Marshal(v.Subresources)
		haveSub, _ := json.Marshal(got.Subresources)
		if string(wantCols) != string(haveCols) || string(wantSub) != string(haveSub) {
			t.Errorf("version %s: printer columns %s / subresources %s, CRD %s / %s", v.Name, haveCols, haveSub, wantCols, wantSub)
		}
	}
}

// Requests for what is not exported, does not exist, or is not served
// fail with a message, and stay failed when the API is exported later.
func TestRequestFailsForWhatIsNotExported(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	c := e.bind(t, "bob", mangodb)
	late := testCRD("latecomers", "Latecomer", false)
	createCRD(t, e, late)

	for _, tc := range []struct {
		name, group, resource string
		versions              []string
		want                  string
	}{
		{"secretthings.internal.example.com", "internal.example.com", "secretthings", nil, `resource "secretthings" of group "internal.example.com" is not exported`},
		{"nosuchthings.example.com", "example.com", "nosuchthings", nil, `resource "nosuchthings" of group "example.com" is not exported`},
		{"mangodbs.mangodb.com", "mangodb.com", "mangodbs", []string{"v9"}, `version "v9" of mangodbs.mangodb.com is not served by this provider (served: v1alpha1)`},
		{late.Name, late.Spec.Group, late.Spec.Names.Plural, nil, "is not exported"},
	} {
		if err := c.create(t, kbresources.APIServiceExportRequests, c.namespace, request(tc.name, tc.group, tc.resource, tc.versions...)); err != nil {
			t.Fatal(err)
		}
		phase, msg, took := c.waitPhase(t, tc.name)
		if phase != exportrequests.PhaseFailed || !strings.Contains(msg, tc.want) {
			t.Errorf("request %s: phase %s, message %q; want Failed with %q", tc.name, phase, msg, tc.want)
		}
		t.Logf("request %s -> %s in %v: %s", tc.name, phase, took.Round(time.Millisecond), msg)
		if _, err := e.dyn.Resource(kbresources.APIServiceExports).Namespace(c.namespace).Get(ctx, tc.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("export %s after a failed request: %v, want NotFound", tc.name, err)
		}
	}

	// Exported now: a new request succeeds; the failed one stays failed
	// (both are looked at in the same pass over the namespace).
	setExported(t, e, late.Name, true)
	testutil.Await(t, "the catalog offers latecomers", func() bool { _, ok := e.catalog.Lookup(late.Spec.Group, "latecomers"); return ok })
	if err := c.create(t, kbresources.APIServiceExportRequests, c.namespace, request("again", late.Spec.Group, "latecomers")); err != nil {
		t.Fatal(err)
	}
	if phase, msg, _ := c.waitPhase(t, "again"); phase != exportrequests.PhaseSucceeded {
		t.Fatalf("request for the now exported API: %s %s", phase, msg)
	}
	if phase, _, _ := c.waitPhase(t, late.Name); phase != exportrequests.PhaseFailed {
		t.Errorf("the failed request flipped to %s", phase)
	}
}

// The export follows its CRD: a schema change reaches it, unexporting or
// deleting the CRD removes it (and the consumer's rights on it).
func TestExportFollowsCRD(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	crd := testCRD("schemachanges", "SchemaChange", true)
	createCRD(t, e, crd)
	testutil.Await(t, "the catalog offers schemachanges", func() bool { _, ok := e.catalog.Lookup(crd.Spec.Group, "schemachanges"); return ok })
	c := e.bind(t, "carol", binding.Resource{Group: crd.Spec.Group, Resource: "schemachanges"})
	if err := c.create(t, kbresources.APIServiceExportRequests, c.namespace, request(crd.Name, crd.Spec.Group, "schemachanges")); err != nil {
		t.Fatal(err)
	}
	if phase, msg, _ := c.waitPhase(t, crd.Name); phase != exportrequests.PhaseSucceeded {
		t.Fatalf("%s %s", phase, msg)
	}
	gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: "v1", Resource: "schemachanges"}
	if err := c.create(t, gvr, c.namespace, object(gvr, "SchemaChange", "s1")); err != nil {
		t.Fatalf("creating a bound object: %v", err)
	}

	// A new field in the schema.
	patch := `[{"op":"add","path":"/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/color","value":{"type":"string","maxLength":20}}]`
	start := time.Now()
	if _, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, crd.Name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "the new field reaches the export", func() bool {
		exp, err := c.dyn.Resource(kbresources.APIServiceExports).Namespace(c.namespace).Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		versions, _, _ := unstructured.NestedSlice(exp.Object, "spec", "versions")
		if len(versions) == 0 {
			return false
		}
		m, _, _ := unstructured.NestedInt64(versions[0].(map[string]any), "schema", "openAPIV3Schema", "properties", "spec", "properties", "color", "maxLength")
		return m == 20
	})
	t.Logf("CRD schema change -> export: %v", time.Since(start).Round(time.Millisecond))
	updated, _ := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
	exp, _ := c.dyn.Resource(kbresources.APIServiceExports).Namespace(c.namespace).Get(ctx, crd.Name, metav1.GetOptions{})
	checkMirror(t, exp, updated)

	// Unexported: the export goes, and so do the consumer's rights.
	start = time.Now()
	setExported(t, e, crd.Name, false)
	testutil.Await(t, "the export is deleted", func() bool {
		_, err := e.dyn.Resource(kbresources.APIServiceExports).Namespace(c.namespace).Get(ctx, crd.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	t.Logf("unexport -> export deleted: %v", time.Since(start).Round(time.Millisecond))
	testutil.Await(t, "the consumer loses the unexported resource", func() bool {
		_, err := c.dyn.Resource(gvr).Namespace(c.namespace).List(ctx, metav1.ListOptions{})
		return apierrors.IsForbidden(err)
	})
	if phase, _, _ := c.waitPhase(t, crd.Name); phase != exportrequests.PhaseSucceeded {
		t.Errorf("the request flipped to %s", phase)
	}

	// Exported again: the succeeded request brings the export back; a
	// deleted CRD takes it away.
	setExported(t, e, crd.Name, true)
	testutil.Await(t, "the export is back", func() bool {
		_, err := e.dyn.Resource(kbresources.APIServiceExports).Namespace(c.namespace).Get(ctx, crd.Name, metav1.GetOptions{})
		return err == nil
	})
	if err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, crd.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "the export of a deleted CRD is deleted", func() bool {
		_, err := e.dyn.Resource(kbresources.APIServiceExports).Namespace(c.namespace).Get(ctx, crd.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// An APIServiceNamespace gets a provider namespace where the consumer may
// use what it bound (and nothing else); removing it, or unbinding, removes
// the namespace.
func TestAPIServiceNamespace(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	c := e.bind(t, "dave", mangodb)
	other := e.bind(t, "erin", mangodb)
	for _, x := range []*consumer{c, other} {
		if err := x.create(t, kbresources.APIServiceExportRequests, x.namespace, request("mangodbs.mangodb.com", "mangodb.com", "mangodbs")); err != nil {
			t.Fatal(err)
		}
		if phase, msg, _ := x.waitPhase(t, "mangodbs.mangodb.com"); phase != exportrequests.PhaseSucceeded {
			t.Fatalf("%s %s", phase, msg)
		}
	}
	apiNS := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "kube-bind.io/v1alpha1", "kind": "APIServiceNamespace", "metadata": map[string]any{"name": name},
		}}
	}
	statusNS := func(x *consumer, name string) string {
		var got string
		start := time.Now()
		testutil.Await(t, "status.namespace of "+name, func() bool {
			u, err := x.dyn.Resource(kbresources.APIServiceNamespaces).Namespace(x.namespace).Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				got, _, _ = unstructured.NestedString(u.Object, "status", "namespace")
			}
			return got != ""
		})
		t.Logf("APIServiceNamespace %s -> status.namespace %s: %v", name, got, time.Since(start).Round(time.Millisecond))
		return got
	}
	for _, x := range []*consumer{c, other} {
		for _, name := range []string{"default", "team-a"} {
			if err := x.create(t, kbresources.APIServiceNamespaces, x.namespace, apiNS(name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	mine := statusNS(c, "default")
	teamA := statusNS(c, "team-a")
	theirs := statusNS(other, "default")
	if want := exportrequests.ChildNamespaceName(prefix, c.namespace, "default"); mine != want || !strings.HasPrefix(mine, prefix) {
		t.Errorf("status.namespace %q, want %q", mine, want)
	}
	if mine == theirs || mine == teamA {
		t.Fatalf("namespaces not distinct: %s %s %s", mine, teamA, theirs)
	}
	ns, err := e.kube.CoreV1().Namespaces().Get(ctx, mine, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels[binding.LabelManagedBy] != binding.ManagedByValue || ns.Labels[binding.LabelConsumerNamespace] != c.namespace ||
		ns.Labels[exportrequests.LabelAPIServiceNamespace] != "default" {
		t.Errorf("namespace labels %v", ns.Labels)
	}

	// The consumer may use MangoDBs there, and only its own namespaces.
	if err := c.create(t, exampleapis.MangoDB.GVR(), mine, object(exampleapis.MangoDB.GVR(), "MangoDB", "db1")); err != nil {
		t.Errorf("creating a MangoDB in the APIServiceNamespace's namespace: %v", err)
	}
	_, err = c.dyn.Resource(exampleapis.MangoDB.GVR()).Namespace(theirs).Create(ctx, object(exampleapis.MangoDB.GVR(), "MangoDB", "db1"), metav1.CreateOptions{})
	wantForbidden(t, "creating a MangoDB in another consumer's namespace", err)
	_, err = c.dyn.Resource(exampleapis.Redis.GVR()).Namespace(mine).Create(ctx, object(exampleapis.Redis.GVR(), "Redis", "r1"), metav1.CreateOptions{})
	wantForbidden(t, "creating a Redis (not bound) there", err)
	_, err = c.dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace(mine).List(ctx, metav1.ListOptions{})
	wantForbidden(t, "listing configmaps there", err)

	// Deleting an APIServiceNamespace deletes its namespace.
	if err := c.dyn.Resource(kbresources.APIServiceNamespaces).Namespace(c.namespace).Delete(ctx, "team-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "the namespace of a deleted APIServiceNamespace goes", func() bool { return gone(e, teamA) })

	// Unbind removes the consumer namespace and its APIServiceNamespace
	// namespaces at once (not waiting for the controllers).
	if err := e.provisioner.Unbind(ctx, c.id, c.clusterID); err != nil {
		t.Fatal(err)
	}
	// (The test control plane runs no namespace controller: deleted
	// namespaces stay Terminating, which is what is checked.)
	for _, name := range []string{c.namespace, mine} {
		if !gone(e, name) {
			t.Errorf("namespace %s neither gone nor terminating right after Unbind", name)
		}
	}
	if gone(e, theirs) {
		t.Error("unbinding one consumer removed another's namespace")
	}
}

// gone says whether a namespace is deleted or being deleted.
func gone(e *env, name string) bool {
	ns, err := e.kube.CoreV1().Namespaces().Get(context.Background(), name, metav1.GetOptions{})
	return apierrors.IsNotFound(err) || err == nil && ns.DeletionTimestamp != nil
}

// testCRD is a namespaced CRD in group example.org with a v1 schema.
func testCRD(plural, kind string, exported bool) *apiextensionsv1.CustomResourceDefinition {
	labels := map[string]string{}
	if exported {
		labels[binding.ExportedLabel] = "true"
	}
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + ".example.org", Labels: labels},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.org",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: plural, Kind: kind, ListKind: kind + "List", Singular: strings.ToLower(kind), ShortNames: []string{plural[:3]}},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
					{Name: "Size", Type: "integer", JSONPath: ".spec.size"},
				},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"size": {Type: "integer", Minimum: ptr(1.0)},
						}},
						"status": {Type: "object", XPreserveUnknownFields: ptr(true)},
					},
				}},
			}},
		},
	}
}

func ptr[T any](v T) *T { return &v }

func createCRD(t *testing.T, e *env, crd *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	ctx := context.Background()
	_ = e.crds.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, crd.Name, metav1.DeleteOptions{})
	testutil.Await(t, "an old "+crd.Name+" is gone", func() bool {
		_, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if _, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, crd.Name+" established", func() bool {
		got, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true
			}
		}
		return false
	})
	t.Cleanup(func() {
		_ = e.crds.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), crd.Name, metav1.DeleteOptions{})
	})
}

func setExported(t *testing.T, e *env, name string, exported bool) {
	t.Helper()
	value := `"true"`
	if !exported {
		value = "null"
	}
	patch := `{"metadata":{"labels":{"` + binding.ExportedLabel + `":` + value + `}}}`
	if _, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
