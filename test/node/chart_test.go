package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil"

	corev1 "k8s.io/api/core/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/node"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/pollclient"
	"github.com/kbprovider/backend/pkg/protocol"
	"github.com/kbprovider/backend/web"
)

const (
	releaseName = "kbb"
	releaseNS   = "kbb-system"
	fullname    = "kbb-kube-bind-backend"
	// serviceIP is the Service's fixed cluster IP (service.clusterIP):
	// there is no cluster DNS, and the external URL must be known before
	// the install.
	serviceIP       = "10.0.0.200"
	namespacePrefix = "kube-bind-" // the chart's default
)

var alice = oidcprovider.Alice

// release is the chart installed on the node.
type release struct {
	n    *node.Node
	kube kubernetes.Interface
	idp  *oidcprovider.Provider
	ext  string // the external URL: the Service
	sets []string
	home string // helm's own config, cache and data
}

// helm runs the cached helm against the node's cluster, with folders of
// its own.
func (r *release) helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(r.n.ControlPlane().BinDir(), "helm"),
		append(args, "--kubeconfig", r.n.ControlPlane().AdminKubeconfigPath())...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(r.home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(r.home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(r.home, "data"),
		"HELM_NO_PLUGINS=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), err
}

// upgrade runs helm upgrade --install --wait with the release's values
// plus extra --set values, and returns how long it took.
func (r *release) upgrade(t *testing.T, extra ...string) time.Duration {
	t.Helper()
	args := []string{"upgrade", "--install", releaseName, filepath.Join(procs.RepoRoot(), "charts", "kube-bind-backend"),
		"--namespace", releaseNS, "--create-namespace", "--wait", "--timeout", "3m"}
	for _, s := range append(append([]string{}, r.sets...), extra...) {
		args = append(args, "--set", s)
	}
	start := time.Now()
	if _, err := r.helm(t, args...); err != nil {
		r.dumpPods(t)
		t.Fatal(err)
	}
	took := time.Since(start)
	r.awaitService(t)
	return took
}

// awaitService waits until the Service answers at its cluster IP. helm
// --wait waits for Ready pods; kube-proxy programs the Service's endpoints
// a moment later, and until then it refuses the connection.
func (r *release) awaitService(t *testing.T) {
	t.Helper()
	answer := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.ext+"/readyz", nil)
		resp, err := client.Do(req)
		if err != nil {
			return err.Error()
		}
		_ = resp.Body.Close()
		return resp.Status
	}
	var last string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if last = answer(); last == "200 OK" {
			return
		}
		if time.Now().After(deadline) {
			r.dumpPods(t)
			t.Fatalf("the Service at %s did not answer /readyz within a minute of the pods being Ready; last: %s", r.ext, last)
		}
	}
}

