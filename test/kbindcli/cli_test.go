package kbindcli

import (
	"context"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/chromium"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// TestReleasedCLI logs in with the released kubectl-bind v0.8.2, binds
// through both of its flows, and checks that the released konnector
// v0.8.2 syncs what was bound.
func TestReleasedCLI(t *testing.T) {
	e := startEnv(t)
	k := startKonnector(t, e)
	home := t.TempDir()
	login(t, e, home, alice)

	t.Run("template flow", func(t *testing.T) {
		c := runCLI(t, home, "apiservice", "--template-name", widgetAPI.Name(), "--name", "widgets",
			"--kubeconfig", e.consumer.AdminKubeconfigPath(), "--skip-konnector")
		if code := c.Wait(t, 3*time.Minute); code != 0 {
			t.Fatalf("kubectl-bind apiservice: exit %d", code)
		}
		expectBinding(t, e, "widgets")
		syncsBothWays(t, e, widgetAPI, "w1")
	})

	t.Run("browser flow", func(t *testing.T) {
		c := runCLI(t, home, "--kubeconfig", e.consumer.AdminKubeconfigPath(), "--skip-browser", "--skip-konnector")
		line := c.Line(t, func(s string) bool { return strings.Contains(s, "Please manually open: ") })
		u := line[strings.Index(line, "http"):]
		bindInBrowser(t, e, u, alice, gadgetAPI.Name())
		if code := c.Wait(t, 3*time.Minute); code != 0 {
			t.Fatalf("kubectl-bind: exit %d", code)
		}
		expectBinding(t, e, gadgetAPI.Name())
		syncsBothWays(t, e, gadgetAPI, "g1")
	})

	t.Run("template with a claim", func(t *testing.T) {
		ctx := context.Background()
		providerDyn := dynamic.NewForConfigOrDie(e.provider.AdminConfig())
		template := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "kube-bind.io/v1alpha2", "kind": "APIServiceExportTemplate",
			"metadata": map[string]any{"name": "sprockets-with-settings"},
			"spec": map[string]any{
				"description": "Sprockets, and the settings the provider keeps for them",
				"resources":   []any{map[string]any{"group": sprocketAPI.Group, "resource": sprocketAPI.Plural, "versions": []any{"v1alpha1"}}},
				"permissionClaims": []any{map[string]any{"group": "", "resource": "configmaps",
					"selector": map[string]any{"labelSelector": map[string]any{"matchLabels": map[string]any{"app": "sprockets"}}}}},
			},
		}}
		templates := schema.GroupVersionResource{Group: "kube-bind.io", Version: "v1alpha2", Resource: "apiserviceexporttemplates"}
		if _, err := providerDyn.Resource(templates).Create(ctx, template, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The template is offered once the backend's informer saw it.
		testutil.AwaitWithin(t, time.Minute, 200*time.Millisecond, "the template to be offered", func() (bool, error) {
			c := runCLI(t, home, "templates")
			c.Wait(t, time.Minute)
			return strings.Contains(c.Stdout.String(), "sprockets-with-settings"), nil
		})
		c := runCLI(t, home, "apiservice", "--template-name", "sprockets-with-settings", "--name", "sprockets",
			"--kubeconfig", e.consumer.AdminKubeconfigPath(), "--skip-konnector")
		if code := c.Wait(t, 3*time.Minute); code != 0 {
			t.Fatalf("kubectl-bind apiservice: exit %d", code)
		}
		expectBinding(t, e, "sprockets")
		syncsBothWays(t, e, sprocketAPI, "s1")

		// A ConfigMap the claim selects, made by the provider next to the
		// synced object, reaches the consumer's namespace.
		list, err := providerDyn.Resource(sprocketAPI.GVR()).List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 {
			t.Fatalf("sprockets on the provider: %v %d", err, len(list.Items))
		}
		kube := kubernetes.NewForConfigOrDie(e.provider.AdminConfig())
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "sprocket-settings", Namespace: list.Items[0].GetNamespace(), Labels: map[string]string{"app": "sprockets"}},
			Data:       map[string]string{"speed": "fast"},
		}
		if _, err := kube.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		consumerKube := kubernetes.NewForConfigOrDie(e.consumer.AdminConfig())
		testutil.AwaitWithin(t, 2*time.Minute, 200*time.Millisecond, "the claimed ConfigMap to reach the consumer", func() (bool, error) {
			got, err := consumerKube.CoreV1().ConfigMaps("default").Get(ctx, "sprocket-settings", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil && got.Data["speed"] == "fast", err
		})
	})

	t.Run("two offers of gizmos", func(t *testing.T) {
		// A template of gizmos next to the CRD's own offer: each would
		// become an export request for gizmos in the consumer's namespace,
		// so the page marks them, refuses a selection of both and the
		// CLI, still waiting, gets one binding once the user picks one.
		offerTemplate(t, e, home, "gizmos-with-settings", gizmoAPI)
		c := runCLI(t, home, "--kubeconfig", e.consumer.AdminKubeconfigPath(), "--skip-browser", "--skip-konnector")
		line := c.Line(t, func(s string) bool { return strings.Contains(s, "Please manually open: ") })
		b := chromium.OpenBindPage(t, line[strings.Index(line, "http"):], e.baseURL, alice)
		template, crd := "input[value='gizmos-with-settings']", "input[value='"+gizmoAPI.Name()+"']"
		for _, sel := range []string{template, crd} {
			if warn := b.Text("label:has(" + sel + ") .api-warn"); !strings.Contains(warn, "pick only one of them") {
				t.Errorf("the page does not mark %s as overlapping: %q", sel, warn)
			}
		}
		b.Click(template)
		b.Click(crd)
		b.Click("#confirm")
		tokens := bindTokens(t, e)
		if status := b.ClickAndWait("button[value=bind]"); status != http.StatusUnprocessableEntity {
			t.Fatalf("Bind with both offers of gizmos: status %d, want 422:\n%s", status, b.Text("body"))
		}
		// Nothing provisioned: every bind issues a token Secret.
		for name := range bindTokens(t, e) {
			if !tokens[name] {
				t.Errorf("the refused bind issued token Secret %s", name)
			}
		}
		want := "gizmos-with-settings and " + gizmoAPI.Name() + " both bind " + gizmoAPI.Name() + ": pick only one of them."
		if got := b.Text("#form-error"); got != want {
			t.Errorf("the page says %q, want %q", got, want)
		}
		if !c.Running() {
			t.Fatalf("the CLI stopped after the refusal (exit %d):\n%s", c.Wait(t, time.Second), c.Stderr.String())
		}
		// Both stay ticked; the user unticks the template and binds.
		b.Click(template)
		chromium.PressBind(t, b)
		if code := c.Wait(t, 3*time.Minute); code != 0 {
			t.Fatalf("kubectl-bind: exit %d:\n%s", code, c.Stderr.String())
		}
		expectBinding(t, e, gizmoAPI.Name())
		issued := false
		for name := range bindTokens(t, e) {
			issued = issued || !tokens[name]
		}
		if !issued {
			t.Errorf("the bind issued no token Secret: the check of the refusal proves nothing")
		}
		if _, err := dynamic.NewForConfigOrDie(e.consumer.AdminConfig()).Resource(konnector.BindingGVR).Get(context.Background(), "gizmos-with-settings", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("APIServiceBinding gizmos-with-settings: %v, want none", err)
		}
	})

	t.Run("gizmos bound, then the template of gizmos", func(t *testing.T) {
		// The cluster binds gizmos through the CRD's own offer (the
		// subtest before). A second bind picking the template would hand
		// the CLI a second request for gizmos, which the provider refuses
		// after the bind: the page refuses it instead, and binding the
		// CRD's offer again works.
		expectBinding(t, e, gizmoAPI.Name())
		c := runCLI(t, home, "--kubeconfig", e.consumer.AdminKubeconfigPath(), "--skip-browser", "--skip-konnector")
		line := c.Line(t, func(s string) bool { return strings.Contains(s, "Please manually open: ") })
		b := chromium.OpenBindPage(t, line[strings.Index(line, "http"):], e.baseURL, alice)
		template, crd := "input[value='gizmos-with-settings']", "input[value='"+gizmoAPI.Name()+"']"
		b.Click(template)
		b.Click("#confirm")
		tokens := bindTokens(t, e)
		if status := b.ClickAndWait("button[value=bind]"); status != http.StatusUnprocessableEntity {
			t.Fatalf("Bind of the template of gizmos, bound already: status %d, want 422:\n%s", status, b.Text("body"))
		}
		for name := range bindTokens(t, e) {
			if !tokens[name] {
				t.Errorf("the refused bind issued token Secret %s", name)
			}
		}
		want := gizmoAPI.Name() + " is already bound in this cluster by " + gizmoAPI.Name() + ", not gizmos-with-settings: pick " +
			gizmoAPI.Name() + " to bind it again, or unbind it first."
		if got := b.Text("#form-error"); got != want {
			t.Errorf("the page says %q, want %q", got, want)
		}
		if !c.Running() {
			t.Fatalf("the CLI stopped after the refusal (exit %d):\n%s", c.Wait(t, time.Second), c.Stderr.String())
		}
		expectBinding(t, e, gizmoAPI.Name())
		// The user picks the CRD's offer instead: a rebind, which the
		// backend binds and hands to the CLI. The released CLI then makes
		// its request again under a name of its own, which the
		// provider's controllers refuse as another request for gizmos:
		// its exit code is not the backend's to judge here.
		b.Click(template)
		b.Click(crd)
		chromium.PressBind(t, b)
		code := c.Wait(t, 3*time.Minute)
		if !strings.Contains(c.Stderr.String(), "Binding completed successfully!") {
			t.Fatalf("kubectl-bind (exit %d) got no binding response for the rebind:\n%s", code, c.Stderr.String())
		}
		t.Logf("kubectl-bind exited %d after the rebind; requests on the provider: %v", code, providerRequests(t, e))
		expectBinding(t, e, gizmoAPI.Name())
		issued := false
		for name := range bindTokens(t, e) {
			issued = issued || !tokens[name]
		}
		if !issued {
			t.Errorf("the rebind issued no token Secret: the check of the refusal proves nothing")
		}
		if _, err := dynamic.NewForConfigOrDie(e.consumer.AdminConfig()).Resource(konnector.BindingGVR).Get(context.Background(), "gizmos-with-settings", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("APIServiceBinding gizmos-with-settings: %v, want none", err)
		}
	})

	t.Run("login of a user not allowed", func(t *testing.T) {
		home := t.TempDir()
		c := runCLI(t, home, "login", e.baseURL, "--skip-browser")
		b := chromium.New(t)
		b.Open(c.URL(t))
		// The refusal reaches the CLI's callback server, which exits at once:
		// the browser's last page may never load.
		chromium.SignInToCLI(t, b, mallory)
		if code := c.Wait(t, time.Minute); code == 0 {
			t.Fatal("kubectl-bind login of a user outside the allow-list exited 0")
		}
		if !strings.Contains(c.Stderr.String(), "access_denied") {
			t.Errorf("the CLI was not told access_denied:\n%s", c.Stderr.String())
		}
	})

	t.Run("forged token", func(t *testing.T) {
		forged := t.TempDir()
		cfg, err := os.ReadFile(home + "/kube-bind-config.yaml")
		if err != nil {
			t.Fatal(err)
		}
		// One character of the signature changed.
		re := regexp.MustCompile(`(kbt1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*)([A-Za-z0-9_-])`)
		if !re.Match(cfg) {
			t.Fatalf("no CLI token in the kube-bind config:\n%s", cfg)
		}
		tampered := re.ReplaceAllFunc(cfg, func(m []byte) []byte {
			last := m[len(m)-1]
			if last == 'A' {
				last = 'B'
			} else {
				last = 'A'
			}
			return append(m[:len(m)-1:len(m)-1], last)
		})
		if err := os.WriteFile(forged+"/kube-bind-config.yaml", tampered, 0o600); err != nil {
			t.Fatal(err)
		}
		// The backend refuses the token itself...
		req, _ := http.NewRequest(http.MethodGet, e.baseURL+"/api/templates", nil)
		req.Header.Set("Authorization", "Bearer "+string(regexp.MustCompile(`kbt1\.[A-Za-z0-9_.-]+`).Find(tampered)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET /api/templates with a forged token: %s, want 401", resp.Status)
		}
		// ...and the released CLI, which reads any answer as a
		// BindingResponse (its exit code stays 0), binds nothing.
		c := runCLI(t, forged, "apiservice", "--template-name", exampleapis.MangoDB.Name(), "--name", "forged",
			"--kubeconfig", e.consumer.AdminKubeconfigPath(), "--skip-konnector")
		c.Wait(t, time.Minute)
		if !strings.Contains(c.Stderr.String(), "unexpected response") {
			t.Errorf("the CLI did not report the refusal:\n%s", c.Stderr.String())
		}
		if _, err := dynamic.NewForConfigOrDie(e.consumer.AdminConfig()).Resource(konnector.BindingGVR).Get(context.Background(), "forged", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("a forged token made APIServiceBinding forged: %v", err)
		}
	})

	if log := k.Log(); strings.Contains(strings.ToLower(log), "forbidden") {
		t.Errorf("the konnector was refused something:\n%s", testutil.GrepLines(log, "orbidden"))
	}
	if done, err := k.Exited(); done {
		t.Errorf("the konnector exited: %v", err)
	}
}

