package exportrequests_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/kbprovider/backend/internal/binding/controllers/exportrequests"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

func yamlObject(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(y), &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}

// exportSpec reads an export (as the consumer, through v1alpha2).
func (c *consumer) export(t *testing.T, name string) map[string]any {
	t.Helper()
	u, err := c.dyn.Resource(kbresources.APIServiceExportsV1alpha2).Namespace(c.namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the APIServiceExport %s, as the consumer through v1alpha2: %v", name, err)
	}
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	return spec
}

// A request v1alpha1 can express (konnector v0.4.8 and v0.8 alike) gets a
// dual export: the v1alpha2 fields and the CRD copy on one object, and a
// BoundSchema the consumer may read and report on.
func TestDualExportAndBoundSchema(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	c := e.bind(t, "frank", mangodb)
	if err := c.create(t, kbresources.APIServiceExportRequests, c.namespace, request("mangodbs.mangodb.com", "mangodb.com", "mangodbs")); err != nil {
		t.Fatal(err)
	}
	if phase, msg, _ := c.waitPhase(t, "mangodbs.mangodb.com"); phase != exportrequests.PhaseSucceeded {
		t.Fatalf("%s %s", phase, msg)
	}
	spec := c.export(t, "mangodbs.mangodb.com")
	if spec["isolation"] != "Prefixed" || spec["informerScope"] != "Namespaced" || spec["group"] != "mangodb.com" {
		t.Errorf("dual export spec %v", spec)
	}
	if res, _ := json.Marshal(spec["resources"]); string(res) != `[{"group":"mangodb.com","resource":"mangodbs"}]` {
		t.Errorf("resources %s", res)
	}
	// Through v1alpha1 (konnector v0.4.8) the CRD copy is all there.
	v1, err := c.dyn.Resource(kbresources.APIServiceExports).Namespace(c.namespace).Get(ctx, "mangodbs.mangodb.com", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "mangodbs.mangodb.com", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkMirror(t, v1, crd)

	bs, err := c.dyn.Resource(kbresources.BoundSchemas).Namespace(c.namespace).Get(ctx, "mangodbs.mangodb.com", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the BoundSchema, as the consumer: %v", err)
	}
	checkMirror(t, bs, crd)
	if s, _, _ := unstructured.NestedString(bs.Object, "spec", "informerScope"); s != "Namespaced" {
		t.Errorf("BoundSchema informerScope %q", s)
	}
	// The konnector v0.8 reports on it.
	_, err = c.dyn.Resource(kbresources.BoundSchemas).Namespace(c.namespace).Patch(ctx, "mangodbs.mangodb.com", types.MergePatchType,
		[]byte(`{"status":{"acceptedNames":{"plural":"mangodbs","kind":"MangoDB"},"storedVersions":["v1alpha1"]}}`), metav1.PatchOptions{}, "status")
	if err != nil {
		t.Errorf("the consumer writing the BoundSchema's status: %v", err)
	}
	_, err = c.dyn.Resource(kbresources.BoundSchemas).Namespace(c.namespace).Patch(ctx, "mangodbs.mangodb.com", types.MergePatchType,
		[]byte(`{"spec":{"group":"evil.com"}}`), metav1.PatchOptions{})
	wantForbidden(t, "the consumer changing the BoundSchema's spec", err)

	// A second export of the same CRD under another name is refused.
	if err := c.create(t, kbresources.APIServiceExportRequests, c.namespace, request("second", "mangodb.com", "mangodbs")); err != nil {
		t.Fatal(err)
	}
	if phase, msg, _ := c.waitPhase(t, "second"); phase != exportrequests.PhaseFailed || !strings.Contains(msg, `already bound in this namespace by "mangodbs.mangodb.com"`) {
		t.Errorf("second request for a bound resource: %s %q", phase, msg)
	}
}

// An export written before the upgrade (v1alpha1 fields only) gets the
// v1alpha2 fields and its BoundSchema, and keeps the CRD copy.
func TestExportBeforeUpgradeBecomesDual(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	c := e.bind(t, "grace", mangodb)
	crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "mangodbs.mangodb.com", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := yamlObject(t, `
apiVersion: kube-bind.io/v1alpha1
kind: APIServiceExport
metadata: {name: mangodbs.mangodb.com, labels: {app.kubernetes.io/managed-by: kube-bind-backend}}
spec: {group: mangodb.com, names: {plural: mangodbs, kind: MangoDB}, scope: Namespaced, informerScope: Namespaced,
  versions: [{name: v1alpha1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]}`)
	if _, err := e.dyn.Resource(kbresources.APIServiceExports).Namespace(c.namespace).Apply(ctx, old.GetName(), old,
		metav1.ApplyOptions{FieldManager: "kube-bind-backend", Force: true}); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "the old export gets the v1alpha2 fields and the CRD's names", func() bool {
		u, err := e.dyn.Resource(kbresources.APIServiceExportsV1alpha2).Namespace(c.namespace).Get(ctx, old.GetName(), metav1.GetOptions{})
		if err != nil {
			return false
		}
		iso, _, _ := unstructured.NestedString(u.Object, "spec", "isolation")
		listKind, _, _ := unstructured.NestedString(u.Object, "spec", "names", "listKind")
		return iso == "Prefixed" && listKind == crd.Spec.Names.ListKind
	})
	u, _ := e.dyn.Resource(kbresources.APIServiceExports).Namespace(c.namespace).Get(ctx, old.GetName(), metav1.GetOptions{})
	checkMirror(t, u, crd)
	testutil.Await(t, "its BoundSchema", func() bool {
		_, err := e.dyn.Resource(kbresources.BoundSchemas).Namespace(c.namespace).Get(ctx, old.GetName(), metav1.GetOptions{})
		return err == nil
	})
}

