// Package v2 drives the kbind v2 flow end to end against real parts: the
// backend as a separate process over a real provider control plane, the
// test OpenID Connect provider, chromium for the pages, and a consumer
// control plane with the released v2 CRDs, applied to with kubectl.
package v2

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
	"github.com/kbprovider/backend/internal/testutil/chromium"
)

func TestMain(m *testing.M) { os.Exit(backendproc.RunMain(m)) }

const namespacePrefix = "kb-v2-"

var curlCommand = regexp.MustCompile(`^curl -fsS -X POST '([^']+)' \| kubectl apply -f -$`)

// post sends the pickup's POST, as curl -X POST does.
func post(t *testing.T, method, u string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, body
}

// A v2 consumer binds in the browser from the provider's /v2/bind page,
// copies the command the done page shows, and its POST returns a bundle
// that kubectl applies, with strict validation, to a cluster holding only
// the released v2 CRDs; the Secret it made holds a credential of the
// consumer's own provider namespace, made by the backend. The URL works
// once: GET and HEAD spend nothing, a second POST is refused.
func TestBrowserBindPickupApply(t *testing.T) {
	ctx := context.Background()
	provider := controlplane.Get(t)
	if err := exampleapis.Prepare(ctx, provider, exampleapis.MangoDB); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(provider.AdminConfig())
	// The v2 konnector lists CRDs with its own label; the catalog honours
	// it beside the other.
	patch := []byte(`{"metadata":{"labels":{"` + binding.ExportedLabelV2 + `":"true"}}}`)
	crds := dynamic.NewForConfigOrDie(provider.AdminConfig()).Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if _, err := crds.Patch(ctx, "mangodbs.mangodb.com", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	port := procs.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	idp := oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{base + "/callback"}, Users: []oidcprovider.User{oidcprovider.Alice}})
	backendproc.Start(t, base, backendproc.BrowserArgs(t, port, base, idp, provider.AdminKubeconfigPath(), "V2 provider", namespacePrefix), 60*time.Second)

	consumer := controlplane.Consumer(t)
	if err := konnector.InstallV2CRDs(ctx, consumer.AdminConfig()); err != nil {
		t.Fatal(err)
	}

	b := chromium.OpenBindPage(t, base+"/v2/bind", base+"/bind", oidcprovider.Alice)
	if b.Exists("#confirmation-code") {
		t.Error("the v2 selection page shows a terminal's confirmation code")
	}
	chromium.PressBind(t, b, "mangodbs.mangodb.com")
	command := strings.TrimSpace(b.Text("#pickup-command"))
	m := curlCommand.FindStringSubmatch(command)
	if m == nil {
		t.Fatalf("the done page shows no pickup command: %q\n%s", command, b.Text("body"))
	}
	pickup := m[1]
	if !strings.HasPrefix(pickup, base+"/v2/pickup?") {
		t.Fatalf("pickup URL %s is not the backend's", pickup)
	}

	for _, method := range []string{http.MethodGet, http.MethodHead} {
		if status, h, _ := post(t, method, pickup); status != http.StatusMethodNotAllowed || h.Get("Allow") != http.MethodPost {
			t.Errorf("%s pickup: %d, Allow %q; want 405, POST", method, status, h.Get("Allow"))
		}
	}
	status, _, bundle := post(t, http.MethodPost, pickup)
	if status != http.StatusOK {
		t.Fatalf("pickup: %d\n%s", status, bundle)
	}
	if status, _, body := post(t, http.MethodPost, pickup); status != http.StatusGone || !strings.Contains(string(body), "used already") {
		t.Errorf("second pickup: %d %s; want 410 saying it was used", status, body)
	}

	apply := exec.Command(filepath.Join(consumer.BinDir(), "kubectl"), "--kubeconfig", consumer.AdminKubeconfigPath(),
		"apply", "--validate=strict", "-f", "-")
	apply.Stdin = bytes.NewReader(bundle)
	out, err := apply.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	var ns string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if name, ok := strings.CutPrefix(line, "namespace/"); ok {
			ns = strings.TrimSuffix(name, " created")
		}
	}
	for _, want := range []string{"secret/kube-bind-kubeconfig created", "connection.core.kbind.io/" + ns + " created",
		"binding.core.kbind.io/mangodbs.mangodb.com created"} {
		if ns == "" || !strings.Contains(string(out), want) {
			t.Errorf("kubectl apply said:\n%s\nwithout %q", out, want)
		}
	}

	// The provider namespace of that name is the backend's, for alice,
	// and its binding is marked delivered (the garbage collection spares
	// it).
	pns, err := kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the bundle's namespace %s on the provider: %v", ns, err)
	}
	if !strings.HasPrefix(ns, namespacePrefix) || pns.Labels[binding.LabelManagedBy] != binding.ManagedByValue ||
		pns.Annotations[binding.AnnotationSubject] != oidcprovider.Alice.Name {
		t.Errorf("provider namespace %s: labels %v, annotations %v", ns, pns.Labels, pns.Annotations)
	}
	testutil.Await(t, "the binding is marked delivered", func() bool {
		cb, err := dynamic.NewForConfigOrDie(provider.AdminConfig()).Resource(schema.GroupVersionResource{Group: "kube-bind.io", Version: "v1alpha2", Resource: "clusterbindings"}).
			Namespace(ns).Get(ctx, binding.ClusterBindingName, metav1.GetOptions{})
		return err == nil && cb.GetAnnotations()[binding.AnnotationDeliveredAt] != ""
	})

	// The Secret kubectl made holds a credential of the consumer's
	// service account in that namespace.
	secret, err := kubernetes.NewForConfigOrDie(consumer.AdminConfig()).CoreV1().Secrets(ns).Get(ctx, "kube-bind-kubeconfig", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, ctxNS := testutil.IssuedConfig(t, secret.Data["kubeconfig"])
	if ctxNS != ns {
		t.Errorf("the kubeconfig's namespace is %q, want %q", ctxNS, ns)
	}
	review, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the issued credential does not authenticate at the provider: %v", err)
	}
	if want := "system:serviceaccount:" + ns + ":" + binding.ServiceAccountName; review.Status.UserInfo.Username != want {
		t.Errorf("the issued credential is %q, want %q", review.Status.UserInfo.Username, want)
	}

	// Its rights on the picked API come from the export request the bind
	// made, decided like a v0.8.2 client's: all the konnector's verbs on
	// MangoDBs in its own namespace, nothing in another, no list across
	// namespaces.
	issued := kubernetes.NewForConfigOrDie(cfg)
	can := func(namespace, verb string) bool {
		r, err := issued.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authzv1.ResourceAttributes{Namespace: namespace, Verb: verb, Group: "mangodb.com", Resource: "mangodbs"},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status.Allowed
	}
	testutil.Await(t, "the consumer may create MangoDBs in its namespace", func() bool { return can(ns, "create") })
	for _, verb := range binding.ConsumerVerbs {
		if !can(ns, verb) {
			t.Errorf("the consumer may not %s MangoDBs in its namespace", verb)
		}
		if can("default", verb) {
			t.Errorf("the consumer may %s MangoDBs in namespace default", verb)
		}
	}
	if can("", "list") {
		t.Error("the consumer may list MangoDBs of every namespace")
	}
	req, err := dynamic.NewForConfigOrDie(provider.AdminConfig()).Resource(schema.GroupVersionResource{Group: "kube-bind.io", Version: "v1alpha2", Resource: "apiserviceexportrequests"}).
		Namespace(ns).Get(ctx, "mangodbs.mangodb.com", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the bind's export request: %v", err)
	}
	if phase, _, _ := unstructured.NestedString(req.Object, "status", "phase"); phase != "Succeeded" {
		t.Errorf("the bind's export request is %q, want Succeeded", phase)
	}
}
