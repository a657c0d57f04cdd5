package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/server/health"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/internal/testutil/fakes"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
)

func TestExport(t *testing.T) {
	for _, c := range []struct {
		name, external, path, base string
	}{
		{"root", "https://bind.example.com", "/export", "https://bind.example.com"},
		{"trailing slash", "https://bind.example.com/", "/export", "https://bind.example.com"},
		{"path prefix", "https://example.com:8443/kube-bind", "/kube-bind/export", "https://example.com:8443/kube-bind"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, envOpts{external: c.external, interval: 3 * time.Second})
			// The Host header is attacker-controlled; URLs must not follow it.
			resp := e.do("GET", c.path, nil, "Host", "evil.example.org", "X-Forwarded-Host", "evil.example.org")
			b := readAll(t, resp)
			if resp.StatusCode != 200 {
				t.Fatalf("GET %s: %d %s", c.path, resp.StatusCode, b)
			}
			wantCommonHeaders(t, resp)
			var bp v1alpha1.BindingProvider
			if err := json.Unmarshal(b, &bp); err != nil {
				t.Fatal(err)
			}
			want := v1alpha1.BindingProvider{
				APIVersion: "v1alpha1", Kind: "BindingProvider", ProviderPrettyName: "MangoDB Inc.", Version: "v0.4.8",
				AuthenticationMethods: []v1alpha1.AuthenticationMethod{
					{Method: "OAuth2CodeGrantPoll", OAuth2CodeGrantPoll: &v1alpha1.OAuth2CodeGrantPoll{
						SessionURL: c.base + "/sessions", AuthenticatedURL: c.base + "/authorize",
						PollURL: c.base + "/poll", PollInterval: "3s"}},
					{Method: "OAuth2CodeGrant", OAuth2CodeGrant: &v1alpha1.OAuth2CodeGrant{AuthenticatedURL: c.base + "/authorize"}},
				},
			}
			got, _ := json.Marshal(bp)
			exp, _ := json.Marshal(want)
			if string(got) != string(exp) {
				t.Fatalf("export\n got %s\nwant %s", got, exp)
			}
			if strings.Contains(string(b), "evil") {
				t.Fatal("export built URLs from the Host header")
			}
		})
	}
}

// With the callback flow off, discovery offers the poll flow only: a
// released CLI then says the provider has no method it knows instead of
// opening a link /authorize refuses.
func TestExportWithoutCallbackFlow(t *testing.T) {
	e := newEnv(t, envOpts{external: "https://bind.example.com", interval: 3 * time.Second, noCallbackFlow: true})
	resp := e.do("GET", "/export", nil)
	b := readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /export: %d %s", resp.StatusCode, b)
	}
	var bp v1alpha1.BindingProvider
	if err := json.Unmarshal(b, &bp); err != nil {
		t.Fatal(err)
	}
	if len(bp.AuthenticationMethods) != 1 || bp.AuthenticationMethods[0].Method != v1alpha1.MethodOAuth2CodeGrantPoll ||
		bp.AuthenticationMethods[0].OAuth2CodeGrantPoll == nil || bp.AuthenticationMethods[0].OAuth2CodeGrant != nil {
		t.Fatalf("authenticationMethods %s, want the poll flow only", b)
	}
	if strings.Contains(string(b), `"OAuth2CodeGrant"`) || strings.Contains(string(b), "oauth2CodeGrant\"") {
		t.Fatalf("export still advertises the callback flow: %s", b)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	svc := newEnv(t, envOpts{}).svc
	for _, raw := range []string{"ftp://x", "https://", "https://u:p@x", "https://x/?a=b", "https://x/#f"} {
		u, _ := url.Parse(raw)
		if _, err := New(Config{ExternalURL: u, Sessions: svc}); err == nil {
			t.Errorf("New accepted external URL %q", raw)
		}
	}
	u, _ := url.Parse("https://x")
	if _, err := New(Config{ExternalURL: u}); err == nil {
		t.Error("New accepted a config without a session service")
	}
	if _, err := New(Config{ExternalURL: u, Sessions: svc, PollInterval: -time.Second}); err == nil {
		t.Error("New accepted a negative poll interval")
	}
	if _, err := New(Config{ExternalURL: u, Sessions: svc}); err != nil {
		t.Errorf("New refused a valid config: %v", err)
	}
}

