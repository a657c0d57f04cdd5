package consumer

import (
	"context"
	"net/url"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/client/apply"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/pkg/protocol"
)

// One provider (control plane, identity provider, backend) and one
// consumer cluster serve all steps, in order: later steps rebind into the
// cluster the first one bound. They bind through v1alpha1 (--protocol),
// as the released konnector v0.4.8 they run needs.
func TestBind(t *testing.T) {
	e := startEnv(t)
	var first *bound
	if !t.Run("PollFlowEndToEnd", func(t *testing.T) { first = testPollFlow(t, e) }) {
		t.FailNow()
	}
	t.Run("RebindFromAnotherMachine", func(t *testing.T) { testRebind(t, e, first) })
	t.Run("RefusesAnotherProvidersBinding", func(t *testing.T) { testRefusesOtherBinding(t, e) })
	t.Run("RequestFailedByProvider", func(t *testing.T) { testRequestFailed(t, e) })
	t.Run("UnreachableConsumerCluster", func(t *testing.T) { testUnreachable(t, e) })
	t.Run("DryRun", func(t *testing.T) { testDryRun(t, e) })
	t.Run("CallbackFlow", func(t *testing.T) { testCallbackFlow(t, e, first) })
	t.Run("ReleasedCLI", func(t *testing.T) { testReleasedCLI(t, e) })
}

// bound is what the first bind left.
type bound struct {
	providerNamespace string
	secretName        string
	clusterID         string
}

var namespaceLine = regexp.MustCompile(`in namespace (\S+) on `)

func providerNamespaceOf(t *testing.T, c *procs.Command) string {
	t.Helper()
	m := namespaceLine.FindStringSubmatch(c.Stderr.String())
	if m == nil {
		t.Fatalf("the command did not name the provider namespace:\n%s", c.Stderr.String())
	}
	return m[1]
}

