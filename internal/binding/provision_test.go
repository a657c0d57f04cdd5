package binding

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kbprovider/backend/internal/apirequests"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

const issuer = "https://idp.example.com"

// consumerClients builds plain clients from an issued kubeconfig, the way
// the CLI and the konnector do.
func consumerClients(t *testing.T, kubeconfig []byte) (kubernetes.Interface, dynamic.Interface, string) {
	t.Helper()
	cc, err := clientcmd.NewClientConfigFromBytes(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cc.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(rc), dynamic.NewForConfigOrDie(rc), ns
}

func exportRequest(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha1", "kind": "APIServiceExportRequest",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"resources": []any{map[string]any{"group": "example.com", "resource": "widgets"}}},
	}}
}

func wantForbidden(t *testing.T, what string, err error) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: want Forbidden, got %v", what, err)
	}
}

// A kubeconfig issued by Provision works with a plain client in its own
// namespace, and nowhere else; the response has the shape released
// clients expect; the namespace carries the identity.
func TestProvisionIssuesWorkingKubeconfig(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p := newProvisioner(t, e, e.backend, ScopeCluster)
	alice := Consumer{Issuer: issuer, Subject: "alice@example.com"}
	bob := Consumer{Issuer: issuer, Subject: "bob"}

	resp, err := p.Provision(ctx, alice, "clusterA", []Resource{widgets, gadgets, widgets})
	if err != nil {
		t.Fatal(err)
	}
	respBob, err := p.Provision(ctx, bob, "clusterB", []Resource{widgets})
	if err != nil {
		t.Fatal(err)
	}

	// The result (each generation renders it: internal/sessions/lifecycle).
	if resp.ConsumerID != issuer+"/alice@example.com" || resp.Namespace != p.Namespace(alice, "clusterA") {
		t.Errorf("result consumer %q namespace %q", resp.ConsumerID, resp.Namespace)
	}
	if len(resp.APIs) != 2 {
		t.Fatalf("%d APIs, want 2 (duplicates dropped)", len(resp.APIs))
	}
	for i, want := range []struct{ name, group, resource string }{
		{"widgets.example.com", "example.com", "widgets"},
		{"gadgets.example.com", "example.com", "gadgets"},
	} {
		a := resp.APIs[i]
		if a.Name != want.name || a.Group != want.group || a.Resource != want.resource || !slices.Equal(a.Versions, []string{"v1"}) {
			t.Errorf("API %d: %+v", i, a)
		}
	}

	// The provider namespace.
	nsName := p.Namespace(alice, "clusterA")
	ns, err := e.kube.CoreV1().Namespaces().Get(ctx, nsName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Annotations[AnnotationIssuer] != issuer || ns.Annotations[AnnotationSubject] != "alice@example.com" ||
		ns.Annotations[AnnotationCluster] != "clusterA" || ns.Labels[LabelConsumerHash] != identityHash(alice, "clusterA") {
		t.Errorf("namespace metadata %v %v", ns.Annotations, ns.Labels)
	}
	if !strings.HasPrefix(nsName, "kb-") || strings.Contains(nsName, "alice") {
		t.Errorf("namespace name %q", nsName)
	}

	// A plain client from the kubeconfig, as the consumer.
	kube, dyn, ns1 := consumerClients(t, resp.Kubeconfig)
	if ns1 != nsName {
		t.Fatalf("kubeconfig namespace %q, want %q", ns1, nsName)
	}
	created, err := dyn.Resource(kbresources.APIServiceExportRequests).Namespace(ns1).Create(ctx, exportRequest("widgets.example.com"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("consumer creating an APIServiceExportRequest in its namespace: %v", err)
	}
	if phase, _, _ := unstructured.NestedString(created.Object, "status", "phase"); phase != "Pending" {
		t.Errorf("new request's phase %q, want Pending (CRD default)", phase)
	}
	if _, err := kube.CoreV1().Namespaces().Get(ctx, ns1, metav1.GetOptions{}); err != nil {
		t.Errorf("consumer reading its namespace: %v", err)
	}
	sec, err := kube.CoreV1().Secrets(ns1).Get(ctx, KubeconfigSecretName, metav1.GetOptions{})
	if err != nil || string(sec.Data[KubeconfigSecretKey]) != string(resp.Kubeconfig) {
		t.Errorf("consumer reading its kubeconfig Secret: %v", err)
	}
	cb, err := dyn.Resource(kbresources.ClusterBindings).Namespace(ns1).Get(ctx, ClusterBindingName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("consumer reading its ClusterBinding: %v", err)
	}
	ref, _, _ := unstructured.NestedStringMap(cb.Object, "spec", "kubeconfigSecretRef")
	pretty, _, _ := unstructured.NestedString(cb.Object, "spec", "providerPrettyName")
	if ref["name"] != KubeconfigSecretName || ref["key"] != KubeconfigSecretKey || pretty != "Test Provider" {
		t.Errorf("ClusterBinding spec %v", cb.Object["spec"])
	}
	// The konnector writes heartbeats to the ClusterBinding's status.
	unstructured.SetNestedField(cb.Object, "v0.4.8", "status", "konnectorVersion")
	if _, err := dyn.Resource(kbresources.ClusterBindings).Namespace(ns1).UpdateStatus(ctx, cb, metav1.UpdateOptions{}); err != nil {
		t.Errorf("consumer writing ClusterBinding status: %v", err)
	}

	// And nothing else.
	nsBob := p.Namespace(bob, "clusterB")
	_, err = kube.CoreV1().Secrets(nsBob).Get(ctx, KubeconfigSecretName, metav1.GetOptions{})
	wantForbidden(t, "reading another consumer's kubeconfig Secret", err)
	_, err = kube.CoreV1().Secrets(nsBob).List(ctx, metav1.ListOptions{})
	wantForbidden(t, "listing another consumer's Secrets", err)
	_, err = dyn.Resource(kbresources.APIServiceExportRequests).Namespace(nsBob).Create(ctx, exportRequest("widgets.example.com"), metav1.CreateOptions{})
	wantForbidden(t, "creating a request in another consumer's namespace", err)
	_, err = kube.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
	wantForbidden(t, "listing Secrets in kube-system", err)
	_, err = kube.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	wantForbidden(t, "listing Secrets cluster-wide", err)
	_, err = kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	wantForbidden(t, "listing namespaces", err)
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "evil"}}, metav1.CreateOptions{})
	wantForbidden(t, "creating a namespace", err)
	wantForbidden(t, "deleting its own namespace", kube.CoreV1().Namespaces().Delete(ctx, ns1, metav1.DeleteOptions{}))
	_, err = kube.CoreV1().Secrets(ns1).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
	wantForbidden(t, "creating a Secret in its namespace", err)
	_, err = kube.CoreV1().ServiceAccounts(ns1).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
	wantForbidden(t, "creating a ServiceAccount in its namespace", err)
	_, err = kube.RbacV1().RoleBindings(ns1).List(ctx, metav1.ListOptions{})
	wantForbidden(t, "listing RoleBindings in its namespace", err)

	// Bob's kubeconfig reaches Bob's namespace only.
	_, dynBob, nsB := consumerClients(t, respBob.Kubeconfig)
	if nsB != nsBob || nsB == ns1 {
		t.Fatalf("bob's namespace %q", nsB)
	}
	_, err = dynBob.Resource(kbresources.APIServiceExportRequests).Namespace(ns1).List(ctx, metav1.ListOptions{})
	wantForbidden(t, "bob listing alice's requests", err)
}

