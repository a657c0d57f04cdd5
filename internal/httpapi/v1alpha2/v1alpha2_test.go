package v1alpha2

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/httpapi"
	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/httpapi/mount"
	"github.com/kbprovider/backend/internal/httpapi/pollsession"
	apiv1alpha1 "github.com/kbprovider/backend/internal/httpapi/v1alpha1"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/oidc/clitoken"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/fakes"
	v1alpha1 "github.com/kbprovider/backend/pkg/apis/v1alpha1"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
	"github.com/kbprovider/backend/pkg/protocol"
	"github.com/kbprovider/backend/web"
)

const issuer = fakes.Issuer

// testOffers: one implicit offer and one template with a claim and a
// namespace, in one collection.
var testOffers = fakes.Offers{Items: []offers.Offer{
	{Name: "widgets.example.com", Implicit: true, SchemaUpdatePolicy: v1alpha2.SchemaUpdateAlways,
		Resources: []v1alpha2.Resource{{Group: "example.com", Resource: "widgets", Versions: []string{"v1"}}}},
	{Name: "mangodb-with-secrets", Description: "A MangoDB and its credentials", SchemaUpdatePolicy: v1alpha2.SchemaUpdateNever,
		Resources: []v1alpha2.Resource{{Group: "mangodb.com", Resource: "mangodbs", Versions: []string{"v1"}}},
		PermissionClaims: []v1alpha2.PermissionClaim{{Resource: "secrets", Selector: v1alpha2.Selector{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "cowboy"}}}}},
		Namespaces: []v1alpha2.NameRef{{Name: "shared"}}},
}, Shown: []offers.Collection{{Name: "databases", Description: "Databases", Offers: []string{"mangodb-with-secrets"}}}}

type env struct {
	t      *testing.T
	srv    *httptest.Server
	clock  *testutil.Clock
	tokens *clitoken.Tokens
	prov   *fakes.Provisioner
	login  *fakes.Login
	store  *memory.Store
}

func newEnv(t *testing.T) *env { t.Helper(); return newEnvWith(t, envOptions{}) }

type envOptions struct {
	noCallbackFlow bool // --callback-flow=false
	allows         func(clitoken.User) bool
	// requestRate and bindRate pace the bearer routes per user.
	requestRate, bindRate float64
	// prefix is the external URL's path ("": none).
	prefix string
	// offers replace testOffers.
	offers *fakes.Offers
}

