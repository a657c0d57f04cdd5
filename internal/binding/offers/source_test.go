package offers_test

import (
	"context"
	"os"
	"reflect"
	"strings"
	"testing"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/backendcluster"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

func create(t *testing.T, dyn dynamic.Interface, y string) {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(y), &u.Object); err != nil {
		t.Fatal(err)
	}
	gvr := kbresources.APIServiceExportTemplates
	if u.GetKind() == "Collection" {
		gvr = kbresources.Collections
	}
	if _, err := dyn.Resource(gvr).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// The offers as the backend (with only its ClusterRole) sees them: one
// implicit offer per exported CRD, the templates that stay within the
// catalog (replacing the implicit offer of their name), collections
// without the templates not offered; Cover decides requests by them.
func TestOffers(t *testing.T) {
	cp := controlplane.Get(t)
	backend := backendcluster.Backend(t, cp, "kube-bind-backend-offers-test", exampleapis.MangoDB, exampleapis.Redis, exampleapis.SecretThing)
	catalog := backendcluster.Catalog(t, backend, exampleapis.MangoDB, exampleapis.Redis)
	admin := dynamic.NewForConfigOrDie(cp.AdminConfig())
	for _, y := range []string{
		// Offered: both resources exported, a claimable claim.
		`{apiVersion: kube-bind.io/v1alpha2, kind: APIServiceExportTemplate, metadata: {name: databases},
		  spec: {description: All databases, resources: [{group: mangodb.com, resource: mangodbs}, {group: cache.example.com, resource: redises, versions: [v1alpha1]}],
		         permissionClaims: [{resource: secrets, selector: {labelSelector: {matchLabels: {app: db}}}}], namespaces: [{name: team-a}], schemaUpdatePolicy: Never}}`,
		// Replaces the implicit offer of its name.
		`{apiVersion: kube-bind.io/v1alpha2, kind: APIServiceExportTemplate, metadata: {name: redises.cache.example.com},
		  spec: {description: Redis with its ConfigMaps, resources: [{group: cache.example.com, resource: redises}],
		         permissionClaims: [{resource: configmaps, selector: {namedResources: [{name: redis-config}]}}]}}`,
		// Not offered: an unexported resource, a claim on a resource not
		// claimable, too many namespaces, a cluster scope.
		`{apiVersion: kube-bind.io/v1alpha2, kind: APIServiceExportTemplate, metadata: {name: internal},
		  spec: {resources: [{group: internal.example.com, resource: secretthings}]}}`,
		`{apiVersion: kube-bind.io/v1alpha2, kind: APIServiceExportTemplate, metadata: {name: pods},
		  spec: {resources: [{group: mangodb.com, resource: mangodbs}], permissionClaims: [{resource: pods, selector: {}}]}}`,
		`{apiVersion: kube-bind.io/v1alpha2, kind: APIServiceExportTemplate, metadata: {name: crowded},
		  spec: {resources: [{group: mangodb.com, resource: mangodbs}], namespaces: [{name: a1},{name: a2},{name: a3},{name: a4},{name: a5},{name: a6},{name: a7},{name: a8},{name: a9},{name: b1},{name: b2},{name: b3},{name: b4},{name: b5},{name: b6},{name: b7},{name: b8}]}}`,
		`{apiVersion: kube-bind.io/v1alpha2, kind: APIServiceExportTemplate, metadata: {name: cluster-wide},
		  spec: {scope: Cluster, resources: [{group: mangodb.com, resource: mangodbs}]}}`,
		`{apiVersion: kube-bind.io/v1alpha2, kind: Collection, metadata: {name: everything},
		  spec: {description: Everything, templates: [{name: internal}, {name: databases}, {name: redises.cache.example.com}]}}`,
		`{apiVersion: kube-bind.io/v1alpha2, kind: Collection, metadata: {name: nothing-offered},
		  spec: {templates: [{name: internal}]}}`,
	} {
		create(t, admin, y)
	}

	src, err := offers.New(backend, catalog, offers.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src.Start(ctx)
	testutil.Await(t, "the offers sync and hold the templates", func() bool { return src.HasSynced() && len(src.List()) == 3 })

	var names []string
	for _, o := range src.List() {
		names = append(names, o.Name)
	}
	if want := []string{"databases", "mangodbs.mangodb.com", "redises.cache.example.com"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("offers %v, want %v", names, want)
	}
	mango, _ := src.Get("mangodbs.mangodb.com")
	if !mango.Implicit || mango.SchemaUpdatePolicy != "Always" || len(mango.PermissionClaims) != 0 ||
		!reflect.DeepEqual(mango.Resources, []v1alpha2.Resource{{Group: "mangodb.com", Resource: "mangodbs", Versions: []string{"v1alpha1"}}}) {
		t.Errorf("implicit offer %+v", mango)
	}
	redis, _ := src.Get("redises.cache.example.com")
	if redis.Implicit || redis.Description != "Redis with its ConfigMaps" || len(redis.PermissionClaims) != 1 {
		t.Errorf("the template did not replace the implicit offer: %+v", redis)
	}
	db, _ := src.Get("databases")
	if db.SchemaUpdatePolicy != "Never" || len(db.Namespaces) != 1 || db.Resources[0].Versions[0] != "v1alpha1" {
		t.Errorf("template offer %+v", db)
	}
	verdicts := src.Templates()
	for name, reason := range map[string]string{"internal": offers.ReasonResourceNotExported, "pods": offers.ReasonClaimNotAllowed,
		"crowded": offers.ReasonTooManyNamespaces, "cluster-wide": offers.ReasonScopeNotOffered, "databases": ""} {
		if verdicts[name].Reason != reason {
			t.Errorf("template %s: verdict %+v, want reason %q", name, verdicts[name], reason)
		}
	}
	if cols := src.Collections(); len(cols) != 1 || cols[0].Name != "everything" ||
		!reflect.DeepEqual(cols[0].Offers, []string{"databases", "redises.cache.example.com"}) {
		t.Errorf("collections %+v", cols)
	}

	claim := v1alpha2.PermissionClaim{Resource: "secrets", Selector: v1alpha2.Selector{LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}}
	wider := v1alpha2.PermissionClaim{Resource: "secrets", Selector: v1alpha2.Selector{}}
	mangodbs := v1alpha2.Resource{Group: "mangodb.com", Resource: "mangodbs"}
	redises := v1alpha2.Resource{Group: "cache.example.com", Resource: "redises"}
	for _, tc := range []struct {
		what             string
		spec             v1alpha2.APIServiceExportRequestSpec
		offer, wantWords string
	}{
		{"one implicit resource", v1alpha2.APIServiceExportRequestSpec{Resources: []v1alpha2.Resource{mangodbs}}, "databases", ""},
		{"part of a template, with its claim and namespace", v1alpha2.APIServiceExportRequestSpec{Resources: []v1alpha2.Resource{redises, mangodbs},
			PermissionClaims: []v1alpha2.PermissionClaim{claim}, Namespaces: []v1alpha2.NameRef{{Name: "team-a"}}}, "databases", ""},
		{"a wider claim", v1alpha2.APIServiceExportRequestSpec{Resources: []v1alpha2.Resource{mangodbs}, PermissionClaims: []v1alpha2.PermissionClaim{wider}}, "", "no single offer"},
		{"a namespace not offered", v1alpha2.APIServiceExportRequestSpec{Resources: []v1alpha2.Resource{mangodbs}, Namespaces: []v1alpha2.NameRef{{Name: "team-b"}}}, "", "with these namespaces"},
		{"an unexported resource", v1alpha2.APIServiceExportRequestSpec{Resources: []v1alpha2.Resource{{Group: "internal.example.com", Resource: "secretthings"}}}, "", "is not exported"},
		{"a version not served", v1alpha2.APIServiceExportRequestSpec{Resources: []v1alpha2.Resource{{Group: "mangodb.com", Resource: "mangodbs", Versions: []string{"v9"}}}}, "", `version "v9"`},
		{"nothing", v1alpha2.APIServiceExportRequestSpec{}, "", "at least one"},
	} {
		offer, problem := src.Cover(tc.spec)
		if tc.wantWords == "" && (problem != "" || offer == "") || tc.wantWords != "" && (offer != "" || !strings.Contains(problem, tc.wantWords)) {
			t.Errorf("%s: Cover = %q, %q; want an offer %v, problem with %q", tc.what, offer, problem, tc.wantWords == "", tc.wantWords)
		}
	}

	// Regrant keeps of a decided spec only what an offer still holds,
	// never more than it asked for.
	star := v1alpha2.PermissionClaim{Group: "*", Resource: "*", Selector: v1alpha2.Selector{}}
	unexported := v1alpha2.Resource{Group: "internal.example.com", Resource: "secretthings"}
	full := v1alpha2.APIServiceExportRequestSpec{Resources: []v1alpha2.Resource{redises, mangodbs},
		PermissionClaims: []v1alpha2.PermissionClaim{claim}, Namespaces: []v1alpha2.NameRef{{Name: "team-a"}}}
	regrant := []struct {
		what                   string
		spec                   v1alpha2.APIServiceExportRequestSpec
		resources, claims, nss []bool
		reason                 string
	}{
		{"a spec an offer covers", full, []bool{true, true}, []bool{true}, []bool{true}, ""},
		{"a wider and a wildcard claim", v1alpha2.APIServiceExportRequestSpec{Resources: []v1alpha2.Resource{mangodbs},
			PermissionClaims: []v1alpha2.PermissionClaim{claim, wider, star}}, []bool{true}, []bool{true, false, false}, []bool{}, offers.ReasonOfferNarrowed},
		{"a namespace not offered", v1alpha2.APIServiceExportRequestSpec{Resources: []v1alpha2.Resource{mangodbs},
			Namespaces: []v1alpha2.NameRef{{Name: "kube-system"}}}, []bool{true}, []bool{}, []bool{false}, offers.ReasonOfferNarrowed},
		{"an unexported resource beside an offered one", v1alpha2.APIServiceExportRequestSpec{Resources: []v1alpha2.Resource{unexported, mangodbs}},
			[]bool{false, true}, []bool{}, []bool{}, offers.ReasonOfferNarrowed},
		{"only unexported resources", v1alpha2.APIServiceExportRequestSpec{Resources: []v1alpha2.Resource{unexported},
			PermissionClaims: []v1alpha2.PermissionClaim{claim}}, []bool{false}, []bool{false}, []bool{}, offers.ReasonOfferWithdrawn},
	}
	for _, tc := range regrant {
		g := src.Regrant(tc.spec)
		if !reflect.DeepEqual(g.Resources, tc.resources) || !reflect.DeepEqual(g.Claims, tc.claims) ||
			!reflect.DeepEqual(g.Namespaces, tc.nss) || g.Reason != tc.reason || (g.Reason == "") != (g.Message == "") {
			t.Errorf("%s: Regrant = %+v, want resources %v claims %v namespaces %v reason %q", tc.what, g, tc.resources, tc.claims, tc.nss, tc.reason)
		}
	}
	if got := src.ClaimableResources(); !reflect.DeepEqual(got, offers.DefaultClaimableResources) {
		t.Errorf("ClaimableResources = %v, want the defaults", got)
	}

	// The Ready condition says which templates are offered and why not,
	// written with the backend's own rights.
	statusDone := make(chan error, 1)
	go func() { statusDone <- src.RunStatus(ctx) }()
	ready := func(name string) (status, reason string) {
		u, err := admin.Resource(kbresources.APIServiceExportTemplates).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", ""
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == offers.ConditionReady {
				status, _ = m["status"].(string)
				reason, _ = m["reason"].(string)
			}
		}
		return status, reason
	}
	for name, want := range map[string][2]string{
		"databases": {"True", offers.ReasonOffered}, "internal": {"False", offers.ReasonResourceNotExported},
		"pods": {"False", offers.ReasonClaimNotAllowed}, "cluster-wide": {"False", offers.ReasonScopeNotOffered},
	} {
		testutil.Await(t, "the Ready condition of template "+name, func() bool {
			status, reason := ready(name)
			return status == want[0] && reason == want[1]
		})
	}
	// Withdrawing a resource of an offered template turns it not Ready.
	setExported(t, cp.AdminConfig(), exampleapis.Redis, false)
	testutil.Await(t, "template databases to turn not Ready when Redis is withdrawn", func() bool {
		status, reason := ready("databases")
		return status == "False" && reason == offers.ReasonResourceNotExported
	})
	// What the template granted narrows to what the implicit offer of
	// mangodbs holds: no claim, no namespace.
	if g := src.Regrant(full); !reflect.DeepEqual(g.Resources, []bool{false, true}) || !reflect.DeepEqual(g.Claims, []bool{false}) ||
		!reflect.DeepEqual(g.Namespaces, []bool{false}) || g.Reason != offers.ReasonOfferNarrowed {
		t.Errorf("with Redis withdrawn, Regrant = %+v", g)
	}
	setExported(t, cp.AdminConfig(), exampleapis.Redis, true)
	testutil.Await(t, "template databases to be Ready again", func() bool { status, _ := ready("databases"); return status == "True" })

	// A template follows the cluster: deleted, its offer goes.
	if err := admin.Resource(kbresources.APIServiceExportTemplates).Delete(ctx, "databases", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "the deleted template is no longer offered", func() bool { _, ok := src.Get("databases"); return !ok })
	cancel()
	if err := <-statusDone; err != nil {
		t.Errorf("RunStatus: %v", err)
	}
}

// setExported labels api's CRD exported or not, as a provider does.
func setExported(t *testing.T, admin *rest.Config, api exampleapis.API, exported bool) {
	t.Helper()
	value := `null`
	if exported {
		value = `"true"`
	}
	patch := []byte(`{"metadata":{"labels":{"` + binding.ExportedLabel + `":` + value + `}}}`)
	crds := apiextensionsclient.NewForConfigOrDie(admin).ApiextensionsV1().CustomResourceDefinitions()
	if _, err := crds.Patch(context.Background(), api.Name(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