// A template binds several resources with a claim and a namespace: the
// request is decided by the template, the export is named after the
// request with v1alpha2 fields only, every resource gets a BoundSchema,
// the namespace is made, and the claimed resource is granted there only.
// Unexporting one resource withdraws the export and its BoundSchemas.
func TestTemplateRequest(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	redis := exampleapis.Redis.Resource()
	c := e.bind(t, "heidi", mangodb, redis)
	templates := e.dyn.Resource(kbresources.APIServiceExportTemplates)
	tmpl := yamlObject(t, `
apiVersion: kube-bind.io/v1alpha2
kind: APIServiceExportTemplate
metadata: {name: exports-test-databases}
spec:
  resources: [{group: mangodb.com, resource: mangodbs}, {group: cache.example.com, resource: redises}]
  permissionClaims: [{resource: secrets, selector: {labelSelector: {matchLabels: {app: db}}}}]
  namespaces: [{name: team-a}]`)
	if _, err := templates.Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = templates.Delete(context.Background(), tmpl.GetName(), metav1.DeleteOptions{}) })
	testutil.Await(t, "the template is offered", func() bool { _, ok := e.offers.Get(tmpl.GetName()); return ok })

	req := func(name, claimApp string) *unstructured.Unstructured {
		return yamlObject(t, `
apiVersion: kube-bind.io/v1alpha2
kind: APIServiceExportRequest
metadata: {name: `+name+`}
spec:
  resources: [{group: mangodb.com, resource: mangodbs}, {group: cache.example.com, resource: redises}]
  permissionClaims: [{resource: secrets, selector: {labelSelector: {matchLabels: {app: `+claimApp+`}}}}]
  namespaces: [{name: team-a}]`)
	}
	// A wider claim than offered is refused.
	if err := c.create(t, kbresources.APIServiceExportRequestsV1alpha2, c.namespace, req("greedy", "other")); err != nil {
		t.Fatal(err)
	}
	if phase, msg, _ := c.waitPhase(t, "greedy"); phase != exportrequests.PhaseFailed || !strings.Contains(msg, "no single offer") {
		t.Errorf("a request claiming more than offered: %s %q", phase, msg)
	}
	if err := c.create(t, kbresources.APIServiceExportRequestsV1alpha2, c.namespace, req("databases", "db")); err != nil {
		t.Fatal(err)
	}
	if phase, msg, _ := c.waitPhase(t, "databases"); phase != exportrequests.PhaseSucceeded {
		t.Fatalf("%s %s", phase, msg)
	}
	spec := c.export(t, "databases")
	if _, found := spec["group"]; found {
		t.Errorf("an export v1alpha1 cannot express has v1alpha1 fields: %v", spec)
	}
	if claims, _ := json.Marshal(spec["permissionClaims"]); !strings.Contains(string(claims), `"app":"db"`) {
		t.Errorf("permissionClaims %s", claims)
	}
	for _, name := range []string{"mangodbs.mangodb.com", "redises.cache.example.com"} {
		if _, err := c.dyn.Resource(kbresources.BoundSchemas).Namespace(c.namespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("BoundSchema %s: %v", name, err)
		}
	}

	// The namespace asked for, with the claimed Secrets granted there.
	var child string
	testutil.Await(t, "the APIServiceNamespace team-a gets its namespace", func() bool {
		u, err := c.dyn.Resource(kbresources.APIServiceNamespacesV1alpha2).Namespace(c.namespace).Get(ctx, "team-a", metav1.GetOptions{})
		if err == nil {
			child, _, _ = unstructured.NestedString(u.Object, "status", "namespace")
		}
		return child != ""
	})
	secrets := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	secret := yamlObject(t, `{apiVersion: v1, kind: Secret, metadata: {name: db-password, labels: {app: db}}}`)
	if err := c.create(t, secrets, child, secret); err != nil {
		t.Errorf("creating a claimed Secret in the namespace of team-a: %v", err)
	}
	_, err := c.dyn.Resource(secrets).Namespace(c.namespace).Create(ctx, secret, metav1.CreateOptions{})
	wantForbidden(t, "creating a Secret in the consumer's own namespace", err)
	_, err = c.dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace(child).List(ctx, metav1.ListOptions{})
	wantForbidden(t, "listing unclaimed configmaps there", err)

	// Redis unexported: the template is no longer offered, so the export
	// narrows to MangoDBs, which the implicit offer still holds, without
	// the template's claim and namespace; Redis's BoundSchema goes, and
	// the claimed Secrets are no longer granted. The request says why and
	// stays Succeeded.
	setExported(t, e, "redises.cache.example.com", false)
	t.Cleanup(func() { setExported(t, e, "redises.cache.example.com", true) })
	testutil.Await(t, "the export narrows to MangoDBs, with one BoundSchema", func() bool {
		u, err := e.dyn.Resource(kbresources.APIServiceExportsV1alpha2).Namespace(c.namespace).Get(ctx, "databases", metav1.GetOptions{})
		if err != nil {
			return false
		}
		resources, _, _ := unstructured.NestedSlice(u.Object, "spec", "resources")
		_, claimed, _ := unstructured.NestedSlice(u.Object, "spec", "permissionClaims")
		list, err := e.dyn.Resource(kbresources.BoundSchemas).Namespace(c.namespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(resources) == 1 && !claimed && len(list.Items) == 1 && list.Items[0].GetName() == "mangodbs.mangodb.com"
	})
	testutil.Await(t, "the claimed Secrets are no longer granted", func() bool {
		_, err := c.dyn.Resource(secrets).Namespace(child).List(ctx, metav1.ListOptions{})
		return apierrors.IsForbidden(err)
	})
	u, err := c.dyn.Resource(kbresources.APIServiceExportRequestsV1alpha2).Namespace(c.namespace).Get(ctx, "databases", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	b, _ := json.Marshal(conds)
	if phase != exportrequests.PhaseSucceeded || !strings.Contains(string(b), `"reason":"OfferNarrowed"`) || !strings.Contains(string(b), "redises.cache.example.com") {
		t.Errorf("the narrowed request: phase %s, conditions %s", phase, b)
	}
}