// dumpPods logs the release's pods and the end of their logs.
func (r *release) dumpPods(t *testing.T) {
	t.Helper()
	pods, err := r.kube.CoreV1().Pods(releaseNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Logf("listing pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		b, _ := json.MarshalIndent(p.Status, "", " ")
		t.Logf("pod %s: %s", p.Name, b)
		logs, _ := filepath.Glob(filepath.Join("/var/log/pods", releaseNS+"_"+p.Name+"_*", "*", "*.log"))
		for _, l := range logs {
			data, _ := os.ReadFile(l)
			if len(data) > 3000 {
				data = data[len(data)-3000:]
			}
			t.Logf("log %s:\n%s", l, data)
		}
	}
}

// installChart installs the chart with its default values (two replicas)
// plus what a provider must set, the node's image, and the Service's
// fixed address, against a real identity provider on the node's address.
func installChart(t *testing.T, n *node.Node) *release {
	t.Helper()
	cp := n.ControlPlane()
	r := &release{n: n, kube: kubernetes.NewForConfigOrDie(cp.AdminConfig()), ext: "http://" + serviceIP, home: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Pods reach the host at the node's address, never at 127.0.0.1.
	r.idp = oidcprovider.Start(t, oidcprovider.Options{
		Address:      node.IP + ":" + strconv.Itoa(procs.FreePort(t)),
		RedirectURIs: []string{r.ext + "/callback"},
		Users:        []oidcprovider.User{alice},
	})
	r.sets = []string{
		"externalURL=" + r.ext,
		"oidc.issuerURL=" + r.idp.IssuerURL,
		"oidc.clientID=" + r.idp.ClientID,
		"oidc.clientSecret=" + r.idp.ClientSecret,
		"image.repository=" + strings.Split(backendImage, ":")[0],
		"image.tag=" + strings.Split(backendImage, ":")[1],
		"image.pullPolicy=Never",
		"service.clusterIP=" + serviceIP,
		// Konnectors reach the provider cluster at the node's address.
		"providerCluster.externalAddress=" + cp.Host(),
		// The loads bind as alice, each bind a new cluster: the per-user
		// cap is not what these tests are about.
		"consumer.maxClustersPerUser=10000",
	}
	t.Cleanup(func() {
		if t.Failed() {
			r.dumpPods(t)
		}
	})
	took := r.upgrade(t)
	t.Logf("FIGURE chart ready: helm install --wait took %v (two backend pods Ready)", took.Round(time.Millisecond))
	// The exported API, and quotas that count the chart's kube-bind
	// objects (the backend gives each consumer one).
	crdClient := apiextensionsclient.NewForConfigOrDie(cp.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()
	if _, err := crdClient.Create(ctx, exampleapis.CRD(exampleapis.MangoDB), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := exampleapis.WaitEstablished(ctx, crdClient, exampleapis.MangoDB.Name()); err != nil {
		t.Fatal(err)
	}
	if err := exampleapis.AwaitQuotaCounting(ctx, cp); err != nil {
		t.Fatal(err)
	}
	return r
}

// readyPods are the release's pods that are Ready, by name.
func (r *release) readyPods(t *testing.T) []corev1.Pod {
	t.Helper()
	pods, err := r.kube.CoreV1().Pods(releaseNS).List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + releaseName})
	if err != nil {
		t.Fatal(err)
	}
	var ready []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ready = append(ready, p)
			}
		}
	}
	return ready
}

// client is an HTTP client of the Service's address, on the host (the
// node's kube-proxy rules take it to a pod). A new connection for each
// request, as many consumers' clients make: a kept-alive connection stays
// with the pod it reached (conntrack), also once that pod froze and left
// the Service.
var client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// session is a poll session as our client holds it.
type session struct {
	v1alpha1.PollSession
	ext string
}

// newSession creates a session through the Service; a 429 (this host is
// one client to the backend, which caps session creations per client) is
// waited out as Retry-After says, as our client does.
func (r *release) newSession(ctx context.Context) (*session, error) {
	for {
		s, retryAfter, err := r.createSession(ctx)
		if retryAfter == 0 {
			return s, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(retryAfter):
		}
	}
}

func (r *release) createSession(ctx context.Context) (*session, time.Duration, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.ext+"/sessions", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusTooManyRequests {
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
			return nil, time.Duration(secs) * time.Second, nil
		}
		return nil, time.Second, nil
	}
	if resp.StatusCode != http.StatusCreated {
		return nil, 0, fmt.Errorf("POST /sessions: %d %s", resp.StatusCode, b)
	}
	s := &session{ext: r.ext}
	if err := json.Unmarshal(b, &s.PollSession); err != nil || s.SessionID == "" {
		return nil, 0, fmt.Errorf("POST /sessions: %s (%w)", b, err)
	}
	return s, 0, nil
}

func (s *session) signed(path string) string {
	u, _ := url.Parse(s.ext + path)
	signed, err := protocol.SignURL(s.SessionSecret, s.SessionID, http.MethodGet, u, nil)
	if err != nil {
		panic(err)
	}
	return signed.String()
}

// pollAnswer is one poll's answer.
type pollAnswer struct {
	status int
	code   string
	body   []byte
	err    error
}