func TestCreateSession(t *testing.T) {
	e := newEnv(t, envOpts{ttl: 7 * time.Minute})
	ps := e.createSession("")
	if ps.APIVersion != "kube-bind.io/v1alpha1" || ps.Kind != "Oauth2CodeGrantPollSession" {
		t.Errorf("apiVersion/kind = %q/%q", ps.APIVersion, ps.Kind)
	}
	if len(ps.SessionID) < 22 || !protocol.URLSafe(ps.SessionID, 64) {
		t.Errorf("session ID %q: want >= 128 bits of URL-safe characters", ps.SessionID)
	}
	if len(ps.SessionSecret) != 43 || !protocol.URLSafe(ps.SessionSecret, 64) {
		t.Errorf("secret %q: want 256 bits base64url without padding", ps.SessionSecret)
	}
	if !protocol.IssuedClusterID(ps.ClusterID) {
		t.Errorf("cluster ID %q is not of the issued format", ps.ClusterID)
	}
	// A new cluster ID comes with its secret, derived from the backend's key.
	if ps.ClusterID != clusterkey.NewClusterID(ps.SessionID) || ps.ClusterSecret != e.key.Secret(ps.ClusterID) || len(ps.ClusterSecret) != 43 {
		t.Errorf("cluster ID %q with secret %q: not the ones derived for the session", ps.ClusterID, ps.ClusterSecret)
	}
	if want := e.clock.Now().Add(7 * time.Minute); !ps.ExpiresAt.Equal(want) {
		t.Errorf("expiresAt %s, want %s", ps.ExpiresAt, want)
	}
	// Nothing is stored: the ID says what the session is, and its secret
	// is derived from the backend's key.
	sess, err := e.svc.Open(ps.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if sess.Secret != ps.SessionSecret || sess.Flow != sessionkey.FlowPoll || sess.ClusterID != "" || !sess.ExpiresAt.Equal(ps.ExpiresAt) {
		t.Errorf("session %+v as its ID says does not match the answer %+v", sess.Session, ps)
	}
	if got := e.stored(); got != [3]int{} {
		t.Errorf("creating a session stored %v (outcomes, deliveries, marks), want nothing", got)
	}
	if o := e.outcome(ps.SessionID); o.State != sessions.StatePending {
		t.Errorf("a new session is %v, want pending", o.State)
	}
	if ps2 := e.createSession(""); ps2.SessionID == ps.SessionID || ps2.SessionSecret == ps.SessionSecret || ps2.ClusterID == ps.ClusterID {
		t.Error("two sessions share an ID, secret or cluster ID")
	}
}

func TestCreateSessionClusterID(t *testing.T) {
	e := newEnv(t, envOpts{})
	ours := protocol.NewClusterID()
	for _, c := range []struct {
		name, body string
		keep       string // cluster ID expected back; "" = a new one
	}{
		{"ours kept", `{"clusterID":"` + ours + `"}`, ours},
		{"released CLI's kept", `{"clusterID":"aB3dE9"}`, "aB3dE9"},
		{"whitespace around", " \n{\"clusterID\": \"" + ours + "\"}\n ", ours},
		{"field name case-insensitive", `{"clusterId":"aB3dE9"}`, "aB3dE9"},
		{"empty object", `{}`, ""},
		{"null", `null`, ""},
		{"empty clusterID", `{"clusterID":""}`, ""},
		{"foreign format replaced", `{"clusterID":"../../etc/passwd"}`, ""},
		{"too long replaced", `{"clusterID":"` + strings.Repeat("a", 300) + `"}`, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ps := e.createSession(c.body)
			if c.keep != "" && (ps.ClusterID != c.keep || ps.ClusterSecret != "") {
				t.Fatalf("cluster ID %q with secret %q, want %q kept and no secret", ps.ClusterID, ps.ClusterSecret, c.keep)
			}
			if c.keep == "" && (!protocol.IssuedClusterID(ps.ClusterID) || ps.ClusterSecret != e.key.Secret(ps.ClusterID)) {
				t.Fatalf("cluster ID %q, want a newly issued one with its secret", ps.ClusterID)
			}
		})
	}
}

