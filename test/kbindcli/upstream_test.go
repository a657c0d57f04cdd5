package kbindcli

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
	"github.com/kbprovider/backend/internal/testutil/chromium"
)

// UpstreamSrcEnv names an upstream kube-bind source tree at tag v0.8.2
// (e.g. `git archive v0.8.2 | tar x` of github.com/kbind-dev/kbind). The
// benchmark of upstream's own backend reads its CRDs from there at run
// time: upstream's backend installs none itself, and we do not copy them.
const UpstreamSrcEnv = "KUBE_BIND_UPSTREAM_SRC"

// upstreamCRDs are the provider-side CRDs upstream's backend v0.8.2 uses
// (the set its e2e suite applies), under deploy/crd of its tree.
var upstreamCRDs = []string{
	"kube-bind.io_clusterbindings.yaml",
	"kube-bind.io_apiserviceexports.yaml",
	"kube-bind.io_apiservicenamespaces.yaml",
	"kube-bind.io_apiserviceexportrequests.yaml",
	"kube-bind.io_boundschemas.yaml",
	"kube-bind.io_apiserviceexporttemplates.yaml",
	"kube-bind.io_collections.yaml",
	"kube-bind.io_clusters.yaml",
}

var templateGVR = schema.GroupVersionResource{Group: "kube-bind.io", Version: "v1alpha2", Resource: "apiserviceexporttemplates"}

// upstreamEnv is upstream's backend v0.8.2 with clusters of its own: its
// CRDs and ours are for the same group, so it needs a provider control
// plane apart, and a consumer apart keeps the bindings of the two
// backends from meeting.
type upstreamEnv struct {
	provider *controlplane.ControlPlane
	consumer *controlplane.ControlPlane
	baseURL  string
	// home holds the kube-bind config of `kubectl-bind login` to it.
	home string
}

// upstreamSrc returns the tree UpstreamSrcEnv names, failing when it is
// not set or lacks the CRDs.
func upstreamSrc(tb testing.TB) string {
	tb.Helper()
	src := os.Getenv(UpstreamSrcEnv)
	if src == "" {
		tb.Fatalf("%s is not set: it must name an upstream kube-bind source tree at tag v0.8.2, whose deploy/crd/*.yaml "+
			"the benchmark of upstream's own backend applies (e.g. mkdir /tmp/kbind && git --git-dir=<kbind repo> archive v0.8.2 | tar x -C /tmp/kbind)", UpstreamSrcEnv)
	}
	for _, f := range upstreamCRDs {
		if _, err := os.Stat(filepath.Join(src, "deploy", "crd", f)); err != nil {
			tb.Fatalf("%s=%s is not an upstream kube-bind tree at v0.8.2: %v", UpstreamSrcEnv, src, err)
		}
	}
	return src
}

