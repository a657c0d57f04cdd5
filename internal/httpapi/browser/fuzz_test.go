package browser

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/securecookie"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/internal/testutil/fakes"
	v1alpha1 "github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
	"github.com/kbprovider/backend/web"
)

// The fuzz targets of the browser routes run the real handler with a real
// memory store; only the identity provider, the catalog and the
// provisioner are replaced, by fakes that record what they were asked.

var (
	fuzzHashKey  = bytes.Repeat([]byte("h"), 32)
	fuzzBlockKey = bytes.Repeat([]byte("b"), 32)
	// fuzzAllowList is the callback allow-list of the fuzzed handler.
	fuzzAllowList = []string{"https://cli.example.com/kube-bind", "http://10.0.0.7:8000"}
)

var fuzzCatalog = fakes.Catalog{
	{Name: "widgets.example.com", Group: "example.com", Resource: "widgets", Kind: "Widget", Scope: "Namespaced", Versions: []string{"v1"}},
	{Name: "mangodbs.mangodb.com", Group: "mangodb.com", Resource: "mangodbs", Kind: "MangoDB", Scope: "Namespaced", Versions: []string{"v1", "v1beta1"}},
}

// serve hands r to the handler's route for its method and path, as the
// router mounting Routes does (405 for a known path with another method).
func (e *fuzzEnv) serve(w http.ResponseWriter, r *http.Request) {
	known := false
	for _, rt := range routes(e.h) {
		if rt.Path == r.URL.Path {
			known = true
			if rt.Method == r.Method {
				rt.Handler(w, r)
				return
			}
		}
	}
	if known {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	http.NotFound(w, r)
}

type fuzzEnv struct {
	h     *Handler
	store *memory.Store
	svc   *lifecycle.Service
	login *fakes.Login
	prov  *fakes.Provisioner
	key   *clusterkey.Key
}

// fuzzStart is the fuzzed handler's time: it stands still, so that no
// session expires during a long fuzzing run.
var fuzzStart = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newFuzzEnv(f *testing.F) *fuzzEnv {
	f.Helper()
	now := func() time.Time { return fuzzStart }
	store := memory.New(sessions.Limits{}, now)
	key, err := clusterkey.New(bytes.Repeat([]byte("k"), 32))
	if err != nil {
		f.Fatal(err)
	}
	e := &fuzzEnv{store: store, login: &fakes.Login{}, prov: &fakes.Provisioner{}, key: key}
	e.svc, err = lifecycle.New(lifecycle.Config{Store: store, Keys: testSessionKeys(f), ClusterKey: key,
		SessionTTL: time.Hour, Now: now, Catalog: fuzzCatalog, Provisioner: e.prov})
	if err != nil {
		f.Fatal(err)
	}
	h, err := New(Config{
		ExternalURL:       &url.URL{Scheme: "https", Host: "bind.example.com"},
		ProviderName:      "Fuzz provider",
		Sessions:          e.svc,
		Login:             e.login,
		CookieHashKeys:    [][]byte{fuzzHashKey},
		CookieBlockKeys:   [][]byte{fuzzBlockKey},
		CallbackAllowList: fuzzAllowList,
		Now:               now,
	})
	if err != nil {
		f.Fatal(err)
	}
	e.h = h
	return e
}

// marks is how many single-use marks the store holds.
func (e *fuzzEnv) marks() int {
	_, _, m := e.store.Len()
	return m
}

// browserTarget is where a browser really goes for u: the URL standard
// treats a backslash as a slash in http(s) paths and removes "." and ".."
// segments, also when percent-encoded.
func browserTarget(u *url.URL) string {
	p := strings.ReplaceAll(u.EscapedPath(), `\`, "/")
	var out []string
	for _, seg := range strings.Split(p, "/") {
		switch strings.ToLower(seg) {
		case ".", "%2e":
			continue
		case "..", ".%2e", "%2e.", "%2e%2e":
			if len(out) > 1 {
				out = out[:len(out)-1]
			}
			continue
		}
		out = append(out, seg)
	}
	return strings.Join(out, "/")
}

// wantSafeCallback is the property of every callback URL the handler
// accepts: it parses again to itself (the bind redirects to it after
// provisioning, when a parse error would lose the response), carries no
// user or fragment, and leads a browser to this computer over http or
// is equal to an allow-listed URL.
func wantSafeCallback(t *testing.T, q url.Values, got *url.URL) {
	t.Helper()
	s := got.String()
	back, err := url.Parse(s)
	if err != nil {
		t.Fatalf("%v: accepted callback %q does not parse again: %v", q, s, err)
	}
	if back.String() != s {
		t.Fatalf("%v: accepted callback %q re-encodes to %q", q, s, back)
	}
	if back.User != nil || back.Fragment != "" || back.Opaque != "" || back.Host == "" {
		t.Fatalf("%v: accepted callback %q has user, fragment, opaque part or no host", q, s)
	}
	if port := back.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strings.Trim(port, "0123456789") != "" {
			t.Fatalf("%v: accepted callback %q has port %q, where no browser goes", q, s, port)
		}
	}
	if q.Has("p") {
		p := q.Get("p")
		if strings.Trim(p, "0123456789") != "" {
			t.Fatalf("%v: p %q accepted though not only digits", q, p)
		}
		if s != "http://localhost:"+p+"/callback" {
			t.Fatalf("%v: p gave %q", q, s)
		}
		return
	}
	host := back.Hostname()
	ip := net.ParseIP(host)
	if back.Scheme == "http" && (host == "localhost" || ip != nil && ip.IsLoopback()) {
		return
	}
	target := browserTarget(back)
	rooted := func(p string) string {
		if p == "" {
			return "/"
		}
		return p
	}
	for _, a := range fuzzAllowList {
		au, _ := url.Parse(a)
		if strings.EqualFold(back.Scheme, au.Scheme) && strings.EqualFold(back.Host, au.Host) &&
			back.RawQuery == "" && !back.ForceQuery && rooted(target) == rooted(au.EscapedPath()) &&
			rooted(back.EscapedPath()) == rooted(au.EscapedPath()) {
			return
		}
	}
	t.Fatalf("%v: accepted callback %q (a browser goes to path %q) is neither loopback http nor equal to an allow-listed URL", q, s, target)
}

// FuzzCallbackURL: the callback flow's p and u. Whatever the query, an
// accepted callback is http on loopback or equal to an allow-listed URL
// (also as a browser resolves it), and it parses again to itself.
func FuzzCallbackURL(f *testing.F) {
	for _, s := range []string{
		"p=43210", "p=1", "p=65535", "p=0", "p=65536", "p=80x", "p=-1", "p=", "p=1&p=2",
		// p=%2B41234 is p=+41234 (a raw + is a space): Atoi accepts a
		// sign, and the bind would fail after provisioning
		// ("http://localhost:+41234/callback: invalid port").
		"p=+41234", "p=%2B41234", "p=%2B1", "p=0080",
		"u=http%3A%2F%2F127.0.0.1%3A5000%2Fcallback%3Fx%3D1", "u=http://[::1]:5000/cb", "u=http://localhost/cb",
		"u=https://cli.example.com/kube-bind/callback", "u=https://cli.example.com/kube-bind", "u=http://10.0.0.7:8000/x",
		"u=https://cli.example.com/kube-bindevil", "u=https://cli.example.com/kube-bind/x", "u=https://cli.example.com/kube-bind?x=1",
		"u=https://cli.example.com/kube-bind?", "u=http://10.0.0.7:8000", "u=http://10.0.0.7:8000/", "u=https://127.0.0.1/cb", "u=http://127.0.0.1.evil.example.com/cb",
		"u=http://user@127.0.0.1:5000/cb", "u=http://127.0.0.1:5000/cb%23frag", "u=//127.0.0.1/cb", "u=javascript:alert(1)",
		// Found by this target: a dot segment leads a browser out of the
		// allow-listed path; a port no browser can reach loses the
		// response after provisioning, as p=+41234 did.
		"u=https://cli.example.com/kube-bind/../evil", "u=https://cli.example.com/kube-bind/%2e%2e/evil",
		"u=https://cli.example.com/kube-bind/..%5Cevil", "u=https://cli.example.com/kube-bind/x/%2E./../evil",
		"u=http://localhost:99999/cb", "u=http://localhost:0/cb", "u=http://localhost:/cb",
		"p=1&u=http://localhost/cb", "",
	} {
		f.Add(s)
	}
	allow, errs := ParseCallbackAllowList(fuzzAllowList)
	if len(errs) > 0 {
		f.Fatal(errs)
	}
	h := &Handler{allowList: allow}
	f.Fuzz(func(t *testing.T, rawQuery string) {
		q, err := url.ParseQuery(rawQuery)
		if err != nil {
			return
		}
		got, problem := h.callbackURL(q)
		if got == nil {
			if problem == "" {
				t.Fatalf("%q refused without a reason", rawQuery)
			}
			return
		}
		wantSafeCallback(t, q, got)
	})
}

// FuzzAuthorizeQuery: GET or HEAD /authorize with any query. Only 303,
// 400, 401, 404 or 410 (and 200 for a good link's HEAD): never a 5xx, the
// store being up; a HEAD changes nothing and starts no login; a poll-flow
// link starts one only with the session's own signature over this URL,
// carrying its nonce (spent only by a sign-in, never here), for the
// session's issued cluster ID, a presented one only with its proof, and
// otherwise a new one; a callback-flow link starts one for a new, pending
// session of the callback flow (stored nowhere), whose callback is safe
// and whose IDs are valid, for the CLI's cluster ID. Nothing writes a
// mark.
func FuzzAuthorizeQuery(f *testing.F) {
	e := newFuzzEnv(f)
	// Poll sessions whose signed links the seeds hold: one with the
	// cluster ID the backend issued, one that presented its own.
	issued, _, _ := e.svc.CreateSession(lifecycle.SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
	presented, _, _ := e.svc.CreateSession(lifecycle.SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: "abcdefghijklmnopqrstuvwxyz"})
	sign := func(id, secret, query string) string {
		u, _ := url.Parse("https://bind.example.com/authorize?" + query)
		signed, err := protocol.SignURL(secret, id, http.MethodGet, u, nil)
		if err != nil {
			f.Fatal(err)
		}
		return signed.RawQuery
	}
	proof := protocol.ProofParam + "=" + protocol.ClusterProof(e.key.Secret(presented.ClusterID), presented.ID)
	for _, head := range []bool{false, true} {
		f.Add(sign(issued.ID, issued.Secret, ""), head)
		f.Add(sign(presented.ID, presented.Secret, proof), head)
		f.Add(sign(presented.ID, presented.Secret, ""), head)
		f.Add(sign(presented.ID, presented.Secret, protocol.ProofParam+"=AAAA"), head)
		f.Add("p=43210&s=cli-session&c=aB3dE9", head)
	}
	// Links that are signed right but must not open: a session of the
	// callback flow, an expired one, one of a key this backend does not
	// have.
	callback := callbackSession(e.svc, "http://localhost:1/callback", "cli")
	expired := testSessionKeys(f).Issue(sessionkey.FlowPoll, "", fuzzStart.Add(-time.Second))
	otherKeys, err := sessionkey.New(bytes.Repeat([]byte("o"), sessionkey.MinKeyLen))
	if err != nil {
		f.Fatal(err)
	}
	foreign := otherKeys.Issue(sessionkey.FlowPoll, "", fuzzStart.Add(time.Hour))
	for _, ks := range []sessionkey.Session{callback.Session, expired, foreign} {
		f.Add(sign(ks.ID, ks.Secret, ""), false)
	}
	for _, s := range []string{
		"", "s=a&n=b&h=c", "s=" + issued.ID + "&n=x&h=AAAA", "p=%2B41234&s=cli&c=aB3dE9",
		"u=http://127.0.0.1:5000/cb&s=cli&c=aB3dE9", "u=https://cli.example.com/kube-bind/cb&s=cli&c=" + protocol.NewClusterID(),
		"u=https://evil.example.com/&s=cli&c=aB3dE9", "p=1&s=a&s=b&c=aB3dE9", "p=1&s=a&c=short", "%zz", "p=1;s=a",
	} {
		f.Add(s, false)
	}
	var mu sync.Mutex
	f.Fuzz(func(t *testing.T, rawQuery string, head bool) {
		mu.Lock()
		defer mu.Unlock()
		marks := e.marks()
		method := http.MethodGet
		if head {
			method = http.MethodHead
		}
		r := httptest.NewRequest(method, "https://bind.example.com/authorize", nil)
		r.URL.RawQuery = rawQuery
		w := httptest.NewRecorder()
		e.serve(w, r)
		began := e.login.Take()
		switch w.Code {
		case http.StatusSeeOther, http.StatusBadRequest, http.StatusUnauthorized, http.StatusNotFound, http.StatusGone:
		case http.StatusOK:
			if !head {
				t.Fatalf("query %q: GET answered 200", rawQuery)
			}
		default:
			t.Fatalf("query %q: %s answered %d", rawQuery, method, w.Code)
		}
		if (w.Code == http.StatusSeeOther) != (len(began) == 1) || len(began) > 1 {
			t.Fatalf("query %q: status %d, logins started %d", rawQuery, w.Code, len(began))
		}
		q, perr := url.ParseQuery(rawQuery)
		if w.Code != http.StatusSeeOther {
			if e.marks() != marks {
				t.Fatalf("query %q: %s answered %d, but spent a mark (%d -> %d)", rawQuery, method, w.Code, marks, e.marks())
			}
			if head && w.Code == http.StatusOK && (q.Has("h") || q.Has("n")) {
				// A link preview's HEAD spends nothing: the user's GET of
				// the same link still works.
				r := httptest.NewRequest(http.MethodGet, "https://bind.example.com/authorize", nil)
				r.URL.RawQuery = rawQuery
				w := httptest.NewRecorder()
				e.serve(w, r)
				if got := e.login.Take(); w.Code != http.StatusSeeOther || len(got) != 1 {
					t.Fatalf("query %q: after a HEAD, the GET answered %d", rawQuery, w.Code)
				}
			}
			return
		}
		if head {
			t.Fatalf("query %q: HEAD started a login", rawQuery)
		}
		if perr != nil {
			t.Fatalf("query %q does not parse but started a login", rawQuery)
		}
		fl, ok := parseFlow([]byte(began[0]))
		if !ok {
			t.Fatalf("query %q: flow state %q", rawQuery, began[0])
		}
		if q.Has("h") || q.Has("n") {
			// Poll flow: only the session's own signature over this very
			// URL opens it, and its nonce travels with the login, unspent
			// until somebody signs in. (The session is opened
			// with the keys, not looked up among the seeds' sessions: a
			// fuzzing worker runs the seeds the coordinator made.)
			ps, err := e.svc.Open(fl.SessionID)
			req := protocol.Request{Scheme: "https", Host: "bind.example.com", Method: http.MethodGet, Path: "/authorize", Query: q}
			if err != nil || ps.Flow != sessionkey.FlowPoll || q.Get("s") != fl.SessionID || !protocol.Verify(ps.Secret, req, q.Get("h")) {
				t.Fatalf("query %q: login started without a valid signature (%v)", rawQuery, err)
			}
			if e.marks() != marks {
				t.Fatalf("query %q: opening a link spent a mark (%d -> %d)", rawQuery, marks, e.marks())
			}
			if fl.LinkNonce != q.Get("n") {
				t.Fatalf("query %q: the login carries nonce %q", rawQuery, fl.LinkNonce)
			}
			switch fl.ClusterKind {
			case clusterNew:
				if ps.ClusterID != "" || fl.ClusterID != clusterkey.NewClusterID(ps.ID) {
					t.Fatalf("query %q: cluster %q counted as issued", rawQuery, fl.ClusterID)
				}
			case clusterProven:
				if ps.ClusterID == "" || fl.ClusterID != ps.ClusterID || !e.key.Proven(ps.ID, ps.ClusterID, q.Get(protocol.ProofParam)) {
					t.Fatalf("query %q: cluster %q counted as proven", rawQuery, fl.ClusterID)
				}
			case clusterReplaced:
				if ps.ClusterID == "" || fl.ClusterID == ps.ClusterID || fl.ClusterID != clusterkey.NewClusterID(ps.ID) ||
					e.key.Proven(ps.ID, ps.ClusterID, q.Get(protocol.ProofParam)) {
					t.Fatalf("query %q: replaced by %q", rawQuery, fl.ClusterID)
				}
			default:
				t.Fatalf("query %q: poll flow of kind %q", rawQuery, fl.ClusterKind)
			}
			return
		}
		// Callback flow: a new session, derived, stored nowhere.
		if e.marks() != marks {
			t.Fatalf("query %q: a callback-flow login spent a mark", rawQuery)
		}
		sess, err := e.svc.Open(fl.SessionID)
		if err != nil || sess.Flow != sessionkey.FlowCallback || fl.SessionID == q.Get("s") {
			t.Fatalf("query %q: login started for session %q (flow %d, %v), not a new one of the callback flow", rawQuery, fl.SessionID, sess.Flow, err)
		}
		if o, err := e.store.Outcome(context.Background(), sess.ID); err != nil || o.State != sessions.StatePending {
			t.Fatalf("query %q: new session %v, %v", rawQuery, o.State, err)
		}
		if fl.ClusterKind != clusterCallback || fl.ClusterID != q.Get("c") || !protocol.ValidClusterID(fl.ClusterID) ||
			!protocol.URLSafe(fl.CLISessionID, 64) || fl.CLISessionID != q.Get("s") {
			t.Fatalf("query %q: flow %+v", rawQuery, fl)
		}
		u, err := url.Parse(fl.CallbackURL)
		if err != nil {
			t.Fatalf("query %q: callback %q does not parse: %v", rawQuery, fl.CallbackURL, err)
		}
		wantSafeCallback(t, q, u)
	})
}

// fuzzCookie encodes a login cookie with the fuzzed handler's keys.
func (e *fuzzEnv) cookie(t testing.TB, lc loginCookie) *http.Cookie {
	v, err := e.h.cookies.Encode(loginCookieName, lc)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Cookie{Name: e.h.loginCookie.name, Value: v}
}

// FuzzBindForm: POST /bind with any form body, cookie and origin, for a
// fresh pending session each time. Never a 5xx; the provisioner runs only
// for a genuine login of this session with its CSRF token, the bind
// action, the confirmation and APIs that are all in the catalog, and then
// with exactly those APIs and the login's cluster ID; a refused form
// leaves the session pending (denied only by a genuine cancel) and
// redirects nowhere; a bind hands the response over: recorded as the
// poll-flow session's outcome, or carried (decodable) by the callback
// redirect of the callback flow, whose session the store never records.
func FuzzBindForm(f *testing.F) {
	e := newFuzzEnv(f)
	for _, c := range []struct {
		body   string
		cookie uint8
		flow   bool
		origin string
	}{
		{"s={s}&csrf_token={csrf}&action=bind&confirm=yes&api=widgets.example.com", 0, false, ""},
		{"s={s}&csrf_token={csrf}&action=bind&confirm=yes&api=widgets.example.com&api=mangodbs.mangodb.com&api=widgets.example.com", 0, true, "https://bind.example.com"},
		{"s={s}&csrf_token={csrf}&action=cancel", 0, false, "null"},
		{"s={s}&csrf_token={csrf}&action=bind", 0, false, ""},
		{"s={s}&csrf_token={csrf}&action=bind&api=widgets.example.com", 0, false, ""}, // not confirmed
		{"s={s}&csrf_token={csrf}&action=bind&confirm=no&api=widgets.example.com", 0, true, ""},
		{"s={s}&csrf_token={csrf}&action=bind&confirm=yes&api=secrets.", 0, false, ""},
		{"s={s}&csrf_token={csrf}&action=bind&confirm=yes&api=widgets.example.com.", 0, false, ""},
		{"s={s}&csrf_token=wrong&action=bind&confirm=yes&api=widgets.example.com", 0, false, ""},
		{"s={s}&csrf_token={csrf}&action=bind&confirm=yes&api=widgets.example.com", 1, false, ""},
		{"s={s}&csrf_token={csrf}&action=bind&confirm=yes&api=widgets.example.com", 2, false, ""},
		{"s={s}&csrf_token={csrf}&action=bind&confirm=yes&api=widgets.example.com", 3, false, ""},
		{"s={s}&csrf_token={csrf}&action=bind&confirm=yes&api=widgets.example.com", 0, false, "https://evil.example.com"},
		{"s={s};csrf_token={csrf}", 0, false, ""},
		{"%zz", 0, false, ""},
		{"s=other&csrf_token={csrf}&action=bind&confirm=yes&api=widgets.example.com", 0, false, ""},
		{"s={s}&csrf_token={csrf}&csrf_token=x&action=bind&action=cancel&api=widgets.example.com", 0, true, ""},
	} {
		f.Add(c.body, c.cookie, c.flow, c.origin)
	}
	f.Fuzz(func(t *testing.T, body string, cookieMode uint8, callbackFlow bool, origin string) {
		ctx := context.Background()
		var sess lifecycle.Session
		lc := loginCookie{Issuer: "https://idp.example.com", Subject: "alice", CSRF: newCSRFToken()}
		if callbackFlow {
			sess = callbackSession(e.svc, "http://127.0.0.1:5000/callback?x=1", "cli-session")
			lc.Flow = flow{SessionID: sess.ID, ClusterID: protocol.NewClusterID(), ClusterKind: clusterCallback,
				CallbackURL: sess.CallbackURL, CLISessionID: sess.CallbackSessionID}
		} else {
			var clusterID string
			sess, clusterID, _ = e.svc.CreateSession(lifecycle.SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
			lc.Flow = flow{SessionID: sess.ID, ClusterID: clusterID, ClusterKind: clusterNew}
		}
		csrf := lc.CSRF
		body = strings.NewReplacer("{s}", sess.ID, "{csrf}", csrf).Replace(body)

		r := httptest.NewRequest(http.MethodPost, "https://bind.example.com/bind", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		genuine := false
		switch cookieMode % 4 {
		case 0:
			r.AddCookie(e.cookie(t, lc))
			genuine = true
		case 1: // none
		case 2:
			other := lc
			otherSess, _, _ := e.svc.CreateSession(lifecycle.SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: ""})
			other.Flow.SessionID = otherSess.ID
			r.AddCookie(e.cookie(t, other))
		case 3:
			r.AddCookie(&http.Cookie{Name: e.h.loginCookie.name, Value: base64.URLEncoding.EncodeToString([]byte(body))})
		}
		w := httptest.NewRecorder()
		e.serve(w, r)
		calls := e.prov.Take()
		if w.Code >= 500 {
			t.Fatalf("body %q: status %d", body, w.Code)
		}
		after, err := e.svc.Outcome(ctx, sess)
		if err != nil {
			t.Fatalf("outcome: %v", err)
		}
		if callbackFlow && after.State != sessions.StatePending {
			// Its response goes to the CLI's callback, never to a poll.
			t.Fatalf("body %q: callback-flow session %s in the store", body, after.State)
		}

		form, perr := url.ParseQuery(body)
		sameSite := origin == "" || origin == "null" || strings.EqualFold(origin, "https://bind.example.com")
		mayAct := perr == nil && genuine && sameSite && form.Get("s") == sess.ID && form.Get(web.FieldCSRF) == csrf
		allOffered := len(form[web.FieldAPI]) > 0
		for _, name := range form[web.FieldAPI] {
			resource, group, _ := strings.Cut(name, ".")
			_, ok := fuzzCatalog.Lookup(group, resource)
			allOffered = allOffered && ok
		}
		complete := mayAct && form.Get(web.FieldAction) == web.ActionBind && form.Get(web.FieldConfirm) == web.ConfirmYes && allOffered
		if len(calls) == 0 {
			if complete && len(body) < maxFormBytes {
				t.Fatalf("body %q: a complete, genuine form was not provisioned (status %d)", body, w.Code)
			}
			if w.Code == http.StatusFound || w.Header().Get("Location") != "" {
				t.Fatalf("body %q: redirected to %q without provisioning", body, w.Header().Get("Location"))
			}
			switch after.State {
			case sessions.StatePending:
			case sessions.StateDenied:
				if !mayAct || form.Get(web.FieldAction) != web.ActionCancel {
					t.Fatalf("body %q: session denied without a genuine cancel", body)
				}
			default:
				t.Fatalf("body %q: not provisioned, yet the session is %s", body, after.State)
			}
			return
		}
		if len(calls) > 1 || !mayAct || form.Get(web.FieldAction) != web.ActionBind || form.Get(web.FieldConfirm) != web.ConfirmYes {
			t.Fatalf("body %q (cookie mode %d, origin %q): provisioned %d times", body, cookieMode%4, origin, len(calls))
		}
		var want []binding.Resource
		for _, name := range form[web.FieldAPI] {
			resource, group, _ := strings.Cut(name, ".")
			if _, ok := fuzzCatalog.Lookup(group, resource); !ok {
				t.Fatalf("body %q: provisioned although %q is not offered", body, name)
			}
			if r := (binding.Resource{Group: group, Resource: resource, Request: name}); !slices.Contains(want, r) {
				want = append(want, r)
			}
		}
		c := calls[0]
		if !slices.Equal(c.Resources, want) || c.ClusterID != lc.Flow.ClusterID || c.Consumer.Issuer != lc.Issuer || c.Consumer.Subject != lc.Subject ||
			!reflect.DeepEqual(c.Consumer.Claims, lc.claims()) {
			t.Fatalf("body %q: provisioned %+v, want resources %v for cluster %s", body, c, want, lc.Flow.ClusterID)
		}
		if !callbackFlow {
			if after.State != sessions.StateCompleted {
				t.Fatalf("body %q: provisioned, but the session is %s", body, after.State)
			}
			var stored v1alpha1.BindingResponse
			if err := json.Unmarshal(after.Response, &stored); err != nil || stored.Authentication.OAuth2CodeGrant == nil {
				t.Fatalf("stored response %q: %v", after.Response, err)
			}
			if w.Code != http.StatusOK || stored.Authentication.OAuth2CodeGrant.SessionID != sess.ID {
				t.Fatalf("poll flow: status %d, sid %q", w.Code, stored.Authentication.OAuth2CodeGrant.SessionID)
			}
			return
		}
		loc, err := url.Parse(w.Header().Get("Location"))
		if w.Code != http.StatusFound || err != nil || loc.Host != "127.0.0.1:5000" || loc.Query().Get("x") != "1" {
			t.Fatalf("callback flow: status %d, Location %q", w.Code, w.Header().Get("Location"))
		}
		raw, err := base64.StdEncoding.DecodeString(loc.Query().Get("response"))
		var got v1alpha1.BindingResponse
		if err != nil || json.Unmarshal(raw, &got) != nil || got.Authentication.OAuth2CodeGrant == nil ||
			got.Authentication.OAuth2CodeGrant.SessionID != "cli-session" {
			t.Fatalf("callback flow: response parameter %q does not decode to the CLI session's response", loc.Query().Get("response"))
		}
	})
}

// FuzzLoginCookie: the login cookie carries who logged in from the login
// callback to the bind. Whatever value a browser sends, it decodes only
// to content the backend encoded; what the backend encodes decodes to
// itself, and not under other keys or with any character changed.
func FuzzLoginCookie(f *testing.F) {
	e := newFuzzEnv(f)
	minted := []loginCookie{
		{Flow: flow{SessionID: "Zr7Q2mWbX9kLp3VtZr7Q2m", ClusterID: "aB3dE9", ClusterKind: clusterCallback, CallbackURL: "http://localhost:1/callback", CLISessionID: "cli"},
			Issuer: "https://idp.example.com", Subject: "alice", Email: "alice@example.com", CSRF: "csrf-1"},
		{Flow: flow{SessionID: "sid", ClusterID: "c", ClusterKind: clusterNew}, Issuer: "i", Subject: "s", CSRF: "c"},
	}
	for _, lc := range minted {
		v, err := e.h.cookies.Encode(loginCookieName, lc)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(v, lc.Flow.SessionID, lc.Issuer, lc.Subject, lc.Email, uint16(0))
		f.Add(v[:len(v)-1], "", "", "", "", uint16(7))
	}
	f.Add("", "s", "https://idp", "sub", "", uint16(1))
	f.Add("not|a|cookie", "Zr7Q2m", "iss", "\x00\xff", "e@x", uint16(300))
	other := securecookie.New(bytes.Repeat([]byte("o"), 32), fuzzBlockKey)
	other.SetSerializer(securecookie.JSONEncoder{})
	f.Fuzz(func(t *testing.T, value, sid, iss, sub, email string, flip uint16) {
		var got loginCookie
		if err := e.h.cookies.Decode(loginCookieName, value, &got); err == nil && !slices.ContainsFunc(minted, func(m loginCookie) bool { return reflect.DeepEqual(m, got) }) {
			t.Fatalf("value %q decoded to %+v, which the backend never encoded", value, got)
		}

		lc := loginCookie{Flow: flow{SessionID: sid, ClusterID: sub, ClusterKind: clusterReplaced}, Issuer: iss, Subject: sub, Email: email, CSRF: newCSRFToken()}
		v, err := e.h.cookies.Encode(loginCookieName, lc)
		if err != nil {
			return // too long for a cookie: refused when setting it
		}
		var back loginCookie
		if err := e.h.cookies.Decode(loginCookieName, v, &back); err != nil {
			t.Fatalf("own cookie for %+v does not decode: %v", lc, err)
		}
		// JSON replaces invalid UTF-8; compare with what JSON makes of it.
		want := lc
		for _, s := range []*string{&want.Flow.SessionID, &want.Flow.ClusterID, &want.Issuer, &want.Subject, &want.Email} {
			b, _ := json.Marshal(*s)
			_ = json.Unmarshal(b, s)
		}
		if !reflect.DeepEqual(back, want) {
			t.Fatalf("round trip: %+v, want %+v", back, want)
		}
		if other.Decode(loginCookieName, v, &back) == nil {
			t.Fatal("a cookie decodes under another signing key")
		}
		if e.h.cookies.Decode("other_name", v, &back) == nil {
			t.Fatal("a cookie decodes under another name")
		}
		b := []byte(v)
		i := int(flip) % len(b)
		b[i] ^= 1 << (flip % 7)
		back = loginCookie{}
		if err := e.h.cookies.Decode(loginCookieName, string(b), &back); err == nil && !reflect.DeepEqual(back, want) {
			t.Fatalf("a changed cookie decoded to %+v", back)
		}
	})
}
