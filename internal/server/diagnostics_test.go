package server

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/credentials"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/testutil"
)

// The public listener, where the Ingress sends everything, serves no
// metrics and no detail: /readyz says "ok" or "not ready". Probes,
// metrics and the status page are on the diagnostics listener.
func TestDiagnosticsAreOffThePublicListener(t *testing.T) {
	s, _ := runServer(t, testConfig(&procs.Buffer{}))
	public, diag := "http://"+s.Addr().String(), "http://"+s.DiagnosticsAddr().String()

	if code, body := httpGet(t, public+"/metrics"); code != http.StatusNotFound {
		t.Errorf("public /metrics: %d, want 404\n%.300s", code, body)
	}
	for _, path := range []string{"/readyz", "/readyz?verbose"} {
		if code, body := httpGet(t, public+path); code != http.StatusOK || body != "ok\n" {
			t.Errorf("public %s: %d %q, want 200 \"ok\" without detail", path, code, body)
		}
	}
	if code, body := httpGet(t, diag+"/metrics"); code != http.StatusOK || !strings.Contains(body, "go_goroutines") ||
		!strings.Contains(body, "kube_bind_backend_sessions_created_total") {
		t.Errorf("diagnostics /metrics: %d\n%.300s", code, body)
	}
	if code, body := httpGet(t, diag+"/readyz"); code != http.StatusOK || !strings.Contains(body, "[+]shutdown ok") {
		t.Errorf("diagnostics /readyz: %d %q", code, body)
	}
	if code, body := httpGet(t, diag+"/statusz"); code != http.StatusOK || !strings.Contains(body, "readiness (this replica)") {
		t.Errorf("diagnostics /statusz: %d %q", code, body)
	}
	// The diagnostics listener serves nothing of the public API.
	if code, _ := httpGet(t, diag+"/export"); code != http.StatusNotFound {
		t.Errorf("diagnostics /export: %d, want 404", code)
	}
}