func newEnvWith(t *testing.T, o envOptions) *env {
	noCallbackFlow := o.noCallbackFlow
	t.Helper()
	e := &env{t: t, clock: testutil.ClockAt(time.Now().Truncate(time.Second)), prov: &fakes.Provisioner{},
		login: &fakes.Login{User: "alice"}}
	e.srv = httptest.NewUnstartedServer(nil)
	ext, _ := url.Parse("http://" + e.srv.Listener.Addr().String() + o.prefix)
	keys, _ := sessionkey.New(bytes.Repeat([]byte("s"), 32))
	ck, _ := clusterkey.New(bytes.Repeat([]byte("k"), 32))
	offered := testOffers
	if o.offers != nil {
		offered = *o.offers
	}
	e.store = memory.New(sessions.Limits{}, e.clock.Now)
	svc, err := lifecycle.New(lifecycle.Config{Store: e.store, Keys: keys, ClusterKey: ck,
		Now: e.clock.Now, Catalog: fakes.Catalog{}, Provisioner: e.prov, Offers: offered})
	if err != nil {
		t.Fatal(err)
	}
	e.tokens, err = clitoken.New(clitoken.Config{SessionKeys: [][]byte{bytes.Repeat([]byte("s"), 32)}, Issuer: issuer, Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	bh, err := browser.New(browser.Config{ExternalURL: ext, ProviderName: "Test", Sessions: svc, Login: e.login,
		CookieHashKeys:  [][]byte{bytes.Repeat([]byte("h"), 32)},
		CookieBlockKeys: [][]byte{bytes.Repeat([]byte("b"), 32)}, Now: e.clock.Now,
		Tokens: e.tokens, NoCallbackFlow: noCallbackFlow})
	if err != nil {
		t.Fatal(err)
	}
	pollSessions, err := pollsession.New(svc, nil)
	if err != nil {
		t.Fatal(err)
	}
	v1, err := apiv1alpha1.New(apiv1alpha1.Config{ExternalURL: ext, PrettyName: "Test", Sessions: pollSessions, NoCallbackFlow: noCallbackFlow})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(Config{ExternalURL: ext, PrettyName: "Test", Sessions: svc, PollSessions: pollSessions, Tokens: e.tokens,
		Issuer: issuer, Browser: bh, PollInterval: 2 * time.Second,
		NoCallbackFlow: noCallbackFlow, Allows: o.allows, RequestRate: o.requestRate, BindRate: o.bindRate, Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	handler, err := httpapi.New(httpapi.Config{ExternalURL: ext, Sessions: svc,
		Now: e.clock.Now, Parts: []mount.Part{v1, bh, h}})
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Config.Handler = handler
	e.srv.Start()
	t.Cleanup(e.srv.Close)
	return e
}

// client is a browser: a cookie jar, no redirects followed.
func (e *env) client() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func (e *env) do(c *http.Client, method, path string, body io.Reader, hdr ...string) (*http.Response, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// loginAt opens path (a login link) and comes back from the identity
// provider: the answer of the login callback.
func (e *env) loginAt(c *http.Client, path string) *http.Response {
	e.t.Helper()
	resp, body := e.do(c, "GET", path, nil)
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "https://idp.example.com/auth?state=") {
		e.t.Fatalf("GET %s: %d %s %s", path, resp.StatusCode, resp.Header.Get("Location"), body)
	}
	u, _ := url.Parse(resp.Header.Get("Location"))
	resp, _ = e.do(c, "GET", "/callback?state="+u.Query().Get("state"), nil)
	return resp
}

const cliCallback = "http://127.0.0.1:41234/callback"

func TestExports(t *testing.T) {
	e := newEnv(t)
	resp, body := e.do(e.client(), "GET", "/api/exports", nil)
	var doc v1alpha2.BindingProvider
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &doc) != nil {
		t.Fatalf("GET /api/exports: %d %s", resp.StatusCode, body)
	}
	if doc.APIVersion != "v1alpha2" || doc.Kind != "BindingProvider" || doc.Version != ProtocolVersion || len(doc.AuthenticationMethods) != 2 ||
		doc.AuthenticationMethods[0].Method != "OAuth2CodeGrantPoll" || doc.AuthenticationMethods[0].OAuth2CodeGrantPoll.SessionURL != e.srv.URL+"/api/sessions" ||
		doc.AuthenticationMethods[0].OAuth2CodeGrantPoll.AuthenticatedURL != e.srv.URL+"/authorize" ||
		doc.AuthenticationMethods[1].Method != "OAuth2CodeGrant" || doc.AuthenticationMethods[1].OAuth2CodeGrant.AuthenticatedURL != e.srv.URL+"/api/authorize" {
		t.Errorf("document %s", body)
	}
	resp, _ = e.do(e.client(), "GET", "/exports?a=1&b=x%20y", nil)
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/api/exports?a=1&b=x%20y" {
		t.Errorf("GET /exports: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	// The v1alpha1 document is unchanged beside it.
	resp, body = e.do(e.client(), "GET", "/export", nil)
	if resp.StatusCode != 200 || !strings.Contains(body, `"apiVersion":"v1alpha1"`) {
		t.Errorf("GET /export: %d %s", resp.StatusCode, body)
	}
}

// loginQuery is the query of `kubectl bind login`.
func loginQuery() url.Values {
	return url.Values{"redirect_url": {cliCallback}, "session_id": {"ABCDEFGHIJKLMNOPQRSTUVWXYZ"}, "client_type": {"cli"}}
}

func TestCLILogin(t *testing.T) {
	e := newEnv(t)
	resp := e.loginAt(e.client(), "/api/authorize?"+loginQuery().Encode())
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || loc == nil || loc.Scheme+"://"+loc.Host+loc.Path != cliCallback {
		t.Fatalf("login callback: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	q := loc.Query()
	if q.Get("token_type") != "Bearer" || q.Get("expires_in") != strconv.Itoa(int(clitoken.DefaultTTL/time.Second)) || q.Has("error") {
		t.Errorf("callback query %v", q)
	}
	c, err := e.tokens.Verify(q.Get("access_token"))
	if err != nil || c.Subject != "alice" {
		t.Errorf("the token: %+v %v", c, err)
	}
	checkNoTrace(t, "the redirect with the CLI token", resp)
	if resp.Header.Get("Set-Cookie") != "" {
		t.Errorf("the CLI login set a cookie: %s", resp.Header.Get("Set-Cookie"))
	}

	// A refused login still reaches the CLI, with the error.
	e.login.Err = oidc.ErrAccessDenied
	resp = e.loginAt(e.client(), "/api/authorize?"+loginQuery().Encode())
	loc, _ = url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || loc.Query().Get("error") != "access_denied" || loc.Query().Has("access_token") ||
		loc.Query().Get("error_description") == "" {
		t.Errorf("refused login: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// TestAuthorizeRefusals: a bad query is a 400 before any login.
func TestAuthorizeRefusals(t *testing.T) {
	e := newEnv(t)
	for name, mut := range map[string]func(url.Values){
		"https redirect":     func(q url.Values) { q.Set("redirect_url", "https://127.0.0.1:41234/callback") },
		"remote redirect":    func(q url.Values) { q.Set("redirect_url", "http://evil.example.com:41234/callback") },
		"no port":            func(q url.Values) { q.Set("redirect_url", "http://127.0.0.1/callback") },
		"port 0":             func(q url.Values) { q.Set("redirect_url", "http://127.0.0.1:0/callback") },
		"other path":         func(q url.Values) { q.Set("redirect_url", "http://127.0.0.1:41234/cb") },
		"query in redirect":  func(q url.Values) { q.Set("redirect_url", "http://127.0.0.1:41234/callback?x=1") },
		"user in redirect":   func(q url.Values) { q.Set("redirect_url", "http://a@127.0.0.1:41234/callback") },
		"two redirects":      func(q url.Values) { q.Add("redirect_url", cliCallback) },
		"no redirect":        func(q url.Values) { q.Del("redirect_url") },
		"no session":         func(q url.Values) { q.Del("session_id") },
		"long session":       func(q url.Values) { q.Set("session_id", strings.Repeat("a", 129)) },
		"bad session":        func(q url.Values) { q.Set("session_id", "a/b") },
		"other client type":  func(q url.Values) { q.Set("client_type", "web") },
		"provider cluster":   func(q url.Values) { q.Set("cluster_id", "c1") },
		"decimal dot host":   func(q url.Values) { q.Set("redirect_url", "http://127.1:41234/callback") },
		"upper-case scheme":  func(q url.Values) { q.Set("redirect_url", "HTTP://127.0.0.1:41234/callback") },
		"encoded path":       func(q url.Values) { q.Set("redirect_url", "http://127.0.0.1:41234/%63allback") },
		"fragment":           func(q url.Values) { q.Set("redirect_url", "http://127.0.0.1:41234/callback#x") },
		"leading zero port":  func(q url.Values) { q.Set("redirect_url", "http://127.0.0.1:041234/callback") },
		"port out of range":  func(q url.Values) { q.Set("redirect_url", "http://127.0.0.1:65536/callback") },
		"backslash host":     func(q url.Values) { q.Set("redirect_url", `http://127.0.0.1:41234\@evil.com/callback`) },
		"empty cluster list": func(q url.Values) { q["cluster_id"] = []string{"", ""} },
	} {
		q := loginQuery()
		mut(q)
		paths := []string{"/api/authorize?", "/?consumer_id=c0ffee-1&"}
		if name == "other client type" {
			paths = paths[:1] // the root page does not read it
		}
		for _, path := range paths {
			resp, body := e.do(e.client(), "GET", path+q.Encode(), nil)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(resp.Header.Get("Content-Type"), "text/html") {
				t.Errorf("%s at %s: %d %s", name, path, resp.StatusCode, body)
			}
		}
	}
	if e.login.Pending() != 0 {
		t.Errorf("%d logins began", e.login.Pending())
	}
	// Accepted spellings.
	for _, r := range []string{"http://localhost:1/callback", "http://[::1]:65535/callback", cliCallback} {
		q := loginQuery()
		q.Set("redirect_url", r)
		q.Set("cluster_id", "")
		if resp, body := e.do(e.client(), "GET", "/api/authorize?"+q.Encode(), nil); resp.StatusCode != http.StatusSeeOther {
			t.Errorf("%s: %d %s", r, resp.StatusCode, body)
		}
	}
	// HEAD starts nothing.
	before := e.login.Pending()
	if resp, _ := e.do(e.client(), "HEAD", "/api/authorize?"+loginQuery().Encode(), nil); resp.StatusCode != 200 || e.login.Pending() != before {
		t.Errorf("HEAD: %d, logins %d -> %d", resp.StatusCode, before, e.login.Pending())
	}
}

func (e *env) token(subject string) string {
	tok, _, err := e.tokens.Issue(issuer, clitoken.User{Subject: subject})
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

// A bind with a CLI token records the login's verified address and
// groups, which the token carries; a token of a user the allow-lists no
// longer admit binds nothing and lists nothing (403).
func TestBindJudgesTheTokensUser(t *testing.T) {
	e := newEnvWith(t, envOptions{allows: func(u clitoken.User) bool { return slices.Contains(u.Groups, "binders") }})
	tok := func(groups ...string) string {
		tok, _, err := e.tokens.Issue(issuer, clitoken.User{Subject: "alice", Email: "alice@example.com", Groups: groups, GroupsKnown: true})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	allowed := []string{"Authorization", "Bearer " + tok("binders", "devs"), "Content-Type", "application/json"}
	if resp, body := e.do(e.client(), "POST", "/api/bind", strings.NewReader(bindBody("my-db", "mangodb-with-secrets", "2f1c-uid")), allowed...); resp.StatusCode != 200 {
		t.Fatalf("bind: %d %s", resp.StatusCode, body)
	}
	calls := e.prov.Take()
	if len(calls) != 1 || calls[0].Consumer.Claims == nil ||
		!reflect.DeepEqual(*calls[0].Consumer.Claims, binding.Claims{Email: "alice@example.com", Groups: []string{"binders", "devs"}, GroupsKnown: true}) {
		t.Fatalf("provisioned %+v", calls)
	}
	removed := []string{"Authorization", "Bearer " + tok("devs"), "Content-Type", "application/json"}
	for _, path := range []string{"/api/bind", "/api/templates", "/api/collections"} {
		method, body := "GET", io.Reader(nil)
		if path == "/api/bind" {
			method, body = "POST", strings.NewReader(bindBody("my-db", "mangodb-with-secrets", "2f1c-uid"))
		}
		resp, got := e.do(e.client(), method, path, body, removed...)
		if resp.StatusCode != 403 || !strings.Contains(got, v1alpha2.ErrorAuthorizationFailed) {
			t.Errorf("%s with the token of a user no longer admitted: %d %s", path, resp.StatusCode, got)
		}
	}
	if calls := e.prov.Take(); len(calls) != 0 {
		t.Errorf("provisioned for a user no longer admitted: %+v", calls)
	}
}

func TestTemplatesAndCollections(t *testing.T) {
	e := newEnv(t)
	auth := []string{"Authorization", "Bearer " + e.token("alice")}
	resp, body := e.do(e.client(), "GET", "/api/templates", nil, auth...)
	var list v1alpha2.APIServiceExportTemplateList
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &list) != nil || list.Kind != "APIServiceExportTemplateList" || len(list.Items) != 2 {
		t.Fatalf("templates: %d %s", resp.StatusCode, body)
	}
	if list.Items[0].Metadata.Annotations[AnnotationImplicit] != "true" || list.Items[1].Metadata.Annotations[AnnotationImplicit] != "" ||
		list.Items[1].Spec.PermissionClaims[0].Selector.LabelSelector.MatchLabels["app"] != "cowboy" ||
		list.Items[1].Spec.SchemaUpdatePolicy != "Never" || list.Items[1].Spec.Namespaces[0].Name != "shared" {
		t.Errorf("templates %s", body)
	}
	resp, body = e.do(e.client(), "GET", "/api/collections", nil, auth...)
	var cols v1alpha2.CollectionList
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &cols) != nil || len(cols.Items) != 1 ||
		cols.Items[0].Spec.Templates[0].Name != "mangodb-with-secrets" {
		t.Errorf("collections: %d %s", resp.StatusCode, body)
	}

	expired := e.token("alice")
	e.clock.Advance(clitoken.DefaultTTL)
	for name, hdr := range map[string][]string{
		"none":      nil,
		"basic":     {"Authorization", "Basic YTpi"},
		"garbage":   {"Authorization", "Bearer kbt1.AAAA.AAAA"},
		"expired":   {"Authorization", "Bearer " + expired},
		"no scheme": {"Authorization", e.token("alice")},
	} {
		for _, path := range []string{"/api/templates", "/api/collections"} {
			resp, body := e.do(e.client(), "GET", path, nil, hdr...)
			var apiErr v1alpha2.Error
			if resp.StatusCode != 401 || json.Unmarshal([]byte(body), &apiErr) != nil || apiErr.Kind != "Error" ||
				apiErr.APIVersion != "kube-bind.io/v1alpha2" || apiErr.Code != v1alpha2.ErrorAuthenticationFailed ||
				resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s %s: %d %s", name, path, resp.StatusCode, body)
			}
		}
	}
	// The CLI's stored cluster_id: this provider has no other cluster.
	resp, body = e.do(e.client(), "GET", "/api/templates?cluster_id=c1", nil, "Authorization", "Bearer "+e.token("alice"))
	if resp.StatusCode != 400 {
		t.Errorf("cluster_id: %d %s", resp.StatusCode, body)
	}
}

// bindBody is what kubectl-bind v0.8.2 sends (a marshalled Kubernetes
// object).
func bindBody(name, template, identity string) string {
	return fmt.Sprintf(`{"metadata":{"name":%q,"creationTimestamp":null},"spec":{"templateRef":{"name":%q},`+
		`"clusterIdentity":{"identity":%q},"author":""},"status":{}}`, name, template, identity)
}

func TestBind(t *testing.T) {
	e := newEnv(t)
	auth := []string{"Authorization", "Bearer " + e.token("alice"), "Content-Type", "application/json"}
	resp, body := e.do(e.client(), "POST", "/api/bind", strings.NewReader(bindBody("my-db", "mangodb-with-secrets", "2f1c-uid")), auth...)
	if resp.StatusCode != 200 {
		t.Fatalf("bind: %d %s", resp.StatusCode, body)
	}
	var br v1alpha2.BindingResponse
	if err := json.Unmarshal([]byte(body), &br); err != nil {
		t.Fatal(err)
	}
	if br.APIVersion != "kube-bind.io/v1alpha2" || br.Kind != "BindingResponse" || br.Authentication.OAuth2CodeGrant == nil ||
		br.Authentication.OAuth2CodeGrant.ID != issuer+"/alice" || br.ProviderNamespace != "kb-ns" || br.BindingName != "my-db" ||
		len(br.Requests) != 1 || len(br.Kubeconfig) == 0 {
		t.Fatalf("response %s", body)
	}
	var req v1alpha2.APIServiceExportRequestResponse
	if err := json.Unmarshal(br.Requests[0], &req); err != nil {
		t.Fatal(err)
	}
	if req.APIVersion != "kube-bind.io/v1alpha2" || req.Kind != "APIServiceExportRequest" || req.Metadata.Name != "my-db" ||
		req.Spec.SchemaUpdatePolicy != "Never" || len(req.Spec.Resources) != 1 ||
		req.Spec.Resources[0].Resource != "mangodbs" || len(req.Spec.PermissionClaims) != 1 || len(req.Spec.Namespaces) != 1 {
		t.Errorf("request %s", br.Requests[0])
	}
	calls := e.prov.Take()
	if len(calls) != 1 || calls[0].Consumer.ID() != issuer+"/alice" || calls[0].ClusterID != "2f1c-uid" || calls[0].Consumer.Proof != binding.ProofToken ||
		!slices.Equal(calls[0].Resources, []binding.Resource{{Group: "mangodb.com", Resource: "mangodbs", Request: "my-db"}}) {
		t.Errorf("provisioned %+v", calls)
	}
	if m := e.prov.Marked(); !slices.Equal(m, []string{fakes.ProvisionedNamespace}) {
		t.Errorf("marked delivered %v, want [%s]", m, fakes.ProvisionedNamespace)
	}
	// The delivery cannot be recorded: no response leaves, 503.
	e.prov.MarkErr = errors.New("the API server is away")
	resp, body = e.do(e.client(), "POST", "/api/bind", strings.NewReader(bindBody("my-db", "mangodb-with-secrets", "2f1c-uid")), auth...)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || strings.Contains(body, "kubeconfig") {
		t.Errorf("bind with the mark failing: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	e.prov.MarkErr = nil
	e.prov.Take()
	// The cluster binds mangodbs through my-db: another request for it
	// would fail after the bind, so it is refused with 409 and the reason;
	// my-db again binds.
	e.prov.Bound = map[string]string{"mangodbs.mangodb.com": "my-db"}
	resp, body = e.do(e.client(), "POST", "/api/bind", strings.NewReader(bindBody("other-db", "mangodb-with-secrets", "2f1c-uid")), auth...)
	if resp.StatusCode != 409 || !strings.Contains(body, "mangodbs.mangodb.com is already bound in this cluster by my-db, not other-db") || strings.Contains(body, "kubeconfig") {
		t.Errorf("bind of a resource bound under another name: %d %s", resp.StatusCode, body)
	}
	if resp, body = e.do(e.client(), "POST", "/api/bind", strings.NewReader(bindBody("my-db", "mangodb-with-secrets", "2f1c-uid")), auth...); resp.StatusCode != 200 {
		t.Errorf("rebind of my-db: %d %s", resp.StatusCode, body)
	}
	e.prov.Bound = nil
	e.prov.Take()

	for name, c := range map[string]struct {
		body   string
		status int
		code   string
	}{
		"unknown template": {bindBody("x", "nope", "uid"), 404, v1alpha2.ErrorResourceNotFound},
		"bad identity":     {bindBody("x", "widgets.example.com", "a b"), 400, v1alpha2.ErrorBadRequest},
		// The form of the poll flow's cluster IDs: only that flow, with
		// its proof, reaches their namespaces.
		"issued cluster ID": {bindBody("x", "widgets.example.com", "abcdefghijklmnopqrstuvwxyz"), 400, v1alpha2.ErrorBadRequest},
		"bad name":          {bindBody("X_", "widgets.example.com", "uid"), 400, v1alpha2.ErrorBadRequest},
		"unknown field":     {`{"metadata":{"name":"x"},"spec":{"templateRef":{"name":"t"},"clusterIdentity":{"identity":"u"},"extra":1}}`, 400, v1alpha2.ErrorBadRequest},
		"trailing data":     {bindBody("x", "widgets.example.com", "uid") + "{}", 400, v1alpha2.ErrorBadRequest},
		"not JSON":          {"name=x", 400, v1alpha2.ErrorBadRequest},
		"too large":         {`{"metadata":{"name":"x","annotations":{"a":"` + strings.Repeat("a", MaxBindBody) + `"}}}`, 413, v1alpha2.ErrorBadRequest},
	} {
		resp, body := e.do(e.client(), "POST", "/api/bind", strings.NewReader(c.body), auth...)
		var apiErr v1alpha2.Error
		if resp.StatusCode != c.status || json.Unmarshal([]byte(body), &apiErr) != nil || apiErr.Code != c.code {
			t.Errorf("%s: %d %s", name, resp.StatusCode, body)
		}
	}
	if calls := e.prov.Take(); len(calls) != 0 {
		t.Errorf("refused binds provisioned %+v", calls)
	}
	// An outage of the provider cluster: 503 with Retry-After.
	e.prov.FailNext(errors.New("connection refused"))
	resp, body = e.do(e.client(), "POST", "/api/bind", strings.NewReader(bindBody("x", "widgets.example.com", "uid")), auth...)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, v1alpha2.ErrorUnavailable) {
		t.Errorf("outage: %d %s", resp.StatusCode, body)
	}
	// The user's cap: 403 in the error format, naming it.
	e.prov.FailNext(&binding.ClusterCapError{Cap: 10, Have: 10})
	resp, body = e.do(e.client(), "POST", "/api/bind", strings.NewReader(bindBody("x", "widgets.example.com", "uid")), auth...)
	if resp.StatusCode != 403 || !strings.Contains(body, v1alpha2.ErrorAuthorizationFailed) || !strings.Contains(body, "at most 10 clusters per user") {
		t.Errorf("cap: %d %s", resp.StatusCode, body)
	}
	// Without a token nothing is provisioned.
	e.prov.Take()
	resp, _ = e.do(e.client(), "POST", "/api/bind", strings.NewReader(bindBody("x", "widgets.example.com", "uid")))
	if resp.StatusCode != 401 || len(e.prov.Take()) != 0 {
		t.Errorf("no token: %d", resp.StatusCode)
	}
}

// The bearer routes are paced per user: beyond the burst 429 with
// Retry-After in the error format, for that user only; binds have a
// bucket of their own, per minute.
func TestTokenRoutesPacedPerUser(t *testing.T) {
	e := newEnvWith(t, envOptions{requestRate: 1, bindRate: 2})
	alice := []string{"Authorization", "Bearer " + e.token("alice")}
	for i := range 3 {
		if resp, body := e.do(e.client(), "GET", "/api/templates", nil, alice...); resp.StatusCode != 200 {
			t.Fatalf("request %d of the burst: %d %s", i, resp.StatusCode, body)
		}
	}
	resp, body := e.do(e.client(), "GET", "/api/collections", nil, alice...)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(body, "too many requests") {
		t.Fatalf("beyond the burst: %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if resp, body := e.do(e.client(), "GET", "/api/templates", nil, "Authorization", "Bearer "+e.token("bob")); resp.StatusCode != 200 {
		t.Fatalf("another user: %d %s", resp.StatusCode, body)
	}
	// Binds: 10 at once, then one per 30 s (2 per minute).
	auth := append(alice, "Content-Type", "application/json")
	for i := range clitoken.BindBurst + 1 {
		e.clock.Advance(time.Second) // a request token each
		resp, body := e.do(e.client(), "POST", "/api/bind", strings.NewReader(bindBody("x", "widgets.example.com", "uid")), auth...)
		if i < clitoken.BindBurst && resp.StatusCode != 200 {
			t.Fatalf("bind %d: %d %s", i, resp.StatusCode, body)
		}
		if i == clitoken.BindBurst && (resp.StatusCode != 429 || !strings.Contains(body, "too many binds") || resp.Header.Get("Retry-After") != "20") {
			t.Fatalf("bind beyond the burst: %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	}
	if n := len(e.prov.Take()); n != clitoken.BindBurst {
		t.Errorf("%d binds provisioned, want %d", n, clitoken.BindBurst)
	}
}

// A browser-flow bind beyond the user's cap goes to the CLI's callback
// as access_denied with the words naming the cap, so that the CLI stops
// waiting and says why.
func TestBrowserFlowBeyondTheCap(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	q := url.Values{"session_id": {"CLISESSION234567"}, "redirect_url": {cliCallback}, "consumer_id": {"9a7d-uid"}}
	sel := e.loginAt(c, "/?"+q.Encode()).Header.Get("Location")
	_, page := e.do(c, "GET", sel, nil)
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the page: %s", page)
	}
	sid, _ := url.ParseQuery(strings.TrimPrefix(sel, "/bind?"))
	form := url.Values{web.FieldCSRF: {m[1]}, "s": {sid.Get("s")}, web.FieldAPI: {"widgets.example.com"},
		web.FieldAction: {web.ActionBind}, web.FieldConfirm: {web.ConfirmYes}}
	e.prov.FailNext(&binding.ClusterCapError{Cap: 10, Have: 10})
	resp, body := e.do(c, "POST", "/bind", strings.NewReader(form.Encode()), "Content-Type", "application/x-www-form-urlencoded")
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || loc == nil || loc.Query().Get("error") != "access_denied" ||
		!strings.Contains(loc.Query().Get("error_description"), "at most 10 clusters per user") {
		t.Fatalf("bind beyond the cap: %d %s %s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	if calls := e.prov.Take(); len(calls) != 1 || calls[0].Consumer.Proof != binding.ProofLogin {
		t.Errorf("provisioned %+v, want one call vouched for by the login", calls)
	}
}

var csrfRE = regexp.MustCompile(`name="` + web.FieldCSRF + `" value="([^"]+)"`)

// TestBrowserFlow: plain `kubectl bind` from the root page to the CLI's
// callback with a v1alpha2 response.
func TestBrowserFlow(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	q := url.Values{"session_id": {"CLISESSION234567"}, "redirect_url": {cliCallback}, "consumer_id": {"9a7d-uid"}}
	resp := e.loginAt(c, "/?"+q.Encode())
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/bind?s=") {
		t.Fatalf("login callback: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	sel := resp.Header.Get("Location")
	resp, page := e.do(c, "GET", sel, nil)
	if resp.StatusCode != 200 || !strings.Contains(page, "mangodb-with-secrets") || !strings.Contains(page, "Secrets labelled app=cowboy") ||
		!strings.Contains(page, cliCallback) {
		t.Fatalf("selection page: %d %s", resp.StatusCode, page)
	}
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no CSRF token on the page")
	}
	sid, _ := url.ParseQuery(strings.TrimPrefix(sel, "/bind?"))
	form := url.Values{web.FieldCSRF: {m[1]}, "s": {sid.Get("s")}, web.FieldAPI: {"mangodb-with-secrets", "widgets.example.com"},
		web.FieldAction: {web.ActionBind}, web.FieldConfirm: {web.ConfirmYes}}
	// Without the CSRF token: refused, nothing bound.
	bad := url.Values{}
	for k, v := range form {
		bad[k] = v
	}
	bad.Set(web.FieldCSRF, "x")
	if resp, _ := e.do(c, "POST", "/bind", strings.NewReader(bad.Encode()), "Content-Type", "application/x-www-form-urlencoded"); resp.StatusCode != 403 || len(e.prov.Take()) != 0 {
		t.Fatalf("bad CSRF token: %d", resp.StatusCode)
	}
	resp, body := e.do(c, "POST", "/bind", strings.NewReader(form.Encode()), "Content-Type", "application/x-www-form-urlencoded")
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || loc == nil || loc.Scheme+"://"+loc.Host+loc.Path != cliCallback {
		t.Fatalf("bind: %d %s %s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	if loc.Query().Get("session_id") != "CLISESSION234567" {
		t.Errorf("session_id %q", loc.Query().Get("session_id"))
	}
	checkNoTrace(t, "the redirect with binding_response", resp)
	raw, err := base64.URLEncoding.DecodeString(loc.Query().Get("binding_response"))
	if err != nil {
		t.Fatalf("binding_response is not padded base64url: %v", err)
	}
	var br v1alpha2.BindingResponse
	if err := json.Unmarshal(raw, &br); err != nil || br.APIVersion != "kube-bind.io/v1alpha2" || len(br.Requests) != 2 ||
		br.Authentication.OAuth2CodeGrant.SessionID != "CLISESSION234567" {
		t.Fatalf("response %s %v", raw, err)
	}
	var r0, r1 v1alpha2.APIServiceExportRequestResponse
	json.Unmarshal(br.Requests[0], &r0)
	json.Unmarshal(br.Requests[1], &r1)
	if r0.Metadata.Name != "mangodb-with-secrets" || r1.Metadata.Name != "widgets.example.com" || r1.Spec.SchemaUpdatePolicy != "Always" {
		t.Errorf("requests %s %s", br.Requests[0], br.Requests[1])
	}
	calls := e.prov.Take()
	if len(calls) != 1 || calls[0].ClusterID != "9a7d-uid" || len(calls[0].Resources) != 2 {
		t.Errorf("provisioned %+v", calls)
	}
	if m := e.prov.Marked(); len(m) != 1 {
		t.Errorf("deliveries marked: %v", m)
	}

	// A denied login ends at the CLI with an error and a decodable
	// binding_response.
	e.login.Err = oidc.ErrAccessDenied
	resp = e.loginAt(e.client(), "/?"+q.Encode())
	loc, _ = url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || loc.Query().Get("error") != "access_denied" || loc.Query().Get("session_id") != "CLISESSION234567" {
		t.Fatalf("denied: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if b, err := base64.URLEncoding.DecodeString(loc.Query().Get("binding_response")); err != nil || string(b) != "{}" {
		t.Errorf("denied binding_response %q %v", b, err)
	}
	checkNoTrace(t, "the redirect with an error", resp)
}

// checkNoTrace: an answer whose redirect URL carries a credential is not
// cached and sends no Referer on.
func checkNoTrace(t *testing.T, what string, resp *http.Response) {
	t.Helper()
	if got := resp.Header.Get("Referrer-Policy"); got != "no-referrer" {
		t.Errorf("%s: Referrer-Policy %q, want no-referrer", what, got)
	}
	if got := resp.Header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("%s: Cache-Control %q, want no-store", what, got)
	}
}

// With the callback flow off (--callback-flow=false) the released CLI's
// flows are gone: discovery offers the poll method only; the CLI login
// and the browser flow answer 404 with a page that says so before any
// login (HEAD too); the CLI token routes answer 404 even to a token
// issued before; the poll sessions still work.
func TestNoCallbackFlow(t *testing.T) {
	e := newEnvWith(t, envOptions{noCallbackFlow: true})
	resp, body := e.do(e.client(), "GET", "/api/exports", nil)
	var doc v1alpha2.BindingProvider
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &doc) != nil {
		t.Fatalf("GET /api/exports: %d %s", resp.StatusCode, body)
	}
	if len(doc.AuthenticationMethods) != 1 || doc.AuthenticationMethods[0].Method != "OAuth2CodeGrantPoll" || strings.Contains(body, "OAuth2CodeGrant\"") {
		t.Errorf("discovery with the callback flow off: %s", body)
	}
	browserQ := url.Values{"session_id": {"CLISESSION234567"}, "redirect_url": {cliCallback}, "consumer_id": {"9a7d-uid"}}
	for _, link := range []string{"/api/authorize?" + loginQuery().Encode(), "/?" + browserQ.Encode(), "/api/authorize?redirect_url=x", "/"} {
		for _, method := range []string{"GET", "HEAD"} {
			resp, body := e.do(e.client(), method, link, nil)
			if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Location") != "" || resp.Header.Get("Set-Cookie") != "" ||
				!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
				t.Errorf("%s %s: %d, Location %q, cookie %q; want a 404 page", method, link, resp.StatusCode,
					resp.Header.Get("Location"), resp.Header.Get("Set-Cookie"))
			}
			if method == "GET" && !strings.Contains(body, "poll flow only") {
				t.Errorf("GET %s: the page does not say the provider binds with the poll flow only:\n%.300s", link, body)
			}
		}
	}
	if e.login.Pending() != 0 {
		t.Errorf("%d logins began", e.login.Pending())
	}
	tok := e.token("alice")
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/api/templates", ""},
		{"GET", "/api/collections", ""},
		{"POST", "/api/bind", bindBody("mangodb", "mangodb-with-secrets", "9a7d-uid")},
	} {
		resp, body := e.do(e.client(), r.method, r.path, strings.NewReader(r.body), "Authorization", "Bearer "+tok)
		var apiErr v1alpha2.Error
		if resp.StatusCode != http.StatusNotFound || json.Unmarshal([]byte(body), &apiErr) != nil ||
			apiErr.Code != v1alpha2.ErrorResourceNotFound || !strings.Contains(apiErr.Message, "poll flow only") {
			t.Errorf("%s %s with a token: %d %s; want 404 saying the provider binds with the poll flow only", r.method, r.path, resp.StatusCode, body)
		}
	}
	if calls := e.prov.Take(); len(calls) != 0 {
		t.Errorf("provisioned %+v", calls)
	}
	// The poll flow is untouched.
	if resp, body := e.do(e.client(), "POST", "/api/sessions", nil); resp.StatusCode != http.StatusCreated {
		t.Errorf("POST /api/sessions: %d %s", resp.StatusCode, body)
	}
}

// TestPollV1alpha2: a session of POST /api/sessions is bound on the
// shared /authorize page and polls to a v1alpha2 response.
func TestPollSessionV1alpha2(t *testing.T) {
	e := newEnv(t)
	resp, body := e.do(e.client(), "POST", "/api/sessions", nil)
	var ps v1alpha1.PollSession
	if resp.StatusCode != 201 || json.Unmarshal([]byte(body), &ps) != nil || ps.APIVersion != "kube-bind.io/v1alpha2" || ps.SessionSecret == "" {
		t.Fatalf("POST /api/sessions: %d %s", resp.StatusCode, body)
	}
	signed := func(path string) string {
		u, _ := url.Parse(e.srv.URL + path)
		s, err := protocol.SignURL(ps.SessionSecret, ps.SessionID, "GET", u, nil)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimPrefix(s.String(), e.srv.URL)
	}
	if resp, body := e.do(e.client(), "GET", signed("/poll"), nil); resp.StatusCode != 403 || !strings.Contains(body, "authorization_pending") {
		t.Fatalf("first poll: %d %s", resp.StatusCode, body)
	}
	c := e.client()
	resp = e.loginAt(c, signed("/authorize"))
	sel := resp.Header.Get("Location")
	resp, page := e.do(c, "GET", sel, nil)
	m := csrfRE.FindStringSubmatch(page)
	if resp.StatusCode != 200 || m == nil || !strings.Contains(page, "mangodb-with-secrets") {
		t.Fatalf("selection page: %d %s", resp.StatusCode, page)
	}
	form := url.Values{web.FieldCSRF: {m[1]}, "s": {ps.SessionID}, web.FieldAPI: {"mangodb-with-secrets"},
		web.FieldAction: {web.ActionBind}, web.FieldConfirm: {web.ConfirmYes}}
	if resp, body := e.do(c, "POST", "/bind", strings.NewReader(form.Encode()), "Content-Type", "application/x-www-form-urlencoded"); resp.StatusCode != 200 {
		t.Fatalf("bind: %d %s", resp.StatusCode, body)
	}
	e.clock.Advance(3 * time.Second)
	resp, body = e.do(e.client(), "GET", signed("/poll"), nil)
	var br v1alpha2.BindingResponse
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &br) != nil || br.APIVersion != "kube-bind.io/v1alpha2" ||
		len(br.Requests) != 1 || br.Authentication.OAuth2CodeGrant.SessionID != ps.SessionID {
		t.Fatalf("poll: %d %s", resp.StatusCode, body)
	}
	if calls := e.prov.Take(); len(calls) != 1 || calls[0].ClusterID != clusterkey.NewClusterID(ps.SessionID) {
		t.Errorf("provisioned %+v", calls)
	}
}
