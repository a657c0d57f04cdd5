package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kbprovider/backend/internal/testutil/chromium"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
	v1alpha1 "github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/pollclient"
	"github.com/kbprovider/backend/pkg/protocol"
)

func TestPollFlowInBrowser(t *testing.T) {
	e := startEnv(t, backendOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	c := pollclient.New(nil)
	p, err := c.Discover(ctx, e.baseURL+"/export")
	if err != nil {
		t.Fatal(err)
	}
	if p.PrettyName != prettyName {
		t.Errorf("provider name %q", p.PrettyName)
	}
	s, err := c.CreateSession(ctx, p, "")
	if err != nil {
		t.Fatal(err)
	}
	authURL, err := s.AuthenticationURL()
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		res *pollclient.Result
		err error
	}
	waited := make(chan result, 1)
	go func() {
		res, err := s.Wait(ctx)
		waited <- result{res, err}
	}()

	b := chromium.OpenBindPage(t, authURL, e.baseURL+"/bind", alice)
	page := b.Text("main")
	for _, want := range []string{prettyName, "mangodbs", "redises", "alice@example.com"} {
		if !strings.Contains(page, want) {
			t.Errorf("selection page lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "secretthings") {
		t.Error("selection page offers an API that is not exported")
	}
	if code := b.Text("#confirmation-code"); code != protocol.ConfirmationCode(s.ID) {
		t.Errorf("page shows confirmation code %q, the client prints %q", code, protocol.ConfirmationCode(s.ID))
	}
	b.Resize(390, 844)
	b.Screenshot("selection-phone")
	b.Resize(1280, 900)
	b.Click("input[value='mangodbs.mangodb.com']")
	b.Click("input[value='redises.cache.example.com']")
	b.Click("#confirm")
	if status := b.ClickAndWait("button[value=bind]"); status != http.StatusOK {
		t.Fatalf("bind answered %d: %s", status, b.Text("body"))
	}
	if done := b.Text("main"); !strings.Contains(strings.ToLower(done), "terminal") {
		t.Errorf("done page does not send the user back to the terminal:\n%s", done)
	}

	var r result
	select {
	case r = <-waited:
	case <-ctx.Done():
		t.Fatal("the client's poll did not finish")
	}
	if r.err != nil {
		t.Fatalf("poll: %v", r.err)
	}
	resp := r.res.Response
	if got := resp.Authentication.OAuth2CodeGrant; got == nil || got.SessionID != s.ID || got.ID != e.idp.IssuerURL+"/"+alice.Name {
		t.Errorf("authentication %+v, want sid %s and id %s/%s", got, s.ID, e.idp.IssuerURL, alice.Name)
	}
	names := requestNames(t, resp)
	if strings.Join(names, ",") != "mangodbs.mangodb.com,redises.cache.example.com" {
		t.Errorf("requests %v", names)
	}
	namespaces := e.consumerNamespaces(t, alice)
	if len(namespaces) != 1 || r.res.Namespace != namespaces[0] {
		t.Fatalf("consumer namespaces %v, kubeconfig namespace %q", namespaces, r.res.Namespace)
	}
	e.requireDelivered(t, r.res.Namespace)
	useKubeconfig(t, resp.Kubeconfig, r.res.Namespace)
	waitRequestSucceeded(t, resp.Kubeconfig, r.res.Namespace, "mangodbs.mangodb.com")
}

// useKubeconfig shows the issued kubeconfig working as the consumer: it
// creates an APIServiceExportRequest in its namespace and may not read
// secrets of kube-system.
func useKubeconfig(t *testing.T, kubeconfig []byte, namespace string) {
	t.Helper()
	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		t.Fatalf("issued kubeconfig: %v", err)
	}
	dyn := dynamic.NewForConfigOrDie(rc)
	gvr := kbresources.APIServiceExportRequests
	req := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha1", "kind": "APIServiceExportRequest",
		"metadata": map[string]any{"name": "mangodbs.mangodb.com"},
		"spec":     map[string]any{"resources": []any{map[string]any{"group": "mangodb.com", "resource": "mangodbs"}}},
	}}
	if _, err := dyn.Resource(gvr).Namespace(namespace).Create(context.Background(), req, metav1.CreateOptions{}); err != nil {
		t.Errorf("the consumer cannot create an APIServiceExportRequest in its namespace: %v", err)
	}
	secrets := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	if _, err := dyn.Resource(secrets).Namespace("kube-system").List(context.Background(), metav1.ListOptions{}); err == nil {
		t.Error("the consumer can read secrets in kube-system")
	}
}