// Readiness follows only what this replica needs: with the identity
// provider stopped and the provider cluster cut off, every replica stays
// in its Service (polls of finished binds and discovery still work),
// while the status page, a gauge and a WARN log show the outage. No
// request to /readyz, public or not, reaches either dependency.
func TestReadinessIgnoresSharedDependencies(t *testing.T) {
	cp := controlplane.Get(t)
	admin := controlplane.ConfigForUser(t, cp, "diagnostics-test-admin", "system:masters")
	cut := startProxy(t, strings.TrimPrefix(admin.Host, "https://"))
	admin.Host = "https://" + cut.addr()
	idp := oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{"http://127.0.0.1/callback"}})

	logs := &procs.Buffer{}
	cfg := testConfig(logs)
	cfg.Provider.Kubeconfig = controlplane.KubeconfigFile(t, admin)
	cfg.OIDC = oidc.Options{IssuerURL: idp.IssuerURL, ClientID: idp.ClientID, ClientSecret: idp.ClientSecret}
	cfg.Browser.SigningKeys = [][]byte{bytes.Repeat([]byte("s"), 32)}
	cfg.Browser.EncryptionKeys = [][]byte{bytes.Repeat([]byte("e"), 32)}
	cfg.Provider.NamespacePrefix = "diag-"
	cfg.Provider.ConsumerScope = binding.ScopeNamespaced
	cfg.Controllers.Credentials = credentials.Policy{Lifetime: 24 * time.Hour, RotationPoint: 0.8, Overlap: 10 * time.Minute}
	s, _ := runServer(t, cfg)
	public, diag := "http://"+s.Addr().String(), "http://"+s.DiagnosticsAddr().String()

	upWhen := func(value string) func() bool {
		return func() bool {
			_, m := httpGet(t, diag+"/metrics")
			return strings.Contains(m, `kube_bind_backend_dependency_up{dependency="oidc"} `+value) &&
				strings.Contains(m, `kube_bind_backend_dependency_up{dependency="provider-cluster"} `+value)
		}
	}
	testutil.Await(t, "both dependencies up", upWhen("1"))
	// Every request to the provider cluster is counted, by verb and
	// resource only: the dependency check's GET /version among them.
	_, m := httpGet(t, diag+"/metrics")
	if !strings.Contains(m, `kube_bind_backend_api_requests_total{resource="",verb="get"} `) ||
		!regexp.MustCompile(`kube_bind_backend_api_requests_total\{resource="customresourcedefinitions",verb="(list|watch)"\} [1-9]`).MatchString(m) {
		t.Errorf("/metrics lacks the API requests of the dependency check and the catalog:\n%s", m)
	}
	if code, body := httpGet(t, diag+"/readyz"); code != http.StatusOK || !strings.Contains(body, "[+]exported-apis ok") {
		t.Fatalf("diagnostics /readyz before the outage: %d %q", code, body)
	}

	idp.Stop()
	cut.cut()
	outage := time.Now()
	testutil.Await(t, "both dependencies down", upWhen("0"))
	t.Logf("both dependencies reported down %s after the outage began", time.Since(outage).Round(100*time.Millisecond))
	if code, body := httpGet(t, public+"/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("public /readyz with the IdP and the cluster down: %d %q, want 200 ok", code, body)
	}
	if code, body := httpGet(t, diag+"/readyz"); code != http.StatusOK || strings.Contains(body, "oidc") || strings.Contains(body, "provider-cluster") {
		t.Errorf("diagnostics /readyz with the IdP and the cluster down: %d %q, want 200 without them", code, body)
	}
	_, status := httpGet(t, diag+"/statusz")
	for _, want := range []string{"[-]oidc failed:", "[-]provider-cluster failed: provider cluster unreachable:", "connection refused"} {
		if !strings.Contains(status, want) {
			t.Errorf("/statusz lacks %q:\n%s", want, status)
		}
	}
	for _, dep := range []string{"oidc", "provider-cluster"} {
		if !strings.Contains(logs.String(), `"level":"WARN","msg":"dependency not answering; this replica stays ready and serves what does not need it","component":"diagnostics","dependency":"`+dep+`"`) {
			t.Errorf("no WARN log for %s:\n%s", dep, logs)
		}
	}
	// Discovery still answers.
	if code, _ := httpGet(t, public+"/export"); code != http.StatusOK {
		t.Errorf("/export during the outage: %d", code)
	}

	// Probes ask no dependency: with the provider cluster hanging (it
	// accepts connections and never answers), 150 probes take no longer
	// than reading memory, where a single request to the cluster would
	// wait for its timeout.
	cut.hang()
	start := time.Now()
	for range 50 {
		for _, u := range []string{public + "/readyz", diag + "/readyz", diag + "/statusz"} {
			if code, body := httpGet(t, u); code != http.StatusOK {
				t.Fatalf("%s with the cluster hanging: %d %q", u, code, body)
			}
		}
	}
	took := time.Since(start)
	t.Logf("150 probes (public /readyz, diagnostics /readyz and /statusz) with the provider cluster hanging took %s", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("150 probes took %s with the provider cluster hanging: they wait for it", took)
	}
}

// runServer builds and runs a backend from cfg until the test ends.
func runServer(t *testing.T, cfg Config) (*Server, *procs.Buffer) {
	t.Helper()
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	s, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	testutil.Await(t, "the backend serves", func() bool {
		code, _ := httpGet(t, "http://"+s.DiagnosticsAddr().String()+"/healthz")
		return code == http.StatusOK
	})
	return s, nil
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// proxy forwards TCP connections to target; cut closes its listener
// (new connections are refused) and the open connections, restore
// listens again on the same address, hang too but holds every connection
// without an answer.
type proxy struct {
	t       *testing.T
	target  string
	address string
	mu      sync.Mutex
	hanging bool
	ln      net.Listener
	conns   map[net.Conn]struct{}
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	p := &proxy{t: t, target: target, address: "127.0.0.1:0", conns: map[net.Conn]struct{}{}}
	p.restore()
	p.address = p.ln.Addr().String()
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) addr() string { return p.address }

func (p *proxy) serve(c net.Conn) {
	p.mu.Lock()
	if p.hanging {
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	go func() { io.Copy(up, c); up.Close() }()
	io.Copy(c, up)
	c.Close()
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

func (p *proxy) hang() {
	p.mu.Lock()
	p.hanging = true
	p.mu.Unlock()
	p.restore()
}

func (p *proxy) restore() {
	ln, err := net.Listen("tcp", p.address)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
}
