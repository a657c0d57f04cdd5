package cleanup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/cleanup"
	"github.com/kbprovider/backend/internal/binding/controllers/exportrequests"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/backendcluster"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

const (
	backendUser = "kube-bind-backend-cleanup-test"
	prefix      = "kbc-"
)

var mangodb = exampleapis.MangoDB.Resource()

type env struct {
	admin       kubernetes.Interface
	backend     *rest.Config
	catalog     *binding.Catalog
	provisioner *binding.Provisioner
}

// setup prepares the cluster once and gives a catalog and a provisioner
// running as a user holding only the backend's ClusterRoles.
func setup(t *testing.T) *env {
	t.Helper()
	cp := controlplane.Get(t)
	e := &env{
		admin:   kubernetes.NewForConfigOrDie(cp.AdminConfig()),
		backend: backendcluster.Backend(t, cp, backendUser, exampleapis.MangoDB),
	}
	e.catalog = backendcluster.Catalog(t, e.backend, exampleapis.MangoDB)
	e.provisioner = e.newProvisioner(t, e.backend)
	return e
}

func (e *env) newProvisioner(t *testing.T, rc *rest.Config) *binding.Provisioner {
	p, err := binding.NewProvisioner(rc, e.catalog, binding.Config{NamespacePrefix: prefix, ProviderPrettyName: "Cleanup Test"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// start runs a controller until the test ends (and checks it stops).
func start(t *testing.T, run func(context.Context) error) (stop func()) {
	t.Helper()
	return backendcluster.Run(t, "the controller", run)
}

// consumer is one bound consumer, seen through its issued kubeconfig.
type consumer struct {
	namespace string
	kube      kubernetes.Interface
	dyn       dynamic.Interface
}

func (e *env) bind(t *testing.T, name string) *consumer {
	t.Helper()
	c := binding.Consumer{Issuer: "https://idp.example.com", Subject: fmt.Sprint(name, "-", time.Now().UnixNano())}
	resp, err := e.provisioner.Provision(context.Background(), c, "cluster1", []binding.Resource{mangodb})
	if err != nil {
		t.Fatal(err)
	}
	rc, ns := testutil.IssuedConfig(t, resp.Kubeconfig)
	return &consumer{namespace: ns, kube: kubernetes.NewForConfigOrDie(rc), dyn: dynamic.NewForConfigOrDie(rc)}
}

// halfBind is a bind cut short by an API server outage right after the
// namespace and the backend's RoleBinding were made: every request for a
// service account fails at the transport.
func (e *env) halfBind(t *testing.T, name string) string {
	t.Helper()
	cut := rest.CopyConfig(e.backend)
	cut.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if strings.Contains(r.URL.Path, "/serviceaccounts") {
				return nil, errors.New("connection reset (test: API server outage)")
			}
			return rt.RoundTrip(r)
		})
	}
	c := binding.Consumer{Issuer: "https://idp.example.com", Subject: fmt.Sprint(name, "-", time.Now().UnixNano())}
	p := e.newProvisioner(t, cut)
	if _, err := p.Provision(context.Background(), c, "cluster1", []binding.Resource{mangodb}); err == nil ||
		!strings.Contains(err.Error(), "outage") {
		t.Fatalf("the cut-short bind: %v, want the outage", err)
	}
	ns := p.Namespace(c, "cluster1")
	if _, err := e.admin.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{}); err != nil {
		t.Fatalf("the half-made namespace: %v", err)
	}
	return ns
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// heartbeat writes a konnector heartbeat with the consumer's kubeconfig.
func (c *consumer) heartbeat(t *testing.T) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{
		"lastHeartbeatTime": time.Now().UTC().Format(time.RFC3339), "heartbeatInterval": "5m0s",
	}})
	_, err := c.dyn.Resource(kbresources.ClusterBindings).Namespace(c.namespace).
		Patch(context.Background(), binding.ClusterBindingName, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
}

// deleting says whether the namespace is being (or was) deleted.
func (e *env) deleting(name string) bool {
	ns, err := e.admin.CoreV1().Namespaces().Get(context.Background(), name, metav1.GetOptions{})
	return apierrors.IsNotFound(err) || err == nil && ns.DeletionTimestamp != nil
}