// Ten concurrent binds of one identity make one namespace and agree on
// everything.
func TestProvisionConcurrent(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p := newProvisioner(t, e, e.backend, ScopeNamespaced)
	c := Consumer{Issuer: issuer, Subject: "concurrent"}

	var wg sync.WaitGroup
	resps := make([]*Result, 10)
	errs := make([]error, 10)
	for i := range resps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resps[i], errs[i] = p.Provision(ctx, c, "cid", []Resource{widgets})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("bind %d: %v", i, err)
		}
		for j := range i {
			if string(resps[i].Kubeconfig) == string(resps[j].Kubeconfig) {
				t.Errorf("binds %d and %d got the same token", j, i)
			}
		}
		if _, _, ns := consumerClients(t, resps[i].Kubeconfig); ns != p.Namespace(c, "cid") {
			t.Errorf("bind %d: namespace %s", i, ns)
		}
	}
	list, err := e.kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: LabelConsumerHash + "=" + identityHash(c, "cid")})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		t.Fatalf("%d namespaces for one identity", len(list.Items))
	}
	secrets, err := e.kube.CoreV1().Secrets(list.Items[0].Name).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tokens, current := 0, ""
	for _, sec := range secrets.Items {
		switch {
		case sec.Name == KubeconfigSecretName:
			current = sec.Annotations[AnnotationTokenSecret]
		case sec.Labels[LabelCredential] == CredentialToken:
			tokens++
		default:
			t.Errorf("unexpected Secret %s", sec.Name)
		}
	}
	if tokens != 10 || current == "" {
		t.Errorf("%d token Secrets (want one per bind), current %q", tokens, current)
	}
	_, dyn, ns := consumerClients(t, resps[0].Kubeconfig)
	if _, err := dyn.Resource(kbresources.APIServiceExportRequests).Namespace(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A returning consumer gets the same namespace and service account, and a
// new token: the one it replaces is retired (it keeps working until
// internal/binding/controllers/credentials revokes it); another cluster of the same user gets
// another namespace.
func TestProvisionReturningConsumer(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p := newProvisioner(t, e, e.backend, ScopeNamespaced)
	c := Consumer{Issuer: issuer, Subject: "returning"}

	first, err := p.Provision(ctx, c, "cid", []Resource{widgets})
	if err != nil {
		t.Fatal(err)
	}
	ns := p.Namespace(c, "cid")
	sa1, err := e.kube.CoreV1().ServiceAccounts(ns).Get(ctx, ServiceAccountName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A new provisioner (a restarted or another replica) finds it again.
	p2 := newProvisioner(t, e, e.backend, ScopeNamespaced)
	second, err := p2.Provision(ctx, c, "cid", []Resource{widgets})
	if err != nil {
		t.Fatal(err)
	}
	sa2, err := e.kube.CoreV1().ServiceAccounts(ns).Get(ctx, ServiceAccountName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sa1.UID != sa2.UID {
		t.Error("returning consumer did not get the same service account")
	}
	if string(first.Kubeconfig) == string(second.Kubeconfig) {
		t.Error("a rebind handed out the token already in use")
	}
	tokens, err := e.kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelCredential + "=" + CredentialToken})
	if err != nil {
		t.Fatal(err)
	}
	kc, err := e.kube.CoreV1().Secrets(ns).Get(ctx, KubeconfigSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(kc.Data[KubeconfigSecretKey]) != string(second.Kubeconfig) {
		t.Error("the kubeconfig Secret does not hold the new kubeconfig")
	}
	retired := 0
	for _, tok := range tokens.Items {
		if tok.Name == kc.Annotations[AnnotationTokenSecret] {
			continue
		}
		if tok.Annotations[AnnotationRetiredAt] == "" || tok.Annotations[AnnotationExpiresAt] == "" {
			t.Errorf("replaced token Secret %s: annotations %v, want retired-at and expires-at", tok.Name, tok.Annotations)
		}
		retired++
	}
	if len(tokens.Items) != 2 || retired != 1 {
		t.Errorf("%d token Secrets, %d retired; want 2 and 1", len(tokens.Items), retired)
	}
	firstKube, _, _ := consumerClients(t, first.Kubeconfig)
	if _, err := firstKube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		t.Errorf("the retired token stopped working before its revocation: %v", err)
	}
	kube, _, ns2 := consumerClients(t, second.Kubeconfig)
	if ns2 != ns {
		t.Fatalf("namespace %q, want %q", ns2, ns)
	}
	if _, err := kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	other, err := p.Provision(ctx, c, "another-cluster", []Resource{widgets})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ns3 := consumerClients(t, other.Kubeconfig); ns3 == ns {
		t.Error("a second cluster of the same user shares the namespace")
	}
}

// Anything not exported (unknown, unlabelled, outside the consumer scope)
// is refused before anything is created; so are empty selections and bad
// identities.
func TestProvisionRefusals(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p := newProvisioner(t, e, e.backend, ScopeNamespaced)
	c := Consumer{Issuer: issuer, Subject: "refused"}

	for _, sel := range [][]Resource{
		{hidden},
		{widgets, hidden},
		{gadgets}, // cluster-scoped, consumer scope Namespaced
		{{Group: "example.com", Resource: "nothing"}},
		{{Group: "", Resource: "secrets"}},
		{{Group: "kube-bind.io", Resource: "clusterbindings"}},
	} {
		_, err := p.Provision(ctx, c, "cid", sel)
		var ne *NotExportedError
		if !errors.Is(err, ErrNotExported) || !errors.As(err, &ne) {
			t.Errorf("%v: got %v, want ErrNotExported", sel, err)
			continue
		}
		last := sel[len(sel)-1]
		if ne.Resource != last.Resource || !strings.Contains(err.Error(), last.Resource) {
			t.Errorf("%v: error names %q", sel, err)
		}
	}
	if _, err := p.Provision(ctx, c, "cid", nil); !errors.Is(err, ErrNoResources) {
		t.Errorf("empty selection: %v", err)
	}
	if _, err := p.Provision(ctx, Consumer{Issuer: issuer}, "cid", []Resource{widgets}); !errors.Is(err, ErrInvalidIdentity) {
		t.Errorf("empty subject: %v", err)
	}
	_, err := e.kube.CoreV1().Namespaces().Get(ctx, p.Namespace(c, "cid"), metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("a refused bind left a namespace: %v", err)
	}
}

// A namespace of the derived name that belongs to another identity (a
// hash collision, or made by hand) is refused, not merged, and Unbind does
// not delete it.
func TestProvisionIdentityConflict(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p := newProvisioner(t, e, e.backend, ScopeNamespaced)
	c := Consumer{Issuer: issuer, Subject: "victim"}
	name := p.Namespace(c, "cid")
	_, err := e.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:        name,
		Annotations: map[string]string{AnnotationIssuer: issuer, AnnotationSubject: "someone-else", AnnotationCluster: "cid"},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Provision(ctx, c, "cid", []Resource{widgets}); !errors.Is(err, ErrIdentityConflict) {
		t.Fatalf("got %v, want ErrIdentityConflict", err)
	}
	if err := p.Unbind(ctx, c, "cid"); !errors.Is(err, ErrIdentityConflict) {
		t.Fatalf("Unbind: got %v, want ErrIdentityConflict", err)
	}
	_, err = e.kube.CoreV1().ServiceAccounts(name).Get(ctx, ServiceAccountName, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("a service account was made in the other identity's namespace: %v", err)
	}
	rbs, err := e.kube.RbacV1().RoleBindings(name).List(ctx, metav1.ListOptions{})
	if err != nil || len(rbs.Items) != 0 {
		t.Fatalf("a RoleBinding was made in the other identity's namespace: %v %v", rbs, err)
	}
	ns, err := e.kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if err != nil || ns.DeletionTimestamp != nil {
		t.Fatalf("the other identity's namespace was deleted: %v", err)
	}
}

// failAfter is a transport that lets n requests through and then fails
// every one, like an API server that goes away mid-flow.
type failAfter struct {
	rt    http.RoundTripper
	left  atomic.Int64
	count atomic.Int64
}

func (f *failAfter) RoundTrip(r *http.Request) (*http.Response, error) {
	f.count.Add(1)
	if f.left.Add(-1) < 0 {
		return nil, fmt.Errorf("test: connection to the API server cut")
	}
	return f.rt.RoundTrip(r)
}

// A bind that loses the API server after any number of requests returns an
// error, and the next bind completes it: cut after request 0, 1, 2, ...
// until a bind gets through.
func TestProvisionFailsMidwayThenCompletes(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	healthy := newProvisioner(t, e, e.backend, ScopeNamespaced)
	cut := &failAfter{}
	cutCfg := rest.CopyConfig(e.backend)
	cutCfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { cut.rt = rt; return cut }
	failing, err := NewProvisioner(cutCfg, healthy.catalog, Config{NamespacePrefix: "kb-", ProviderPrettyName: "Test Provider"})
	if err != nil {
		t.Fatal(err)
	}
	cutsTried := 0
	for n := int64(0); ; n++ {
		c := Consumer{Issuer: issuer, Subject: fmt.Sprintf("midway-%d", n)}
		cut.left.Store(n)
		cut.count.Store(0)
		resp, err := failing.Provision(ctx, c, "cid", []Resource{widgets})
		if err == nil {
			if resp == nil || len(resp.Kubeconfig) == 0 {
				t.Fatal("nil error without a response")
			}
			t.Logf("cut after each of requests 0..%d: each bind failed cleanly and the next completed it; the first uncut bind made %d requests", n-1, cut.count.Load())
			break
		}
		cutsTried++
		if !strings.Contains(err.Error(), "connection to the API server cut") {
			t.Errorf("cut after %d requests: unclear error %v", n, err)
		}
		if resp != nil {
			t.Errorf("cut after %d requests: a response with the error", n)
		}
		resp, err = healthy.Provision(ctx, c, "cid", []Resource{widgets})
		if err != nil {
			t.Fatalf("cut after %d requests, then the next bind failed: %v", n, err)
		}
		kube, _, ns := consumerClients(t, resp.Kubeconfig)
		if _, err := kube.CoreV1().Secrets(ns).Get(ctx, KubeconfigSecretName, metav1.GetOptions{}); err != nil {
			t.Fatalf("cut after %d requests: the completed bind's kubeconfig fails: %v", n, err)
		}
		if n > 100 {
			t.Fatal("a bind never got through")
		}
	}
	if cutsTried < 8 {
		t.Fatalf("only %d cut points", cutsTried)
	}

	// An API server that is not there at all: a clear error, quickly.
	down := rest.CopyConfig(e.backend)
	down.Host = "https://" + freeAddr(t)
	p, err := NewProvisioner(down, healthy.catalog, Config{NamespacePrefix: "kb-", ProviderPrettyName: "Test Provider"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Provision(ctx, Consumer{Issuer: issuer, Subject: "down"}, "cid", []Resource{widgets})
	if err == nil || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), "provider namespace") {
		t.Fatalf("API server down: %v", err)
	}
}

// Unbind revokes the issued kubeconfig at once and deletes the namespace;
// a later bind of the same identity starts afresh once it is gone.
func TestUnbind(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p := newProvisioner(t, e, e.backend, ScopeNamespaced)
	c := Consumer{Issuer: issuer, Subject: "leaving"}
	resp, err := p.Provision(ctx, c, "cid", []Resource{widgets})
	if err != nil {
		t.Fatal(err)
	}
	kube, _, ns := consumerClients(t, resp.Kubeconfig)
	if _, err := kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.Unbind(ctx, c, "cid"); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	testutil.Await(t, "the issued token stops working", func() bool {
		_, err := kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsUnauthorized(err)
	})
	t.Logf("the token was rejected %s after Unbind", time.Since(revoked).Round(10*time.Millisecond))
	got, err := e.kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err == nil && got.DeletionTimestamp == nil {
		t.Fatal("namespace not being deleted")
	}
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err == nil {
		// Still terminating (the namespace controller empties it): a bind
		// now says so instead of reusing it.
		if _, err := p.Provision(ctx, c, "cid", []Resource{widgets}); !errors.Is(err, ErrNamespaceTerminating) {
			t.Errorf("bind while terminating: %v", err)
		}
	}
	if err := p.Unbind(ctx, Consumer{Issuer: issuer, Subject: "never-bound"}, "cid"); !errors.Is(err, ErrNotBound) {
		t.Errorf("Unbind of an unknown consumer: %v", err)
	}
}

// The same over a real network cut: the bind goes through a TCP proxy that
// is shut (every connection dropped, new ones refused) as soon as a given
// object appears, i.e. in the middle of the bind.
func TestProvisionNetworkCutMidway(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	healthy := newProvisioner(t, e, e.backend, ScopeNamespaced)
	upstream, err := url.Parse(e.backend.Host)
	if err != nil {
		t.Fatal(err)
	}
	triggers := []struct {
		name   string
		exists func(ns string) error
	}{
		{"namespace", func(ns string) error {
			_, err := e.kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return err
		}},
		{"service account", func(ns string) error {
			_, err := e.kube.CoreV1().ServiceAccounts(ns).Get(ctx, ServiceAccountName, metav1.GetOptions{})
			return err
		}},
		{"token secret", func(ns string) error {
			l, err := e.kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelCredential + "=" + CredentialToken})
			if err == nil && len(l.Items) == 0 {
				err = apierrors.NewNotFound(corev1.Resource("secrets"), "token")
			}
			return err
		}},
	}
	for _, trig := range triggers {
		t.Run("cut when the "+trig.name+" appears", func(t *testing.T) {
			for attempt := 0; ; attempt++ {
				if attempt == 5 {
					t.Fatal("no bind was ever cut midway")
				}
				addr := freeAddr(t)
				px := startProxy(t, addr, upstream.Host)
				cfg := rest.CopyConfig(e.backend)
				cfg.Host = "https://" + addr
				cfg.ServerName = "127.0.0.1"
				p, err := NewProvisioner(cfg, healthy.catalog, Config{NamespacePrefix: "kb-", ProviderPrettyName: "Test Provider"})
				if err != nil {
					t.Fatal(err)
				}
				c := Consumer{Issuer: issuer, Subject: fmt.Sprintf("network-cut-%s-%d", trig.name, attempt)}
				ns := p.Namespace(c, "cid")
				stop := make(chan struct{})
				cutDone := make(chan struct{})
				go func() {
					defer close(cutDone)
					defer px.close()
					for {
						select {
						case <-stop:
							return
						default:
						}
						if trig.exists(ns) == nil {
							return
						}
						time.Sleep(2 * time.Millisecond)
					}
				}()
				_, err = p.Provision(ctx, c, "cid", []Resource{widgets})
				close(stop)
				<-cutDone
				if err == nil {
					t.Logf("attempt %d finished before the cut; again", attempt)
					continue
				}
				t.Logf("cut midway: %v", err)
				if !strings.Contains(err.Error(), ns) {
					t.Errorf("the error does not name the namespace: %v", err)
				}
				resp, err := healthy.Provision(ctx, c, "cid", []Resource{widgets})
				if err != nil {
					t.Fatalf("the bind after the cut failed: %v", err)
				}
				kube, _, got := consumerClients(t, resp.Kubeconfig)
				if got != ns {
					t.Fatalf("namespace %q, want %q", got, ns)
				}
				if _, err := kube.CoreV1().Secrets(ns).Get(ctx, KubeconfigSecretName, metav1.GetOptions{}); err != nil {
					t.Fatal(err)
				}
				return
			}
		})
	}
}

