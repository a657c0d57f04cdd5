package exportrequests_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/exportrequests"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/backendcluster"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

// backendUser runs the controllers, the catalog and the provisioner: it
// holds only binding.BackendClusterRole, so the tests also prove that the
// documented RBAC is enough.
const (
	backendUser = "kube-bind-backend-exports-test"
	prefix      = "kbx-"
	issuer      = "https://idp.example.com"
)

var mangodb = exampleapis.MangoDB.Resource()

type env struct {
	cp          *controlplane.ControlPlane
	admin       *rest.Config
	kube        kubernetes.Interface
	dyn         dynamic.Interface
	crds        apiextensionsclient.Interface
	backend     *rest.Config
	catalog     *binding.Catalog
	offers      *offers.Source
	provisioner *binding.Provisioner
	controller  *exportrequests.Controller
	// stop stops the controllers setup started.
	stop func()
}

// setup prepares the cluster once (kube-bind CRDs, ClusterRoles, example
// APIs, the backend identity), and starts a catalog and the controllers
// as the backend identity for this test.
func setup(t *testing.T) *env {
	t.Helper()
	cp := controlplane.Get(t)
	admin := cp.AdminConfig()
	e := &env{
		cp: cp, admin: admin,
		kube:    kubernetes.NewForConfigOrDie(admin),
		dyn:     dynamic.NewForConfigOrDie(admin),
		crds:    apiextensionsclient.NewForConfigOrDie(admin),
		backend: backendcluster.Backend(t, cp, backendUser, exampleapis.MangoDB, exampleapis.Redis, exampleapis.SecretThing),
	}
	e.catalog = backendcluster.Catalog(t, e.backend, exampleapis.MangoDB)
	var err error
	e.provisioner, err = binding.NewProvisioner(e.backend, e.catalog, binding.Config{NamespacePrefix: prefix, ProviderPrettyName: "Exports Test"})
	if err != nil {
		t.Fatal(err)
	}
	// The offers as the server wires them: templates and collections
	// read as the backend identity.
	e.offers, err = offers.New(e.backend, e.catalog, offers.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e.offers.Start(ctx)
	e.controller, err = exportrequests.New(exportrequests.Config{
		Catalog: e.catalog, Offers: e.offers, GrantBackend: e.provisioner.GrantBackend, NamespacePrefix: prefix,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.stop = e.run(t, e.backend, kbmanager.Options{})
	return e
}

// run runs the controllers (again) as rc, until the test ends or stop.
func (e *env) run(t *testing.T, rc *rest.Config, opts kbmanager.Options) (stop func()) {
	return backendcluster.Run(t, "the exports controller", func(ctx context.Context) error {
		kbmanager.Run(ctx, rc, opts, e.controller.Setup)
		return nil
	})
}

// consumer is a bound consumer seen through its issued kubeconfig, as the
// CLI and the konnector use it.
type consumer struct {
	id        binding.Consumer
	clusterID string
	namespace string
	dyn       dynamic.Interface
}

func (e *env) bind(t *testing.T, subject string, resources ...binding.Resource) *consumer {
	t.Helper()
	c := binding.Consumer{Issuer: issuer, Subject: subject + "-" + fmt.Sprint(time.Now().UnixNano())}
	resp, err := e.provisioner.Provision(context.Background(), c, "cluster1", resources)
	if err != nil {
		t.Fatal(err)
	}
	rc, ns := testutil.IssuedConfig(t, resp.Kubeconfig)
	return &consumer{id: c, clusterID: "cluster1", namespace: ns, dyn: dynamic.NewForConfigOrDie(rc)}
}

// create makes obj as the consumer, retrying while RBAC catches up.
func (c *consumer) create(t *testing.T, gvr schema.GroupVersionResource, ns string, obj *unstructured.Unstructured) error {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err = c.dyn.Resource(gvr).Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func request(name, group, resource string, versions ...string) *unstructured.Unstructured {
	res := map[string]any{"group": group, "resource": resource}
	if len(versions) > 0 {
		vs := []any{}
		for _, v := range versions {
			vs = append(vs, v)
		}
		res["versions"] = vs
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha1", "kind": "APIServiceExportRequest",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"resources": []any{res}},
	}}
}

func object(gvr schema.GroupVersionResource, kind, name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(), "kind": kind,
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"size": int64(1)},
	}}
}

// waitPhase polls (every 5 ms, as the consumer) until the request has a
// terminal phase, and returns it with the message and the time it took.
func (c *consumer) waitPhase(t *testing.T, name string) (phase, message string, took time.Duration) {
	t.Helper()
	start := time.Now()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		u, err := c.dyn.Resource(kbresources.APIServiceExportRequests).Namespace(c.namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		phase, _, _ = unstructured.NestedString(u.Object, "status", "phase")
		message, _, _ = unstructured.NestedString(u.Object, "status", "terminalMessage")
		return phase == exportrequests.PhaseSucceeded || phase == exportrequests.PhaseFailed, nil
	})
	if err != nil {
		t.Fatalf("request %s/%s never left phase %q", c.namespace, name, phase)
	}
	return phase, message, time.Since(start)
}