// Revocation: the provider labels the consumer namespace; the backend
// revokes the token, deletes the namespace and the namespaces made for the
// consumer's APIServiceNamespaces (cluster-scoped), and a bind meanwhile is
// refused. Without the controller nothing would happen.
func TestRevocationByLabel(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	ex, err := exportrequests.New(exportrequests.Config{Catalog: e.catalog, GrantBackend: e.provisioner.GrantBackend, NamespacePrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	start(t, func(ctx context.Context) error {
		kbmanager.Run(ctx, e.backend, kbmanager.Options{}, ex.Setup)
		return nil
	})
	reg := prometheus.NewRegistry()
	ctrl, err := cleanup.New(cleanup.Config{Unbinder: e.provisioner, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	start(t, func(ctx context.Context) error {
		kbmanager.Run(ctx, e.backend, kbmanager.Options{}, ctrl.Setup)
		return nil
	})

	c := e.bind(t, "revoked")
	other := e.bind(t, "innocent")
	other.heartbeat(t) // in use: the garbage collection of a later test spares it
	// The consumer asks for an APIServiceNamespace: the backend makes a
	// namespace for it, outside the consumer namespace.
	apiNS := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha1", "kind": "APIServiceNamespace", "metadata": map[string]any{"name": "team-a"},
	}}
	var child string
	testutil.Await(t, "the APIServiceNamespace gets its namespace", func() bool {
		if child == "" {
			_, _ = c.dyn.Resource(kbresources.APIServiceNamespaces).Namespace(c.namespace).Create(ctx, apiNS, metav1.CreateOptions{})
		}
		got, err := c.dyn.Resource(kbresources.APIServiceNamespaces).Namespace(c.namespace).Get(ctx, "team-a", metav1.GetOptions{})
		if err != nil {
			return false
		}
		child, _, _ = unstructured.NestedString(got.Object, "status", "namespace")
		return child != ""
	})
	if _, err := c.kube.CoreV1().Secrets(c.namespace).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("the consumer's token before revocation: %v", err)
	}

	// The documented action: kubectl label namespace <ns> kube-bind.io/revoked=true
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, binding.LabelRevoked)
	if _, err := e.admin.CoreV1().Namespaces().Patch(ctx, c.namespace, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	labelled := time.Now()
	testutil.Await(t, "the consumer's token is refused", func() bool {
		_, err := c.kube.CoreV1().Secrets(c.namespace).List(ctx, metav1.ListOptions{})
		return apierrors.IsUnauthorized(err)
	})
	t.Logf("token refused %s after the label", time.Since(labelled).Round(10*time.Millisecond))
	for what, err := range map[string]error{
		"token Secret":    get(e.admin.CoreV1().Secrets(c.namespace).Get(ctx, binding.TokenSecretName, metav1.GetOptions{})),
		"service account": get(e.admin.CoreV1().ServiceAccounts(c.namespace).Get(ctx, binding.ServiceAccountName, metav1.GetOptions{})),
	} {
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s after revocation: %v, want NotFound", what, err)
		}
	}
	testutil.Await(t, "the consumer namespace and its APIServiceNamespace's namespace are deleted", func() bool {
		return e.deleting(c.namespace) && e.deleting(child)
	})
	if n := testutil.MetricValue(t, reg, "kube_bind_backend_revoked_bindings_total"); n != 1 {
		t.Errorf("revoked_bindings_total %v, want 1", n)
	}
	// Another consumer is untouched.
	if e.deleting(other.namespace) {
		t.Error("revoking one consumer deleted another")
	}
	if _, err := other.kube.CoreV1().Secrets(other.namespace).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the other consumer's token: %v", err)
	}
}

// A bind of a revoked consumer, before the controllers got to it, is
// refused rather than handing out a fresh token.
func TestProvisionRefusesRevokedNamespace(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	subject := fmt.Sprint("again-", time.Now().UnixNano())
	c := binding.Consumer{Issuer: "https://idp.example.com", Subject: subject}
	if _, err := e.provisioner.Provision(ctx, c, "cluster1", []binding.Resource{mangodb}); err != nil {
		t.Fatal(err)
	}
	ns := e.provisioner.Namespace(c, "cluster1")
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, binding.LabelRevoked)
	if _, err := e.admin.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := e.provisioner.Provision(ctx, c, "cluster1", []binding.Resource{mangodb})
	if !errors.Is(err, binding.ErrNamespaceTerminating) || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("bind of a revoked consumer: %v, want ErrNamespaceTerminating saying revoked", err)
	}
}