// bindInBrowser opens u, signs user in, picks apis and presses Bind.
func bindInBrowser(t testing.TB, e *env, u string, user oidcprovider.User, apis ...string) {
	t.Helper()
	chromium.PressBind(t, chromium.OpenBindPage(t, u, e.baseURL, user), apis...)
}

// expectBinding checks that the CLI made APIServiceBinding name.
func expectBinding(t testing.TB, e *env, name string) {
	t.Helper()
	konnector.ExpectBinding(t, e.consumer.AdminConfig(), name)
}

// syncsBothWays checks that an object of api syncs both ways.
func syncsBothWays(t testing.TB, e *env, api exampleapis.API, name string) {
	t.Helper()
	konnector.SyncsBothWays(t, e.consumer.AdminConfig(), e.provider.AdminConfig(), api, name, namespacePrefix)
}

// offerTemplate creates template name offering api with a claim on
// ConfigMaps, and waits until the backend offers it.
func offerTemplate(t *testing.T, e *env, home, name string, api exampleapis.API) {
	t.Helper()
	template := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha2", "kind": "APIServiceExportTemplate",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"resources": []any{map[string]any{"group": api.Group, "resource": api.Plural}},
			"permissionClaims": []any{map[string]any{"group": "", "resource": "configmaps",
				"selector": map[string]any{"labelSelector": map[string]any{"matchLabels": map[string]any{"app": name}}}}},
		},
	}}
	templates := schema.GroupVersionResource{Group: "kube-bind.io", Version: "v1alpha2", Resource: "apiserviceexporttemplates"}
	if _, err := dynamic.NewForConfigOrDie(e.provider.AdminConfig()).Resource(templates).Create(context.Background(), template, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.AwaitWithin(t, time.Minute, 200*time.Millisecond, "template "+name+" to be offered", func() (bool, error) {
		c := runCLI(t, home, "templates")
		c.Wait(t, time.Minute)
		return strings.Contains(c.Stdout.String(), name), nil
	})
}

// bindTokens are the token Secrets that binds issued in the provider
// namespaces of this package's backend.
func bindTokens(t *testing.T, e *env) map[string]bool {
	t.Helper()
	list, err := kubernetes.NewForConfigOrDie(e.provider.AdminConfig()).CoreV1().Secrets("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, s := range list.Items {
		if strings.HasPrefix(s.Namespace, namespacePrefix) && s.Annotations[binding.AnnotationIssuedBy] == binding.IssuedByBind {
			out[s.Namespace+"/"+s.Name] = true
		}
	}
	return out
}

// providerRequests names the export requests in the consumer namespaces,
// with their phase.
func providerRequests(t *testing.T, e *env) []string {
	t.Helper()
	list, err := dynamic.NewForConfigOrDie(e.provider.AdminConfig()).Resource(kbresources.APIServiceExportRequestsV1alpha2).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range list.Items {
		phase, _, _ := unstructured.NestedString(r.Object, "status", "phase")
		out = append(out, r.GetNamespace()+"/"+r.GetName()+"="+phase)
	}
	return out
}