func (a pollAnswer) pending() bool {
	return a.err == nil && a.status == http.StatusForbidden && a.code == v1alpha1.ErrorAuthorizationPending
}

func (a pollAnswer) String() string {
	if a.err != nil {
		return "no answer: " + a.err.Error()
	}
	return fmt.Sprintf("%d %s %.200s", a.status, a.code, a.body)
}

func (s *session) poll(ctx context.Context) pollAnswer {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.signed("/poll"), nil)
	resp, err := client.Do(req)
	if err != nil {
		return pollAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a := pollAnswer{status: resp.StatusCode, body: b, err: err}
	var e v1alpha1.Error
	if resp.StatusCode != http.StatusOK && json.Unmarshal(b, &e) == nil {
		a.code = e.Error
	}
	return a
}

// bind does a user's part of session s through the Service: the
// authentication URL, the login at the identity provider, the selection
// page and Bind (the exported MangoDB API).
func (r *release) bind(ctx context.Context, s *session) error {
	return bindAt(ctx, r.idp, s.signed("/authorize"), r.ext, exampleapis.MangoDB.Name())
}

// bindAt opens authURL as alice's browser would (a cookie jar, the login
// at idp, the backend at ext), picks api on the selection page and
// presses Bind.
func bindAt(ctx context.Context, idp *oidcprovider.Provider, authURL, ext, api string) error {
	jar, _ := cookiejar.New(nil)
	// A browser of its own, with connections of its own: a connection
	// kept alive from an earlier bind stays with the pod it reached
	// (conntrack), also once that pod froze and left the Service.
	browser := &http.Client{Jar: jar, Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	callback, err := idp.Login(ctx, browser, authURL, alice.Name, alice.Password)
	if err != nil {
		return fmt.Errorf("login: %w", err)
	}
	resp, err := browser.Get(callback.String())
	if err != nil {
		return err
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("callback: %d at %s: %.300s", resp.StatusCode, resp.Request.URL, page)
	}
	forms, _ := testutil.ParseForms(page)
	if len(forms) == 0 || forms[0].Fields.Get(web.FieldCSRF) == "" {
		return fmt.Errorf("no selection form at %s: %.300s", resp.Request.URL, page)
	}
	action, form := forms[0].Action, forms[0].Fields
	form.Add(web.FieldAPI, api)
	form.Set(web.FieldAction, web.ActionBind)
	form.Set(web.FieldConfirm, web.ConfirmYes)
	target := resp.Request.URL.ResolveReference(&url.URL{Path: action})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", ext)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err = browser.Do(req)
	if err != nil {
		return fmt.Errorf("Bind: %w", err)
	}
	page, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(strings.ToLower(string(page)), "terminal") {
		return fmt.Errorf("Bind answered %d: %.300s", resp.StatusCode, page)
	}
	return nil
}

// deliver polls s until its BindingResponse comes (pending answers are
// waited out) and checks it; any other answer is an error.
func (s *session) deliver(ctx context.Context, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	for {
		a := s.poll(ctx)
		switch {
		case a.err == nil && a.status == http.StatusOK:
			var br v1alpha1.BindingResponse
			if err := json.Unmarshal(a.body, &br); err != nil {
				return "", fmt.Errorf("the 200 is no BindingResponse: %w", err)
			}
			res, err := pollclient.ValidateBindingResponse(&br, s.SessionID)
			if err != nil {
				return "", err
			}
			if !strings.HasPrefix(res.Namespace, namespacePrefix) {
				return "", fmt.Errorf("provider namespace %q", res.Namespace)
			}
			return res.Namespace, nil
		case a.pending() && time.Now().Before(deadline):
			time.Sleep(pollGap)
		default:
			return "", fmt.Errorf("poll of %s: %s; want the BindingResponse", s.SessionID, a)
		}
	}
}

// pollGap is what our client leaves between two polls of a session: the
// chart's session.pollInterval (2s) and a margin.
const pollGap = 2*time.Second + 200*time.Millisecond