// Garbage collection, first as a dry run, then for real: a half-made
// namespace and a complete but never delivered one are removed after
// GCAfter; a delivered one, one whose konnector heartbeated and one whose
// credentials were used are kept.
func TestGarbageCollection(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	const after = 4 * time.Second

	firstBind := time.Now()
	undelivered := e.bind(t, "undelivered")
	half := e.halfBind(t, "half")
	delivered := e.bind(t, "delivered")
	// Recorded the way the session service does before it hands the
	// response out.
	if err := e.provisioner.MarkDelivered(ctx, delivered.namespace); err != nil {
		t.Fatal(err)
	}
	heartbeating := e.bind(t, "heartbeating")
	heartbeating.heartbeat(t)
	used := e.bind(t, "used")
	req := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha1", "kind": "APIServiceExportRequest",
		"metadata": map[string]any{"name": "mangodbs.mangodb.com"},
		"spec":     map[string]any{"resources": []any{map[string]any{"group": "mangodb.com", "resource": "mangodbs"}}},
	}}
	if _, err := used.dyn.Resource(kbresources.APIServiceExportRequests).Namespace(used.namespace).Create(ctx, req, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	keep := []string{delivered.namespace, heartbeating.namespace, used.namespace}
	collect := []string{undelivered.namespace, half}

	// Dry run: logged and counted once each, nothing deleted.
	logs := &procs.Buffer{}
	reg := prometheus.NewRegistry()
	dry, err := cleanup.New(cleanup.Config{Unbinder: e.provisioner, GCAfter: after, DryRun: true, Metrics: reg,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stopDry := start(t, func(ctx context.Context) error {
		kbmanager.Run(ctx, e.backend, kbmanager.Options{}, dry.Setup)
		return nil
	})
	testutil.Await(t, "the dry run reports both unused bindings", func() bool {
		return count(logs, "would delete", undelivered.namespace) == 1 && count(logs, "would delete", half) == 1
	})
	// No report before GCAfter from the first bind (less a second: the
	// marks have second precision).
	if since := time.Since(firstBind); since < after-time.Second {
		t.Errorf("reported %s after the first bind, before GCAfter %s", since, after)
	}
	time.Sleep(time.Second)
	stopDry()
	for _, ns := range append(keep, collect...) {
		if e.deleting(ns) {
			t.Errorf("the dry run deleted %s", ns)
		}
	}
	for _, ns := range keep {
		if count(logs, "would delete", ns) != 0 {
			t.Errorf("the dry run would delete %s, which is in use", ns)
		}
	}
	const gcTotal = "kube_bind_backend_gc_bindings_total"
	if a, b := testutil.MetricValue(t, reg, gcTotal, "action", "would_delete", "reason", "undelivered"),
		testutil.MetricValue(t, reg, gcTotal, "action", "would_delete", "reason", "incomplete"); a != 1 || b != 1 {
		t.Errorf("would_delete: undelivered %v, incomplete %v; want 1 each", a, b)
	}
	if n := testutil.MetricValue(t, reg, gcTotal, "action", "deleted", "reason", "undelivered"); n != 0 {
		t.Errorf("deleted in a dry run: %v", n)
	}

	// For real.
	reg = prometheus.NewRegistry()
	collector, err := cleanup.New(cleanup.Config{Unbinder: e.provisioner, GCAfter: after, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	start(t, func(ctx context.Context) error {
		kbmanager.Run(ctx, e.backend, kbmanager.Options{}, collector.Setup)
		return nil
	})
	testutil.Await(t, "both unused bindings are deleted", func() bool { return e.deleting(undelivered.namespace) && e.deleting(half) })
	// The collection went through Unbind: the token is revoked.
	if _, err := e.admin.CoreV1().Secrets(undelivered.namespace).Get(ctx, binding.TokenSecretName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("token Secret of a collected binding: %v, want NotFound", err)
	}
	time.Sleep(2 * time.Second) // another pass would have caught the others by now
	for _, ns := range keep {
		if e.deleting(ns) {
			t.Errorf("%s was collected, but it is in use", ns)
		}
	}
	if a, b := testutil.MetricValue(t, reg, gcTotal, "action", "deleted", "reason", "undelivered"),
		testutil.MetricValue(t, reg, gcTotal, "action", "deleted", "reason", "incomplete"); a != 1 || b != 1 {
		t.Errorf("deleted: undelivered %v, incomplete %v; want 1 each", a, b)
	}
}

func get[T any](_ T, err error) error { return err }

// count counts log lines containing both strings.
func count(logs *procs.Buffer, what, ns string) int {
	n := 0
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, what) && strings.Contains(l, `"namespace":"`+ns+`"`) {
			n++
		}
	}
	return n
}