func TestCreateSessionBadRequests(t *testing.T) {
	e := newEnv(t, envOpts{})
	for name, body := range map[string]string{
		"malformed":     `{"clusterID":`,
		"not an object": `[1,2]`,
		"number":        `{"clusterID": 42}`,
		"unknown field": `{"cluster":"aB3dE9"}`,
		"trailing data": `{"clusterID":"aB3dE9"} {}`,
		"not JSON":      `clusterID=aB3dE9`,
	} {
		t.Run(name, func(t *testing.T) {
			msg := wantError(t, e.do("POST", "/sessions", strings.NewReader(body)), 400, "invalid_request")
			if strings.Contains(msg, "v1alpha1.") || strings.Contains(msg, "json: ") {
				t.Errorf("message %q leaks Go internals", msg)
			}
		})
	}
	// None counted as a session created.
	e.wantMetrics("kube_bind_backend_sessions_created_total 0")
}

func TestCreateSessionBodyLimit(t *testing.T) {
	e := newEnv(t, envOpts{})
	id := protocol.NewClusterID()
	prefix := `{"clusterID":"` + id + `"}`
	atLimit := prefix + strings.Repeat(" ", 4096-len(prefix))
	if ps := e.createSession(atLimit); ps.ClusterID != id {
		t.Fatalf("a body of exactly 4096 bytes was not accepted as such: %+v", ps)
	}
	wantError(t, e.do("POST", "/sessions", strings.NewReader(atLimit+" ")), 413, "request_too_large")
	fiveK := `{"clusterID":"` + strings.Repeat("x", 5<<10) + `"}`
	wantError(t, e.do("POST", "/sessions", strings.NewReader(fiveK)), 413, "request_too_large")
	// Without Content-Length (chunked), the limit holds while reading.
	wantError(t, e.do("POST", "/sessions", struct{ *strings.Reader }{strings.NewReader(fiveK)}), 413, "request_too_large")
	e.wantMetrics("kube_bind_backend_sessions_created_total 1")
}

// A session is derived from keys, not stored: however many are created,
// and however small the store's limits, POST /sessions answers 201 (never
// 503 "full"), and the store holds nothing for them. A session presenting
// a cluster ID carries it in its ID.
func TestCreateSessionNeverFull(t *testing.T) {
	e := newEnv(t, envOpts{limits: sessions.Limits{MaxPolledSessions: 2, MaxNoncesPerSession: 2}, ttl: time.Minute})
	seen := map[string]bool{}
	for i := 0; i < 200; i++ {
		body := ""
		if i%2 == 1 {
			body = `{"clusterID":"aB3dE9"}`
		}
		ps := e.createSession(body)
		if seen[ps.SessionID] {
			t.Fatalf("session ID %s issued twice", ps.SessionID)
		}
		seen[ps.SessionID] = true
		if i%2 == 1 && e.open(ps.SessionID).ClusterID != "aB3dE9" {
			t.Fatalf("session %s does not carry the presented cluster ID", ps.SessionID)
		}
	}
	if got := e.stored(); got != [3]int{} {
		t.Errorf("200 sessions stored %v (outcomes, deliveries, marks), want nothing", got)
	}
	e.wantMetrics("kube_bind_backend_sessions_created_total 200")
}

func TestNotFoundAndMethodNotAllowed(t *testing.T) {
	e := newEnv(t, envOpts{external: "https://bind.example.com/kb"})
	wantError(t, e.do("GET", "/nope", nil), 404, "not_found")
	wantError(t, e.do("GET", "/export", nil), 404, "not_found") // outside the prefix
	for _, c := range []struct{ method, path, allow string }{
		{"POST", "/kb/poll", "GET"},
		{"GET", "/kb/sessions", "POST"},
		{"DELETE", "/kb/export", "GET"},
		{"POST", "/healthz", "GET"},
	} {
		resp := e.do(c.method, c.path, nil)
		wantError(t, resp, 405, "method_not_allowed")
		if got := resp.Header.Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
	}
}