// An API server that accepts connections and never answers cannot hang a
// bind: it ends with a timeout error.
func TestProvisionHungServerTimesOut(t *testing.T) {
	e := setup(t)
	healthy := newProvisioner(t, e, e.backend, ScopeNamespaced)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	cfg := rest.CopyConfig(e.backend)
	cfg.Host = "https://" + l.Addr().String()
	p, err := NewProvisioner(cfg, healthy.catalog, Config{NamespacePrefix: "kb-", ProviderPrettyName: "Test Provider", Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = p.Provision(context.Background(), Consumer{Issuer: issuer, Subject: "hung"}, "cid", []Resource{widgets})
	if err == nil || !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("got %v, want a deadline error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %s", d)
	}
}

// The requests a bind sends to the API server: the user's namespaces are
// listed three times for a new cluster (the cap's check and, once made,
// the labelled ones again) and once for a returning one, which finds its
// namespace among them and lists its exports once (what is bound there); a namespace the bind made holds no kubeconfig
// Secret to read, a returning one's is read once to retire its token.
func TestProvisionRequests(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	rc := rest.CopyConfig(e.backend)
	counter := apirequests.New("test", "requests")
	rc.Wrap(counter.Wrap)
	p := newProvisioner(t, e, rc, ScopeNamespaced)
	c := Consumer{Issuer: issuer, Subject: "counted"}
	// The backend's own user name is found once per process.
	if _, err := p.backendUser(ctx); err != nil {
		t.Fatal(err)
	}
	bind := func() map[apirequests.Key]int64 {
		before := counter.Counts()
		if _, err := p.Provision(ctx, c, "counted-cluster", []Resource{widgets}); err != nil {
			t.Fatal(err)
		}
		after := counter.Counts()
		var total int64
		for k, v := range after {
			after[k] = v - before[k]
			total += after[k]
		}
		t.Logf("%d requests: %v", total, after)
		return after
	}
	for _, tc := range []struct {
		what  string
		want  map[apirequests.Key]int64
		count map[apirequests.Key]int64
	}{
		{"a new cluster", map[apirequests.Key]int64{
			{Verb: "list", Resource: "namespaces"}: 3, {Verb: "create", Resource: "namespaces"}: 1,
			{Verb: "get", Resource: "namespaces"}: 0, {Verb: "get", Resource: "secrets"}: 0, {Verb: "patch", Resource: "secrets"}: 0,
			{Verb: "list", Resource: "apiserviceexports"}: 0,
		}, bind()},
		{"a returning one", map[apirequests.Key]int64{
			{Verb: "list", Resource: "namespaces"}: 1, {Verb: "create", Resource: "namespaces"}: 0,
			{Verb: "get", Resource: "namespaces"}: 0, {Verb: "get", Resource: "secrets"}: 1, {Verb: "patch", Resource: "secrets"}: 1,
			{Verb: "list", Resource: "apiserviceexports"}: 1,
		}, bind()},
	} {
		for k, want := range tc.want {
			if got := tc.count[k]; got != want {
				t.Errorf("%s: %d %s %s, want %d", tc.what, got, k.Verb, k.Resource, want)
			}
		}
	}
}

// A returning consumer whose namespace binds a resource through one
// export may bind it again through a request of that name only: a bind
// that would make another request for it is refused before anything is
// made or issued (no token, the kubeconfig Secret as it was), as the
// backend's least-privilege identity, naming the export that binds it.
func TestProvisionAlreadyBound(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p := newProvisioner(t, e, e.backend, ScopeCluster)
	c := Consumer{Issuer: issuer, Subject: "already-bound"}
	if _, err := p.Provision(ctx, c, "cid", []Resource{widgets}); err != nil {
		t.Fatal(err)
	}
	ns := p.Namespace(c, "cid")
	// What the controllers make once the request widgets.example.com succeeded.
	export := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha2", "kind": "APIServiceExport",
		"metadata": map[string]any{"name": "widgets.example.com"},
		"spec": map[string]any{"informerScope": "Namespaced",
			"resources": []any{map[string]any{"group": "example.com", "resource": "widgets"}}},
	}}
	admin := dynamic.NewForConfigOrDie(e.admin)
	if _, err := admin.Resource(kbresources.APIServiceExportsV1alpha2).Namespace(ns).Create(ctx, export, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	state := func() (int, string) {
		tokens, err := e.kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelCredential + "=" + CredentialToken})
		if err != nil {
			t.Fatal(err)
		}
		kc, err := e.kube.CoreV1().Secrets(ns).Get(ctx, KubeconfigSecretName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return len(tokens.Items), kc.ResourceVersion
	}
	tokens, kc := state()

	for _, picked := range [][]Resource{
		{{Group: "example.com", Resource: "widgets", Request: "widget-kit"}},
		{{Group: "example.com", Resource: "gadgets", Request: "widget-kit"}, {Group: "example.com", Resource: "widgets", Request: "widget-kit"}},
	} {
		_, err := p.Provision(ctx, c, "cid", picked)
		var bound *AlreadyBoundError
		if !errors.As(err, &bound) || bound.By != "widgets.example.com" || bound.Request != "widget-kit" || bound.Resource.String() != "widgets.example.com" {
			t.Errorf("Provision(%+v): %v, want widgets refused as bound by widgets.example.com", picked, err)
		}
		if n, v := state(); n != tokens || v != kc {
			t.Errorf("a refused bind issued a token or changed the kubeconfig: %d token Secrets (was %d), kubeconfig version %s (was %s)", n, tokens, v, kc)
		}
	}
	// Another consumer is not bound by this namespace's exports.
	if _, err := p.Provision(ctx, Consumer{Issuer: issuer, Subject: "someone-else"}, "cid", []Resource{{Group: "example.com", Resource: "widgets", Request: "widget-kit"}}); err != nil {
		t.Errorf("another consumer: %v", err)
	}
	// The rebind of the same request, and a resource not bound yet.
	if _, err := p.Provision(ctx, c, "cid", []Resource{widgets, {Group: "example.com", Resource: "gadgets", Request: "gadget-kit"}}); err != nil {
		t.Fatalf("rebind: %v", err)
	}
	if n, _ := state(); n != tokens+1 {
		t.Errorf("the rebind left %d token Secrets, want %d", n, tokens+1)
	}
}
