package kbindv2_test

import (
	"bytes"
	"context"
	"encoding/json"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/httpapi"
	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/httpapi/kbindv2"
	"github.com/kbprovider/backend/internal/httpapi/mount"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/fakes"
	"github.com/kbprovider/backend/web"
)

var catalog = fakes.Catalog{
	{Name: "mangodbs.mangodb.com", Group: "mangodb.com", Resource: "mangodbs", Kind: "MangoDB", Scope: apiextensionsv1.NamespaceScoped, Versions: []string{"v1"}},
	{Name: "gadgets.example.com", Group: "example.com", Resource: "gadgets", Kind: "Gadget", Scope: apiextensionsv1.ClusterScoped, Versions: []string{"v1"}},
}

// scoped is the fake provisioner with the catalog's scopes in its
// results, as the real one resolves them.
type scoped struct{ *fakes.Provisioner }

func (p scoped) Provision(ctx context.Context, c binding.Consumer, clusterID string, rs []binding.Resource) (*binding.Result, error) {
	res, err := p.Provisioner.Provision(ctx, c, clusterID, rs)
	if err != nil {
		return nil, err
	}
	for i := range res.APIs {
		api, _ := catalog.Lookup(res.APIs[i].Group, res.APIs[i].Resource)
		res.APIs[i].Scope = api.Scope
	}
	return res, nil
}

type env struct {
	t     *testing.T
	h     http.Handler
	svc   *lifecycle.Service
	idp   *fakes.Login
	prov  *fakes.Provisioner
	clock *testutil.Clock
}

var ext = &url.URL{Scheme: "http", Host: "bind.example.com"}