// The public probes say ready or not and nothing more: no check's name,
// no error (which may hold internal addresses); /metrics is not here.
func TestProbes(t *testing.T) {
	oidc := health.NewStatus("oidc", errors.New("discovery failing: dial tcp 10.0.0.7:443: connection refused"))
	cluster := health.CheckFunc("cluster", func(context.Context) error { return nil })
	e := newEnv(t, envOpts{readiness: []health.Check{oidc, cluster}})

	resp := e.do("GET", "/healthz", nil)
	if b := readAll(t, resp); resp.StatusCode != 200 || string(b) != "ok\n" {
		t.Fatalf("healthz: %d %q", resp.StatusCode, b)
	}
	for _, path := range []string{"/readyz", "/readyz?verbose"} {
		resp = e.do("GET", path, nil)
		if b := string(readAll(t, resp)); resp.StatusCode != 503 || b != "not ready\n" {
			t.Fatalf("%s while a check fails: %d %q, want 503 \"not ready\" and no detail", path, resp.StatusCode, b)
		}
		if resp.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("%s without Cache-Control: no-store", path)
		}
	}
	oidc.Set(nil)
	resp = e.do("GET", "/readyz?verbose", nil)
	if b := string(readAll(t, resp)); resp.StatusCode != 200 || b != "ok\n" {
		t.Fatalf("readyz when all pass: %d %q", resp.StatusCode, b)
	}
	wantError(t, e.do("GET", "/metrics", nil), 404, "not_found")
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, envOpts{})
	ps := e.createSession("")
	readAll(t, e.poll(ps))
	readAll(t, e.poll(ps)) // too soon
	b := e.metricsText()
	for _, want := range []string{
		"kube_bind_backend_sessions_created_total 1",
		`kube_bind_backend_polls_total{outcome="authorization_pending"} 1`,
		`kube_bind_backend_polls_total{outcome="slow_down"} 1`,
		`kube_bind_backend_http_request_duration_seconds_count{code="403",route="/poll"} 1`,
		`kube_bind_backend_http_request_duration_seconds_count{code="201",route="/sessions"} 1`,
	} {
		if !strings.Contains(b, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// Two handlers with their own registries coexist.
	newEnv(t, envOpts{})
}

func TestBrowserRoutes(t *testing.T) {
	e := newEnv(t, envOpts{})
	resp := e.do("GET", "/authorize?s=x", nil)
	b := string(readAll(t, resp))
	if resp.StatusCode != 503 || !strings.Contains(b, "not available") {
		t.Fatalf("authorize without browser: %d %q", resp.StatusCode, b)
	}

	// The real browser part under a path prefix: each route reaches its
	// handler through the one router (the pages say which handler it
	// was), and everything else gets the router's own answers.
	login := &fakes.Login{}
	e = newEnv(t, envOpts{external: "https://bind.example.com/kb", login: login})
	for _, c := range []struct {
		method, path string
		status       int
		says         string
	}{
		{"GET", "/kb/authorize", 400, "neither a signature nor a callback"},
		{"HEAD", "/kb/authorize?p=41234&s=aB3dE9&c=Zx81Qp", 200, ""},
		{"GET", "/kb/callback", 400, "cannot be finished"},
		{"GET", "/kb/bind?s=x", 401, "not signed in"},
		{"POST", "/kb/bind", 401, "not signed in"},
		{"PUT", "/kb/bind", 405, "not allowed"},
		{"HEAD", "/kb/callback", 405, ""},
		{"GET", "/kb/static/app.css", 404, "not_found"},
		{"GET", "/authorize", 404, "not_found"},
	} {
		resp := e.do(c.method, c.path, nil)
		b := string(readAll(t, resp))
		if resp.StatusCode != c.status || !strings.Contains(b, c.says) {
			t.Errorf("%s %s: %d, want %d saying %q:\n%s", c.method, c.path, resp.StatusCode, c.status, c.says, b)
		}
		if resp.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("%s %s: no Cache-Control: no-store", c.method, c.path)
		}
	}
	if got := e.stored(); got != [3]int{} || login.Begun() != 0 {
		t.Fatalf("refused requests stored %v (outcomes, deliveries, marks) and began %d logins", got, login.Begun())
	}
	metrics := e.metricsText()
	for _, want := range []string{`code="400",route="/authorize"`, `code="405",route="/bind"`, `code="404",route="unmatched"`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// A panic is a logged 500, not a dropped connection.
	login.Panic.Store(true)
	wantError(t, e.do("GET", "/kb/authorize?p=41234&s=aB3dE9&c=Zx81Qp", nil), 500, "internal_error")
	if !strings.Contains(e.logs.String(), "panic while serving a request") {
		t.Error("panic not logged")
	}
}