// startUpstream starts, for the test, a provider control plane (with the
// clusterrole-aggregation controller: upstream hands the konnector its
// rights through aggregated ClusterRoles) holding upstream's CRDs, an
// identity provider, upstream's backend v0.8.2 on it, a consumer control
// plane with the konnector v0.8.2, and logs alice in with kubectl-bind.
func startUpstream(tb testing.TB, src string) *upstreamEnv {
	tb.Helper()
	provider := controlplane.Own(tb, controlplane.Options{ExtraControllers: []string{"clusterrole-aggregation-controller"}})
	consumer := controlplane.Own(tb, controlplane.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	crds := apiextensionsclient.NewForConfigOrDie(provider.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()
	for _, f := range upstreamCRDs {
		data, err := os.ReadFile(filepath.Join(src, "deploy", "crd", f))
		if err != nil {
			tb.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(data, &crd); err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		if _, err := crds.Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
			tb.Fatalf("applying upstream's %s: %v", f, err)
		}
		if err := exampleapis.WaitEstablished(ctx, crds, crd.Name); err != nil {
			tb.Fatal(err)
		}
	}

	caFile := filepath.Join(tb.TempDir(), "provider-ca.crt")
	if err := os.WriteFile(caFile, provider.CAData(), 0o600); err != nil {
		tb.Fatal(err)
	}
	port := procs.FreePort(tb)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	idp := oidcprovider.Start(tb, oidcprovider.Options{RedirectURIs: []string{base + "/api/callback"}, Users: []oidcprovider.User{alice, mallory}})
	bin := konnector.ReleasedBinaryOf(tb, konnector.ReleasedV1alpha2, "backend")
	// Its /readyz is the web UI's index.html: it answers once the
	// backend listens.
	backendproc.StartBinary(tb, bin, base, []string{
		"--listen-address", fmt.Sprintf("127.0.0.1:%d", port),
		"--oidc-issuer-url", idp.IssuerURL,
		"--oidc-issuer-client-id", idp.ClientID,
		"--oidc-issuer-client-secret", idp.ClientSecret,
		"--oidc-callback-url", base + "/api/callback",
		"--oidc-allowed-groups", "binders",
		"--cookie-signing-key", procs.RandomKey(32),
		"--cookie-encryption-key", procs.RandomKey(32),
		"--kubeconfig", provider.AdminKubeconfigPath(),
		"--external-address", provider.Host(),
		"--external-ca-file", caFile,
		"--pretty-name", "Upstream v0.8.2",
	}, 90*time.Second)
	// Its controllers are up once the seeded Cluster got its RBAC for the
	// allowed groups.
	kube := kubernetes.NewForConfigOrDie(provider.AdminConfig())
	testutil.AwaitWithin(tb, time.Minute, 200*time.Millisecond, "upstream's backend to grant group binders", func() (bool, error) {
		_, err := kube.RbacV1().ClusterRoleBindings().Get(ctx, "kube-bind-oidc-user", metav1.GetOptions{})
		return err == nil, nil
	})

	konnector.StartReleased(tb, konnector.ReleasedV1alpha2, consumer.AdminKubeconfigPath(), provider.Host())
	home := tb.TempDir()
	chromium.LoginCLI(tb, konnector.ReleasedV1alpha2, home, base, alice)
	return &upstreamEnv{provider: provider, consumer: consumer, baseURL: base, home: home}
}

// offer makes api an exported CRD on upstream's provider (labelled
// kube-bind.io/exported=true, which is how upstream's backend picks the
// schemas it binds) and an APIServiceExportTemplate of it named
// api.Name(), what upstream's UI offers; it returns once the backend
// serves the template.
func (u *upstreamEnv) offer(tb testing.TB, api exampleapis.API) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	crds := apiextensionsclient.NewForConfigOrDie(u.provider.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()
	if _, err := crds.Create(ctx, exampleapis.CRD(api), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatal(err)
	}
	if err := exampleapis.WaitEstablished(ctx, crds, api.Name()); err != nil {
		tb.Fatal(err)
	}
	template := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha2", "kind": "APIServiceExportTemplate",
		"metadata": map[string]any{"name": api.Name()},
		"spec": map[string]any{
			"description": "Things of " + api.Group,
			"scope":       "Namespaced",
			"resources":   []any{map[string]any{"group": api.Group, "resource": api.Plural, "versions": []any{exampleapis.Version}}},
		},
	}}
	if _, err := dynamic.NewForConfigOrDie(u.provider.AdminConfig()).Resource(templateGVR).Create(ctx, template, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
}

// pressBindUpstream opens u (the URL plain kubectl-bind prints) in
// upstream's web UI, signs alice in, clicks Bind on the card of template,
// and presses the modal's Bind: the moment it returns. It waits until
// the UI has handed the result to the CLI's callback.
func pressBindUpstream(tb testing.TB, u, template string) time.Time {
	tb.Helper()
	q, err := url.Parse(u)
	if err != nil {
		tb.Fatal(err)
	}
	callback := q.Query().Get("redirect_url")
	br := chromium.New(tb)
	// The UI leaves its first page at once: no screenshot of it.
	br.AutoScreenshot = false
	if status := br.Open(u); status != http.StatusOK {
		tb.Fatalf("the URL led to status %d at %s", status, br.URL())
	}
	br.AutoScreenshot = true
	// The UI checks its session, and without one sends the browser to the
	// identity provider (or shows its Authenticate button).
	waitInBrowser(tb, br, "the identity provider's login page", `(() => {
  if (document.querySelector("#login")) return true;
  const b = document.querySelector("button.auth-btn:not([disabled])");
  if (b) b.click();
  return false;
})()`)
	chromium.SignIn(tb, br, alice)
	card := fmt.Sprintf(`[...document.querySelectorAll(".template-card")].filter(c => c.querySelector(".card-title")?.textContent.trim() === %q).map(c => c.querySelector("button.bind-btn"))[0]`, template)
	waitInBrowser(tb, br, "the card of template "+template, "!!("+card+")")
	br.Run(chromedp.Click(chromedp.JSPath(card), chromedp.NodeVisible))
	br.Run(chromedp.WaitVisible(chromedp.CSS("#bindingName")))
	// The UI fills in a name made of the template's.
	if !hasValue(br, "#bindingName") {
		br.Fill("#bindingName", strings.ReplaceAll(template, ".", "-"))
	}
	br.Screenshot("binding-modal")
	pressed := time.Now()
	br.Click(".modal-footer button.bind-btn")
	waitInBrowser(tb, br, "the UI to call the CLI back", fmt.Sprintf(`location.href.startsWith(%q)`, callback))
	if body := br.Text("body"); !strings.Contains(body, "Binding Completed Successfully") {
		tb.Fatalf("the CLI's callback answered:\n%s", body)
	}
	return pressed
}

// hasValue says whether the field has a value.
func hasValue(br *chromium.Browser, selector string) bool {
	v, err := chromedp.Run(br.Context(), chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).value`, selector)))
	return err == nil && v != ""
}

// waitInBrowser evaluates cond in the page every 50 ms until it is true
// (errors while a page is replaced are retried), for at most 30 s.
func waitInBrowser(tb testing.TB, br *chromium.Browser, what, cond string) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(br.Context(), 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](cond))
		cancel()
		if err == nil && ok {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	loc, _ := chromedp.Run(br.Context(), chromedp.Location())
	html, _ := chromedp.Run(br.Context(), chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	br.Screenshot("timeout")
	tb.Fatalf("browser: waited 30s for %s (last error: %v) at %s:\n%s", what, last, loc, html)
}