func newEnv(t *testing.T) *env {
	t.Helper()
	clock := testutil.ClockAt(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	store := memory.New(sessions.Limits{}, clock.Now)
	keys, err := sessionkey.New(bytes.Repeat([]byte("s"), sessionkey.MinKeyLen))
	if err != nil {
		t.Fatal(err)
	}
	ck, err := clusterkey.New([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, idp: &fakes.Login{}, prov: &fakes.Provisioner{}, clock: clock}
	e.svc, err = lifecycle.New(lifecycle.Config{Store: store, Keys: keys, ClusterKey: ck, Now: clock.Now,
		Catalog: catalog, Provisioner: scoped{e.prov}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := browser.New(browser.Config{ExternalURL: ext, ProviderName: "V2 provider", Sessions: e.svc, Login: e.idp,
		CookieHashKeys: [][]byte{bytes.Repeat([]byte("h"), 32)}, CookieBlockKeys: [][]byte{bytes.Repeat([]byte("b"), 32)},
		Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := kbindv2.New(kbindv2.Config{ExternalURL: ext, PrettyName: "V2 provider", Sessions: e.svc, Browser: b})
	if err != nil {
		t.Fatal(err)
	}
	e.h, err = httpapi.New(httpapi.Config{ExternalURL: ext, Sessions: e.svc, Parts: []mount.Part{b, v2}, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) do(method, target string, body url.Values, cookies ...*http.Cookie) *httptest.ResponseRecorder {
	e.t.Helper()
	var req *http.Request
	if body != nil {
		req = httptest.NewRequest(method, target, strings.NewReader(body.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		req = httptest.NewRequest(method, target, nil)
	}
	req.RemoteAddr = "192.0.2.1:4000"
	for _, c := range cookies {
		req.AddCookie(c)
	}
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	return w
}

var pickupCommand = regexp.MustCompile(`curl -fsS -X POST (?:'|&#39;)([^'&]*(?:&amp;[^'&]*)*)(?:'|&#39;) \| kubectl apply -f -`)

// bind walks the browser flow from the provider's v2 page to the done
// page, ticking apis, and returns the done page's answer.
func (e *env) bind(apis ...string) *httptest.ResponseRecorder {
	e.t.Helper()
	w := e.do(http.MethodGet, kbindv2.PathBind, nil)
	login, err := url.Parse(w.Header().Get("Location"))
	if w.Code != http.StatusSeeOther || err != nil || !strings.HasPrefix(login.String(), fakes.Issuer) {
		e.t.Fatalf("GET /v2/bind: %d to %q, want 303 to the identity provider", w.Code, w.Header().Get("Location"))
	}
	w = e.do(http.MethodGet, "/callback?"+url.Values{"state": {login.Query().Get("state")}, "user": {"alice"}}.Encode(), nil)
	if w.Code != http.StatusSeeOther || !strings.HasPrefix(w.Header().Get("Location"), "/bind?s=") {
		e.t.Fatalf("callback: %d to %q:\n%s", w.Code, w.Header().Get("Location"), w.Body)
	}
	cookies := w.Result().Cookies()
	page := e.do(http.MethodGet, w.Header().Get("Location"), nil, cookies...)
	if page.Code != http.StatusOK {
		e.t.Fatalf("selection page: %d\n%s", page.Code, page.Body)
	}
	if strings.Contains(page.Body.String(), "gadgets") {
		e.t.Error("the v2 selection page offers a cluster-scoped API")
	}
	if !strings.Contains(page.Body.String(), "mangodbs") || strings.Contains(page.Body.String(), "confirmation-code") {
		e.t.Errorf("the v2 selection page should offer mangodbs and show no terminal code:\n%s", page.Body)
	}
	form := testutil.FormOn(e.t, page.Body.Bytes(), http.MethodPost).Fields
	form[web.FieldAPI] = apis
	form.Set(web.FieldAction, web.ActionBind)
	form.Set(web.FieldConfirm, web.ConfirmYes)
	return e.do(http.MethodPost, "/bind", form, cookies...)
}

// pickupURL reads the pickup URL off a done page.
func pickupURL(t *testing.T, done *httptest.ResponseRecorder) *url.URL {
	t.Helper()
	m := pickupCommand.FindStringSubmatch(done.Body.String())
	if done.Code != http.StatusOK || m == nil {
		t.Fatalf("done page: %d without the pickup command:\n%s", done.Code, done.Body)
	}
	u, err := url.Parse(html.UnescapeString(m[1]))
	if err != nil || u.Scheme != ext.Scheme || u.Host != ext.Host || u.Path != kbindv2.PathPickup {
		t.Fatalf("pickup URL %q (%v)", m[1], err)
	}
	return u
}

func decodeYAMLDocs(t *testing.T, y []byte) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(y), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := d.Decode(&u.Object); err != nil {
			break
		}
		out = append(out, u)
	}
	return out
}

// A browser bind of the v2 flow ends on a page with a pickup URL; a POST
// to it returns the bundle once (marking the binding delivered); GET and
// HEAD spend nothing and get 405 with Allow: POST; a second POST gets
// 410.
func TestBrowserBindThenPickupOnce(t *testing.T) {
	e := newEnv(t)
	done := e.bind("mangodbs.mangodb.com")
	if !strings.Contains(done.Body.String(), "works <strong>once</strong>") {
		t.Errorf("the done page does not say the link works once:\n%s", done.Body)
	}
	u := pickupURL(t, done)
	calls := e.prov.Take()
	if len(calls) != 1 || calls[0].Consumer.Subject != "alice" || calls[0].ClusterID == "" {
		t.Fatalf("provisioned %+v, want one bind of alice with a new cluster ID", calls)
	}

	for _, m := range []string{http.MethodGet, http.MethodHead} {
		w := e.do(m, u.RequestURI(), nil)
		if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != http.MethodPost {
			t.Errorf("%s pickup: %d, Allow %q; want 405 and POST", m, w.Code, w.Header().Get("Allow"))
		}
	}
	if marked := e.prov.Marked(); len(marked) != 0 {
		t.Fatalf("a GET marked %v delivered", marked)
	}

	w := e.do(http.MethodPost, u.RequestURI(), nil)
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/yaml" {
		t.Fatalf("pickup: %d %s\n%s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	objs := decodeYAMLDocs(t, w.Body.Bytes())
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName())
	}
	want := "Namespace /kb-ns,Secret kb-ns/kube-bind-kubeconfig,Connection /kb-ns,Binding kb-ns/mangodbs.mangodb.com"
	if strings.Join(kinds, ",") != want {
		t.Errorf("bundle %v, want %s", kinds, want)
	}
	if marked := e.prov.Marked(); len(marked) != 1 || marked[0] != fakes.ProvisionedNamespace {
		t.Errorf("marked delivered: %v", marked)
	}
	if requested := e.prov.Requested(); len(requested) != 1 || requested[0] != fakes.ProvisionedNamespace+"/mangodbs.mangodb.com" {
		t.Errorf("the bind requested %v, want the picked API in its namespace", requested)
	}

	w = e.do(http.MethodPost, u.RequestURI(), nil)
	if w.Code != http.StatusGone || !strings.Contains(w.Body.String(), "used already") {
		t.Errorf("second pickup: %d %s, want 410 saying it was used", w.Code, w.Body)
	}
}

// format=json gives the bundle as one v1/List.
func TestPickupAsJSON(t *testing.T) {
	e := newEnv(t)
	u := pickupURL(t, e.bind("mangodbs.mangodb.com"))
	q := u.Query()
	q.Set("format", "json")
	w := e.do(http.MethodPost, u.Path+"?"+q.Encode(), nil)
	var list unstructured.UnstructuredList
	if w.Code != http.StatusOK || list.UnmarshalJSON(w.Body.Bytes()) != nil || len(list.Items) != 4 {
		t.Fatalf("JSON pickup: %d, %d items\n%s", w.Code, len(list.Items), w.Body)
	}
}

// Pickups that hand out nothing: a wrong or missing secret, an unknown
// session, one of another flow, a malformed query, one not bound yet, an
// expired one. None marks anything delivered or spends the real pickup.
func TestPickupRefusals(t *testing.T) {
	e := newEnv(t)
	good := pickupURL(t, e.bind("mangodbs.mangodb.com"))
	sid := good.Query().Get("s")
	pending, _, _ := e.svc.CreateSession(lifecycle.SessionRequest{Flow: sessionkey.FlowBrowserV2})
	poll, _, _ := e.svc.CreateSession(lifecycle.SessionRequest{Flow: sessionkey.FlowPoll})
	for _, c := range []struct {
		query  string
		status int
		says   string
	}{
		{url.Values{"s": {sid}, "k": {"AAAA"}}.Encode(), http.StatusNotFound, "No such pickup URL"},
		{url.Values{"s": {sid}}.Encode(), http.StatusBadRequest, "s and k"},
		{url.Values{"s": {sid, sid}, "k": {"x"}}.Encode(), http.StatusBadRequest, "s and k"},
		{good.RawQuery + "&format=xml", http.StatusBadRequest, "format"},
		{good.RawQuery + "&x=1", http.StatusBadRequest, "unknown parameter"},
		{"%zz", http.StatusBadRequest, "does not parse"},
		{url.Values{"s": {"bm90LWEtc2Vzc2lvbg"}, "k": {"x"}}.Encode(), http.StatusNotFound, "No such pickup URL"},
		{url.Values{"s": {poll.ID}, "k": {lifecycle.PickupSecret(poll)}}.Encode(), http.StatusNotFound, "No such pickup URL"},
		{url.Values{"s": {pending.ID}, "k": {lifecycle.PickupSecret(pending)}}.Encode(), http.StatusConflict, "finish the binding"},
	} {
		w := e.do(http.MethodPost, kbindv2.PathPickup+"?"+c.query, nil)
		if w.Code != c.status || !strings.Contains(w.Body.String(), c.says) {
			t.Errorf("POST ?%s: %d %q, want %d saying %q", c.query, w.Code, w.Body, c.status, c.says)
		}
	}
	if marked := e.prov.Marked(); len(marked) != 0 {
		t.Errorf("refused pickups marked %v delivered", marked)
	}
	e.clock.Advance(sessions.DefaultTTL + time.Second)
	if w := e.do(http.MethodPost, good.RequestURI(), nil); w.Code != http.StatusGone || !strings.Contains(w.Body.String(), "expired") {
		t.Errorf("expired pickup: %d %s, want 410 saying it expired", w.Code, w.Body)
	}
}

// A cluster-scoped API is refused at the selection, before anything is
// provisioned, with the reason on the page.
func TestClusterScopedRefusedBeforeProvisioning(t *testing.T) {
	e := newEnv(t)
	w := e.bind("mangodbs.mangodb.com", "gadgets.example.com")
	if w.Code != http.StatusUnprocessableEntity || !strings.Contains(w.Body.String(), "cluster-scoped") {
		t.Errorf("bind with a cluster-scoped API: %d, want 422 saying why:\n%.600s", w.Code, w.Body)
	}
	if calls := e.prov.Take(); len(calls) != 0 {
		t.Errorf("provisioned %+v", calls)
	}
}

// GET /v2 names the generation, its API group and how to bind.
func TestDiscovery(t *testing.T) {
	e := newEnv(t)
	w := e.do(http.MethodGet, kbindv2.PathDiscovery, nil)
	var d kbindv2.Discovery
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &d) != nil {
		t.Fatalf("GET /v2: %d %s", w.Code, w.Body)
	}
	if d.Generation != "v2" || d.APIGroup != "core.kbind.io/v1alpha1" || d.ExportedLabel != "core.kbind.io/exported" ||
		len(d.Methods) != 1 || d.Methods[0].BindURL != "http://bind.example.com/v2/bind" || d.Methods[0].PickupMethod != "POST" {
		t.Errorf("discovery %+v", d)
	}
}