func testPollFlow(t *testing.T, e *env) *bound {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	consumerKube := kubernetes.NewForConfigOrDie(e.consumer.AdminConfig())
	consumerDyn := dynamic.NewForConfigOrDie(e.consumer.AdminConfig())
	providerDyn := dynamic.NewForConfigOrDie(e.provider.AdminConfig())

	// As a kubectl plugin: kubectl finds kubectl-bind_poll on PATH.
	c := runCLI(t, t.TempDir(), e.consumer.BinDir()+"/kubectl",
		[]string{"bind-poll", "--protocol", "v1alpha1", "--kubeconfig", e.consumer.AdminKubeconfigPath(), "--wait-timeout", "3m", e.exportURL})
	u := c.URL(t)
	if !strings.HasPrefix(u, e.baseURL+"/authorize?") {
		t.Errorf("printed URL %s is not the provider's poll authentication URL", u)
	}
	pressed := bindInBrowser(t, e, u, exampleapis.MangoDB.Name(), exampleapis.Redis.Name())
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	if code := protocol.ConfirmationCode(pu.Query().Get("s")); !strings.Contains(c.Stderr.String(), "the code "+code+"; continue only if it matches") {
		t.Errorf("confirmation code %s (shown on the page) not printed next to the URL:\n%s", code, c.Stderr.String())
	}
	k := startKonnectorWhenReady(t, e, c)
	if code := c.Wait(t, 5*time.Minute); code != 0 {
		t.Fatalf("exit code %d:\n%s", code, c.Stderr.String())
	}
	t.Logf("wall time from pressing Bind to the command exiting with the APIs bound: %s", c.Ended.Sub(pressed).Round(time.Millisecond))
	t.Logf("command output:\n%s", c.Stderr.String())
	ns := providerNamespaceOf(t, c)
	if !strings.HasPrefix(ns, namespacePrefix) {
		t.Errorf("provider namespace %q lacks the backend's prefix", ns)
	}

	// The requests reached Succeeded on the provider.
	for _, a := range []exampleapis.API{exampleapis.MangoDB, exampleapis.Redis} {
		r, err := providerDyn.Resource(requestGVR).Namespace(ns).Get(ctx, a.Name(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("request %s on the provider: %v", a.Name(), err)
		}
		if phase := nested(r, "status", "phase"); phase != "Succeeded" {
			t.Errorf("request %s is %q", a.Name(), phase)
		}
	}
	// One kubeconfig Secret; both bindings name it.
	secrets := kubeconfigSecrets(t, consumerKube)
	if len(secrets) != 1 || !strings.HasPrefix(secrets[0], apply.KubeconfigPrefix) {
		t.Fatalf("kubeconfig Secrets in kube-bind: %v, want one kubeconfig-*", secrets)
	}
	for _, a := range []exampleapis.API{exampleapis.MangoDB, exampleapis.Redis} {
		b, err := consumerDyn.Resource(bindingGVR).Get(ctx, a.Name(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("APIServiceBinding %s: %v", a.Name(), err)
		}
		if nested(b, "spec", "kubeconfigSecretRef", "name") != secrets[0] || nested(b, "spec", "kubeconfigSecretRef", "namespace") != apply.Namespace ||
			nested(b, "spec", "kubeconfigSecretRef", "key") != apply.KubeconfigKey {
			t.Errorf("APIServiceBinding %s points at %v", a.Name(), b.Object["spec"])
		}
	}
	// The cluster identity is kept in the cluster.
	key, _ := apply.ProviderKey(e.exportURL)
	idSecret, err := consumerKube.CoreV1().Secrets(apply.Namespace).Get(ctx, apply.IdentitySecretName(key), metav1.GetOptions{})
	if err != nil || len(idSecret.Data["clusterID"]) == 0 {
		t.Fatalf("no cluster identity kept: %v", err)
	}

	// The konnector creates the bound CRDs, owned by their bindings.
	crds := apiextensionsclient.NewForConfigOrDie(e.consumer.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()
	testutil.AwaitWithin(t, 2*time.Minute, 200*time.Millisecond, "the konnector to create the bound CRDs", func() (bool, error) {
		for _, a := range []exampleapis.API{exampleapis.MangoDB, exampleapis.Redis} {
			crd, err := crds.Get(ctx, a.Name(), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if len(crd.OwnerReferences) == 0 || crd.OwnerReferences[0].Kind != "APIServiceBinding" {
				return false, nil
			}
		}
		return true, nil
	})

	// A MangoDB made in the consumer cluster appears on the provider, and
	// a status set there comes back.
	upstream := konnector.SyncsBothWays(t, e.consumer.AdminConfig(), e.provider.AdminConfig(), exampleapis.MangoDB, "db1", "")
	// It lives in a namespace the provider made for this consumer.
	nsList, err := providerDyn.Resource(bindingNS).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inOurs := upstream.GetNamespace() == ns
	for _, n := range nsList.Items {
		inOurs = inOurs || nested(&n, "status", "namespace") == upstream.GetNamespace()
	}
	if !inOurs {
		t.Errorf("db1 is in provider namespace %s, not one of the consumer's (%s and its APIServiceNamespaces)", upstream.GetNamespace(), ns)
	}

	// Deleting it downstream deletes it upstream.
	mango := exampleapis.MangoDB.GVR()
	if err := consumerDyn.Resource(mango).Namespace("default").Delete(ctx, "db1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.AwaitWithin(t, 2*time.Minute, 200*time.Millisecond, "db1 to be deleted upstream", func() (bool, error) {
		_, err := providerDyn.Resource(mango).Namespace(upstream.GetNamespace()).Get(ctx, "db1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})

	// The ClusterBinding gets heartbeats.
	testutil.AwaitWithin(t, time.Minute, 200*time.Millisecond, "a heartbeat on the ClusterBinding", func() (bool, error) {
		cb, err := providerDyn.Resource(clusterGVR).Namespace(ns).Get(ctx, "cluster", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return nested(cb, "status", "lastHeartbeatTime") != "", nil
	})

	if log := k.Log(); strings.Contains(strings.ToLower(log), "forbidden") {
		t.Errorf("the konnector was refused something with the RBAC the command wrote:\n%s", testutil.GrepLines(log, "orbidden"))
	}
	if done, err := k.Exited(); done {
		t.Errorf("the konnector exited: %v", err)
	}
	return &bound{providerNamespace: ns, secretName: secrets[0], clusterID: string(idSecret.Data["clusterID"])}
}

// A second machine (another HOME, nothing local) binding into the same
// cluster lands in the same provider namespace and updates the Secret;
// -o json prints the APIServiceBinding as the cluster has it.
func testRebind(t *testing.T, e *env, first *bound) {
	consumerKube := kubernetes.NewForConfigOrDie(e.consumer.AdminConfig())
	c := runCLI(t, t.TempDir(), cliBinary, []string{"--protocol", "v1alpha1", "--kubeconfig", e.consumer.AdminKubeconfigPath(), "-o", "json", e.exportURL})
	u := c.URL(t)
	if !strings.Contains(c.Stderr.String(), "presenting the kept cluster ID "+first.clusterID) {
		t.Errorf("the command does not present the kept cluster ID %s:\n%s", first.clusterID, c.Stderr.String())
	}
	bindInBrowser(t, e, u, exampleapis.MangoDB.Name())
	if code := c.Wait(t, 5*time.Minute); code != 0 {
		t.Fatalf("exit code %d:\n%s", code, c.Stderr.String())
	}
	t.Logf("command output:\n%s", c.Stderr.String())
	if ns := providerNamespaceOf(t, c); ns != first.providerNamespace {
		t.Errorf("rebind landed in provider namespace %s, want %s", ns, first.providerNamespace)
	}
	if secrets := kubeconfigSecrets(t, consumerKube); len(secrets) != 1 || secrets[0] != first.secretName {
		t.Errorf("kubeconfig Secrets after the rebind: %v, want only %s", secrets, first.secretName)
	}
	if !regexp.MustCompile(`kubeconfig Secret: (updated|kube-bind/\S+ up to date) `).MatchString(c.Stderr.String()) &&
		!strings.Contains(c.Stderr.String(), "kubeconfig Secret: updated kube-bind/"+first.secretName) {
		t.Errorf("the command did not report updating the Secret:\n%s", c.Stderr.String())
	}
	var printed unstructured.UnstructuredList
	if err := printed.UnmarshalJSON(c.Stdout.Bytes()); err != nil || len(printed.Items) != 1 {
		t.Fatalf("-o json printed %s (%v), want a List of one APIServiceBinding", c.Stdout.String(), err)
	}
	if b := printed.Items[0]; b.GetKind() != "APIServiceBinding" || b.GetName() != exampleapis.MangoDB.Name() || b.GetUID() == "" ||
		nested(&b, "spec", "kubeconfigSecretRef", "name") != first.secretName {
		t.Errorf("-o json printed %s, want APIServiceBinding %s from the cluster using Secret %s", c.Stdout.String(), exampleapis.MangoDB.Name(), first.secretName)
	}
}

// An APIServiceBinding of another provider is not taken over, and nothing
// is created for the refused bind.
func testRefusesOtherBinding(t *testing.T, e *env) {
	ctx := context.Background()
	consumerDyn := dynamic.NewForConfigOrDie(e.consumer.AdminConfig())
	providerDyn := dynamic.NewForConfigOrDie(e.provider.AdminConfig())
	other := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha1", "kind": "APIServiceBinding",
		"metadata": map[string]any{"name": queueAPI.Name()},
		"spec": map[string]any{"kubeconfigSecretRef": map[string]any{
			"namespace": apply.Namespace, "name": "kubeconfig-other", "key": apply.KubeconfigKey}},
	}}
	if _, err := consumerDyn.Resource(bindingGVR).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := runCLI(t, t.TempDir(), cliBinary, []string{"--protocol", "v1alpha1", "--kubeconfig", e.consumer.AdminKubeconfigPath(), e.exportURL})
	bindInBrowser(t, e, c.URL(t), queueAPI.Name())
	if code := c.Wait(t, 3*time.Minute); code != 1 {
		t.Fatalf("exit code %d, want 1:\n%s", code, c.Stderr.String())
	}
	if !strings.Contains(c.Stderr.String(), "not from this service provider") || !strings.Contains(c.Stderr.String(), "kubeconfig-other") {
		t.Errorf("the refusal does not say whose binding it is:\n%s", c.Stderr.String())
	}
	got, err := consumerDyn.Resource(bindingGVR).Get(ctx, queueAPI.Name(), metav1.GetOptions{})
	if err != nil || nested(got, "spec", "kubeconfigSecretRef", "name") != "kubeconfig-other" {
		t.Errorf("the other provider's binding changed: %v %v", err, got)
	}
	ns := providerNamespaceOf(t, c)
	if _, err := providerDyn.Resource(requestGVR).Namespace(ns).Get(ctx, queueAPI.Name(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a request for the refused API was created on the provider: %v", err)
	}
}

// A request the provider fails (the API was unexported between the pick
// and the request) ends the command with exit 1 and the provider's
// message.
func testRequestFailed(t *testing.T, e *env) {
	ctx := context.Background()
	providerDyn := dynamic.NewForConfigOrDie(e.provider.AdminConfig())
	crds := apiextensionsclient.NewForConfigOrDie(e.provider.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()
	c := runCLI(t, t.TempDir(), cliBinary, []string{"--protocol", "v1alpha1", "--kubeconfig", e.consumer.AdminKubeconfigPath(), e.exportURL})
	u := c.URL(t)
	// Hold the command before Bind, so the API is unexported before it
	// gets the answer and creates the request.
	bindInBrowserThen(t, e, u, func() {
		if err := c.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}, bucketAPI.Name())
	patch := []byte(`{"metadata":{"labels":{"` + binding.ExportedLabel + `":null}}}`)
	if _, err := crds.Patch(ctx, bucketAPI.Name(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		relabel := []byte(`{"metadata":{"labels":{"` + binding.ExportedLabel + `":"true"}}}`)
		_, _ = crds.Patch(context.Background(), bucketAPI.Name(), types.MergePatchType, relabel, metav1.PatchOptions{})
	})
	time.Sleep(2 * time.Second) // let the provider's caches see the label go
	if err := c.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := c.Wait(t, 3*time.Minute); code != 1 {
		t.Fatalf("exit code %d, want 1:\n%s", code, c.Stderr.String())
	}
	t.Logf("command output:\n%s", c.Stderr.String())
	ns := providerNamespaceOf(t, c)
	r, err := providerDyn.Resource(requestGVR).Namespace(ns).Get(ctx, bucketAPI.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the request: %v", err)
	}
	msg := nested(r, "status", "terminalMessage")
	if nested(r, "status", "phase") != "Failed" || msg == "" {
		t.Fatalf("request status %v, want Failed with a message", r.Object["status"])
	}
	if !strings.Contains(c.Stderr.String(), msg) || !strings.Contains(c.Stderr.String(), "failed APIServiceExportRequest "+bucketAPI.Name()) {
		t.Errorf("the command does not pass on the provider's message %q:\n%s", msg, c.Stderr.String())
	}
	consumerDyn := dynamic.NewForConfigOrDie(e.consumer.AdminConfig())
	if _, err := consumerDyn.Resource(bindingGVR).Get(ctx, bucketAPI.Name(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("an APIServiceBinding was made for the failed request: %v", err)
	}
}

// An unreachable consumer cluster is reported before any browser step.
func testUnreachable(t *testing.T, e *env) {
	dir := t.TempDir()
	kc := controlplane.KubeconfigFile(t, e.consumer.ConfigForToken("x"))
	data := strings.Replace(readFile(t, kc), e.consumer.Host(), "https://127.0.0.1:1", 1)
	writeFileT(t, kc, data)
	c := runCLI(t, dir, cliBinary, []string{"--protocol", "v1alpha1", "--kubeconfig", kc, e.exportURL})
	if code := c.Wait(t, time.Minute); code != 1 {
		t.Fatalf("exit code %d, want 1:\n%s", code, c.Stderr.String())
	}
	if !strings.Contains(c.Stderr.String(), "does not answer") || strings.Contains(c.Stderr.String(), e.baseURL) {
		t.Errorf("want a clear error before any URL:\n%s", c.Stderr.String())
	}
}

// The callback flow of our command against the backend's OAuth2CodeGrant
// method, presenting the kept cluster ID: same provider namespace.
func testCallbackFlow(t *testing.T, e *env, first *bound) {
	ctx := context.Background()
	c := runCLI(t, t.TempDir(), cliBinary, []string{"--protocol", "v1alpha1", "--kubeconfig", e.consumer.AdminKubeconfigPath(), "--flow", "callback", e.exportURL})
	u := c.URL(t)
	if !strings.Contains(u, "p=") || !strings.Contains(u, "c="+first.clusterID) {
		t.Errorf("callback URL %s lacks the port or the kept cluster ID %s", u, first.clusterID)
	}
	bindInBrowser(t, e, u, widgetAPI.Name())
	if code := c.Wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("exit code %d:\n%s", code, c.Stderr.String())
	}
	if ns := providerNamespaceOf(t, c); ns != first.providerNamespace {
		t.Errorf("callback bind landed in %s, want %s", ns, first.providerNamespace)
	}
	consumerDyn := dynamic.NewForConfigOrDie(e.consumer.AdminConfig())
	b, err := consumerDyn.Resource(bindingGVR).Get(ctx, widgetAPI.Name(), metav1.GetOptions{})
	if err != nil || nested(b, "spec", "kubeconfigSecretRef", "name") != first.secretName {
		t.Errorf("binding %s: %v %v", widgetAPI.Name(), err, b)
	}
}

// --dry-run opens no session at the provider, changes nothing on either
// side, and prints what the bind would write in the cluster before the
// APIs are picked: here the konnector's RBAC, naming the APIs bound so far.
func testDryRun(t *testing.T, e *env) {
	ctx := context.Background()
	consumerKube := kubernetes.NewForConfigOrDie(e.consumer.AdminConfig())
	providerKube := kubernetes.NewForConfigOrDie(e.provider.AdminConfig())
	secretsBefore := kubeconfigSecrets(t, consumerKube)
	roleBefore, err := consumerKube.RbacV1().ClusterRoles().Get(ctx, apply.KonnectorRoleName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	providerBefore := providerState(t, providerKube)

	c := runCLI(t, t.TempDir(), cliBinary, []string{"--protocol", "v1alpha1", "--kubeconfig", e.consumer.AdminKubeconfigPath(), "--dry-run", "-o", "yaml", e.exportURL})
	if code := c.Wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("exit code %d:\n%s", code, c.Stderr.String())
	}
	t.Logf("dry run output:\n%s\nstdout:\n%s", c.Stderr.String(), c.Stdout.String())
	out := c.Stdout.String()
	for _, want := range []string{"kind: List", "kind: ClusterRole", "kind: ServiceAccount", "- " + exampleapis.MangoDB.Plural + "\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(c.Stderr.String(), e.baseURL+"/authorize") || !strings.Contains(c.Stderr.String(), "no session was opened") {
		t.Errorf("the dry run showed a URL to bind at, or did not say what it did:\n%s", c.Stderr.String())
	}

	if after := providerState(t, providerKube); after != providerBefore {
		t.Errorf("the dry run changed the provider's namespaces or Secrets:\n%s\n->\n%s", providerBefore, after)
	}
	if after := kubeconfigSecrets(t, consumerKube); strings.Join(after, ",") != strings.Join(secretsBefore, ",") {
		t.Errorf("kubeconfig Secrets changed in a dry run: %v -> %v", secretsBefore, after)
	}
	roleAfter, err := consumerKube.RbacV1().ClusterRoles().Get(ctx, apply.KonnectorRoleName, metav1.GetOptions{})
	if err != nil || roleAfter.ResourceVersion != roleBefore.ResourceVersion {
		t.Errorf("the dry run changed the konnector's ClusterRole (%v)", err)
	}
}

// providerState names the provider's namespaces and the Secrets of those
// the backend made for consumers.
func providerState(t *testing.T, kube kubernetes.Interface) string {
	t.Helper()
	ctx := context.Background()
	nss, err := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ns := range nss.Items {
		names = append(names, ns.Name)
		if !strings.HasPrefix(ns.Name, namespacePrefix) {
			continue
		}
		secrets, err := kube.CoreV1().Secrets(ns.Name).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range secrets.Items {
			names = append(names, ns.Name+"/"+s.Name)
		}
	}
	return strings.Join(names, "\n")
}

// The released v0.4.8 CLI still binds with the backend: its dry run, then
// its apiservice step, as its README says.
func testReleasedCLI(t *testing.T, e *env) {
	bin := konnector.ReleasedBinary(t, "kubectl-bind")
	home := t.TempDir()
	c := runCLI(t, home, bin, []string{"bind", e.exportURL, "--dry-run", "--kubeconfig", e.consumer.AdminKubeconfigPath()})
	u := c.URL(t)
	bindInBrowser(t, e, u, gadgetAPI.Name())
	if code := c.Wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("released CLI's dry run: exit %d\nstdout:\n%s", code, c.Stdout.String())
	}
	m := regexp.MustCompile(`secret kube-bind/(kubeconfig-\w+) for host \S+, namespace (\S+)`).FindStringSubmatch(c.Stderr.String())
	if m == nil || !strings.Contains(c.Stdout.String(), "kind: APIServiceExportRequest") {
		t.Fatalf("the released CLI's dry run printed no request or named no Secret:\nstdout:\n%s", c.Stdout.String())
	}
	secret, ns := m[1], m[2]
	reqFile := home + "/request.yaml"
	writeFileT(t, reqFile, c.Stdout.String())
	step := runCLI(t, home, bin, []string{"bind", "apiservice",
		"--remote-kubeconfig-namespace", apply.Namespace, "--remote-kubeconfig-name", secret,
		"-f", reqFile, "--kubeconfig", e.consumer.AdminKubeconfigPath(), "--skip-konnector"})
	if code := step.Wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("released CLI's apiservice step: exit %d\nstdout:\n%s", code, step.Stdout.String())
	}
	ctx := context.Background()
	providerDyn := dynamic.NewForConfigOrDie(e.provider.AdminConfig())
	r, err := providerDyn.Resource(requestGVR).Namespace(ns).Get(ctx, gadgetAPI.Name(), metav1.GetOptions{})
	if err != nil || nested(r, "status", "phase") != "Succeeded" {
		t.Fatalf("request %s/%s on the provider: %v %v", ns, gadgetAPI.Name(), err, r)
	}
	consumerDyn := dynamic.NewForConfigOrDie(e.consumer.AdminConfig())
	b, err := consumerDyn.Resource(bindingGVR).Get(ctx, gadgetAPI.Name(), metav1.GetOptions{})
	if err != nil || nested(b, "spec", "kubeconfigSecretRef", "name") != secret {
		t.Fatalf("the released CLI's APIServiceBinding: %v %v", err, b)
	}
}