// waitRequestSucceeded waits, as the released CLI does with the issued
// kubeconfig, until the backend's controllers set the request's phase to
// Succeeded, and checks the APIServiceExport the konnector will read.
func waitRequestSucceeded(t *testing.T, kubeconfig []byte, namespace, name string) {
	t.Helper()
	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(rc)
	gvr := kbresources.APIServiceExportRequests
	start := time.Now()
	var phase, message string
	for time.Since(start) < 30*time.Second {
		u, err := dyn.Resource(gvr).Namespace(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			phase, _, _ = unstructured.NestedString(u.Object, "status", "phase")
			message, _, _ = unstructured.NestedString(u.Object, "status", "terminalMessage")
		}
		if phase == "Succeeded" || phase == "Failed" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if phase != "Succeeded" {
		t.Fatalf("request %s/%s: phase %q (%s) after %v, want Succeeded", namespace, name, phase, message, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("request %s/%s Succeeded %v after it was created", namespace, name, time.Since(start).Round(time.Millisecond))
	exports := kbresources.APIServiceExports
	if _, err := dyn.Resource(exports).Namespace(namespace).Get(context.Background(), name, metav1.GetOptions{}); err != nil {
		t.Errorf("the APIServiceExport %s, read with the issued kubeconfig: %v", name, err)
	}
}

func requestNames(t *testing.T, resp v1alpha1.BindingResponse) []string {
	t.Helper()
	var names []string
	for _, raw := range resp.Requests {
		var r v1alpha1.APIServiceExportRequestResponse
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		names = append(names, r.Metadata.Name)
	}
	return names
}

// cliCallback is a localhost callback server that parses the redirect the
// way the released kube-bind CLI does.
type cliCallback struct {
	port     int
	received chan v1alpha1.BindingResponse
	problems chan string
}

func startCLICallback(t *testing.T, sessionID string) *cliCallback {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cb := &cliCallback{port: l.Addr().(*net.TCPAddr).Port, received: make(chan v1alpha1.BindingResponse, 1), problems: make(chan string, 1)}
	mux := http.NewServeMux()
	mux.HandleFunc("/callback", func(w http.ResponseWriter, r *http.Request) {
		fail := func(msg string) {
			cb.problems <- msg
			http.Error(w, msg, http.StatusBadRequest)
		}
		raw, err := base64.StdEncoding.DecodeString(r.URL.Query().Get("response"))
		if err != nil {
			fail("response is not standard base64: " + err.Error())
			return
		}
		var resp v1alpha1.BindingResponse
		if err := json.Unmarshal(raw, &resp); err != nil {
			fail("response is not JSON: " + err.Error())
			return
		}
		if resp.APIVersion != v1alpha1.GroupVersion || resp.Authentication.OAuth2CodeGrant == nil || resp.Authentication.OAuth2CodeGrant.SessionID != sessionID {
			fail("unexpected binding response: " + string(raw))
			return
		}
		for _, req := range resp.Requests {
			var r v1alpha1.APIServiceExportRequestResponse
			if json.Unmarshal(req, &r) != nil || r.APIVersion != v1alpha1.GroupVersion || r.Kind != v1alpha1.KindAPIServiceExportRequest {
				fail("unexpected request: " + string(req))
				return
			}
		}
		cb.received <- resp
		_, _ = w.Write([]byte("You can close this window."))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return cb
}

func TestCallbackFlowInBrowser(t *testing.T) {
	e := startEnv(t, backendOptions{})
	const cliSession, cliCluster = "aB3dE9", "Zx81Qp"
	cb := startCLICallback(t, cliSession)

	// The URL the released CLI prints: existing query kept, keys sorted.
	authURL := e.baseURL + "/authorize?" + url.Values{"c": {cliCluster}, "p": {itoa(cb.port)}, "s": {cliSession}}.Encode()
	b := chromium.New(t)
	b.Open(authURL)
	chromium.SignIn(t, b, bob)
	b.Click("input[value='mangodbs.mangodb.com']")
	// Released CLIs print no code: the page names the callback on this
	// machine instead, and the user confirms having started it.
	if got := b.Text("#callback-url"); got != "http://localhost:"+itoa(cb.port)+"/callback" {
		t.Errorf("the page names callback %q", got)
	}
	b.Click("#confirm")
	b.ClickAndWait("button[value=bind]")

	select {
	case resp := <-cb.received:
		if got := requestNames(t, resp); len(got) != 1 || got[0] != "mangodbs.mangodb.com" {
			t.Errorf("requests %v", got)
		}
		cfg, err := clientcmd.Load(resp.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		ns := cfg.Contexts[cfg.CurrentContext].Namespace
		if got := e.consumerNamespaces(t, bob); len(got) != 1 || got[0] != ns {
			t.Errorf("bob's namespaces %v, kubeconfig namespace %q", got, ns)
		}
		e.requireDelivered(t, ns)
		useKubeconfig(t, resp.Kubeconfig, ns)
		waitRequestSucceeded(t, resp.Kubeconfig, ns, "mangodbs.mangodb.com")
	case msg := <-cb.problems:
		t.Fatalf("the CLI callback refused the redirect: %s", msg)
	case <-time.After(30 * time.Second):
		t.Fatalf("no callback; browser at %s:\n%s", b.URL(), b.Text("body"))
	}
}

func itoa(i int) string {
	return strconv.Itoa(i)
}
