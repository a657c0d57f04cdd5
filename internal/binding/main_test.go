package binding

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/deploy/crds"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/testutil"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

// backendUserName is the identity the tests run the backend as: bound to
// BackendClusterRole only, so every test also proves that the documented
// RBAC is enough.
const backendUserName = "kube-bind-backend-test"

// Exported test APIs, made once per package.
var (
	widgets = Resource{Group: "example.com", Resource: "widgets"}       // namespaced, exported
	gadgets = Resource{Group: "example.com", Resource: "gadgets"}       // cluster-scoped, exported
	hidden  = Resource{Group: "example.com", Resource: "confidentials"} // namespaced, not exported
)

type env struct {
	cp      *controlplane.ControlPlane
	admin   *rest.Config
	backend *rest.Config
	kube    kubernetes.Interface // admin
	crds    apiextensionsclient.Interface
}

var (
	setupOnce sync.Once
	setupErr  error
	shared    env
)

// setup starts (once) the control plane with the kube-bind CRDs, the
// ClusterRoles, a least-privilege backend identity and the test CRDs.
func setup(t testing.TB) env {
	t.Helper()
	cp := controlplane.Get(t)
	setupOnce.Do(func() { setupErr = doSetup(cp) })
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	return shared
}

func doSetup(cp *controlplane.ControlPlane) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := cp.AdminConfig()
	e := env{cp: cp, admin: admin}
	e.kube = kubernetes.NewForConfigOrDie(admin)
	e.crds = apiextensionsclient.NewForConfigOrDie(admin)
	if err := crds.Install(ctx, admin); err != nil {
		return err
	}
	// exampleapis.AwaitQuotaCounting, which imports this package.
	if err := cp.AwaitQuotaCounting(ctx, "count/"+crds.APIServiceExportRequests, "count/"+crds.APIServiceNamespaces); err != nil {
		return err
	}
	if err := InstallClusterRoles(ctx, admin); err != nil {
		return err
	}
	var err error
	if e.backend, err = cp.UserWithClusterRole(ctx, backendUserName, BackendClusterRole); err != nil {
		return err
	}
	for _, c := range []struct {
		r        Resource
		kind     string
		scope    apiextensionsv1.ResourceScope
		exported bool
	}{
		{widgets, "Widget", apiextensionsv1.NamespaceScoped, true},
		{gadgets, "Gadget", apiextensionsv1.ClusterScoped, true},
		{hidden, "Confidential", apiextensionsv1.NamespaceScoped, false},
	} {
		if err := createCRD(ctx, e.crds, c.r, c.kind, c.scope, c.exported); err != nil {
			return err
		}
	}
	shared = e
	return nil
}

// testCRD is a CRD with a served v1 and an unserved v2.
func testCRD(r Resource, kind string, scope apiextensionsv1.ResourceScope, exported bool) *apiextensionsv1.CustomResourceDefinition {
	schema := &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
		Type: "object", XPreserveUnknownFields: ptr(true),
	}}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: r.Resource + "." + r.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: r.Group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: r.Resource, Kind: kind, ListKind: kind + "List"},
			Scope: scope,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1", Served: true, Storage: true, Schema: schema},
				{Name: "v2", Served: false, Storage: false, Schema: schema},
			},
		},
	}
	if exported {
		crd.Labels = map[string]string{ExportedLabel: "true"}
	}
	return crd
}

func createCRD(ctx context.Context, client apiextensionsclient.Interface, r Resource, kind string, scope apiextensionsv1.ResourceScope, exported bool) error {
	_, err := client.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, testCRD(r, kind, scope, exported), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating CRD %s.%s: %w", r.Resource, r.Group, err)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// startCatalog runs a synced catalog as the backend identity until the test ends.
func startCatalog(t testing.TB, cfg *rest.Config, scope Scope) *Catalog {
	t.Helper()
	c, err := NewCatalog(cfg, scope)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.Start(ctx)
	syncCtx, done := context.WithTimeout(ctx, 30*time.Second)
	defer done()
	if !c.WaitForSync(syncCtx) {
		t.Fatal("catalog did not sync within 30s")
	}
	return c
}

// newProvisioner makes a provisioner acting as the backend identity, whose
// catalog already offers widgets and gadgets.
func newProvisioner(t testing.TB, e env, rc *rest.Config, scope Scope) *Provisioner {
	t.Helper()
	cat := startCatalog(t, e.backend, scope)
	testutil.Await(t, "catalog offers widgets", func() bool { _, ok := cat.Lookup(widgets.Group, widgets.Resource); return ok })
	p, err := NewProvisioner(rc, cat, Config{NamespacePrefix: "kb-", ProviderPrettyName: "Test Provider"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
