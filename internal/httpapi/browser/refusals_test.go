package browser

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/fakes"
	"github.com/kbprovider/backend/pkg/protocol"
	"github.com/kbprovider/backend/web"
)

// The refusals of test/e2e/refusals_test.go (and the cluster ID rule of
// phishing_test.go), in process: the real handler and memory store, a
// scripted identity provider (fakes.Login) instead of the test IdP, so
// that a broken refusal points at its handler in milliseconds. The e2e suite stays; it
// is what shows the real parts refuse the same way.

// refusalEnv is one handler with its store, clock, IdP and provisioner.
type refusalEnv struct {
	t     *testing.T
	ext   *url.URL
	h     *Handler
	store *memory.Store
	clock *testutil.Clock
	prov  *fakes.Provisioner
	key   *clusterkey.Key
	idp   *fakes.Login
}

// testSessionKeys are the session keys of the package's handlers.
func testSessionKeys(t testing.TB) *sessionkey.Keys {
	keys, err := sessionkey.New(bytes.Repeat([]byte("s"), sessionkey.MinKeyLen))
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

const refusalTTL = 10 * time.Minute

func newRefusalEnv(t *testing.T) *refusalEnv {
	t.Helper()
	return newRefusalEnvAt(t, &url.URL{Scheme: "https", Host: "bind.example.com"})
}

// newRefusalEnvAt is newRefusalEnv with the external URL ext.
func newRefusalEnvAt(t *testing.T, ext *url.URL) *refusalEnv {
	t.Helper()
	return newRefusalEnvWith(t, ext, nil)
}

// newRefusalEnvWith is newRefusalEnvAt with the handler's Config changed
// by adjust (if set) before New.
func newRefusalEnvWith(t *testing.T, ext *url.URL, adjust func(*Config)) *refusalEnv {
	t.Helper()
	clock := testutil.ClockAt(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	store := memory.New(sessions.Limits{}, clock.Now)
	key, err := clusterkey.New([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	e := &refusalEnv{t: t, ext: ext, store: store, clock: clock, prov: &fakes.Provisioner{}, key: key,
		idp: &fakes.Login{Refused: []string{"mallory"}}}
	svc, err := lifecycle.New(lifecycle.Config{Store: store, Keys: testSessionKeys(t), ClusterKey: key,
		SessionTTL: refusalTTL, Now: clock.Now, Catalog: fuzzCatalog, Provisioner: e.prov})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		ExternalURL:     ext,
		ProviderName:    "Refusal provider",
		Sessions:        svc,
		Login:           e.idp,
		CookieHashKeys:  [][]byte{fuzzHashKey},
		CookieBlockKeys: [][]byte{fuzzBlockKey},
		Now:             clock.Now,
	}
	if adjust != nil {
		adjust(&cfg)
	}
	e.h, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// do sends one request to the route for its method and path, as the
// router that mounts Routes does.
func (e *refusalEnv) do(method, target string, form url.Values, header http.Header, cookies ...*http.Cookie) *httptest.ResponseRecorder {
	e.t.Helper()
	var req *http.Request
	if form != nil {
		req = httptest.NewRequest(method, target, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		req = httptest.NewRequest(method, target, nil)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	w := httptest.NewRecorder()
	for _, rt := range routes(e.h) {
		if rt.Method == method && rt.Path == req.URL.Path {
			rt.Handler(w, req)
			return w
		}
	}
	e.t.Fatalf("no route for %s %s", method, req.URL.Path)
	return nil
}

// pollLink creates a poll-flow session (presenting clusterID, "" for a new
// one) and returns it with its signed /authorize link carrying extra.
func (e *refusalEnv) pollLink(clusterID string, extra url.Values) (lifecycle.Session, string) {
	e.t.Helper()
	sess, _, _ := e.h.svc.CreateSession(lifecycle.SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: clusterID})
	u := &url.URL{Scheme: e.ext.Scheme, Host: e.ext.Host, Path: "/authorize", RawQuery: extra.Encode()}
	signed, err := protocol.SignURL(sess.Secret, sess.ID, http.MethodGet, u, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return sess, signed.String()
}

// sign returns a fresh signed /authorize link of session sess.
func (e *refusalEnv) sign(sess lifecycle.Session, extra url.Values) string {
	e.t.Helper()
	u := &url.URL{Scheme: e.ext.Scheme, Host: e.ext.Host, Path: "/authorize", RawQuery: extra.Encode()}
	signed, err := protocol.SignURL(sess.Secret, sess.ID, http.MethodGet, u, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return signed.String()
}

// marks is how many single-use marks (link nonces, login states) the
// store holds.
func (e *refusalEnv) marks() int {
	_, _, m := e.store.Len()
	return m
}

// loginState opens link and returns the state it sends the browser to
// the identity provider with.
func (e *refusalEnv) loginState(link string) string {
	e.t.Helper()
	w := e.do(http.MethodGet, link, nil, nil)
	loc, err := url.Parse(w.Header().Get("Location"))
	if w.Code != http.StatusSeeOther || err != nil || !strings.HasPrefix(loc.String(), fakes.Issuer) {
		e.t.Fatalf("GET %s: %d to %q, want 303 to the identity provider:\n%s", link, w.Code, w.Header().Get("Location"), w.Body)
	}
	return loc.Query().Get("state")
}

// login goes from link through the identity provider as user to the
// selection page and returns the login cookie and the form the page
// posts when Bind is pressed with mangodbs ticked and confirmed.
func (e *refusalEnv) login(link, user string) (*http.Cookie, url.Values) {
	e.t.Helper()
	state := e.loginState(link)
	w := e.do(http.MethodGet, "/callback?"+url.Values{"state": {state}, "user": {user}}.Encode(), nil, nil)
	if w.Code != http.StatusSeeOther || !strings.HasPrefix(w.Header().Get("Location"), "/bind?s=") {
		e.t.Fatalf("callback: %d to %q, want 303 to /bind:\n%s", w.Code, w.Header().Get("Location"), w.Body)
	}
	var cookie *http.Cookie
	for _, c := range w.Result().Cookies() {
		if c.Name == e.h.loginCookie.name {
			cookie = c
		}
	}
	var lc loginCookie
	if cookie == nil || e.h.cookies.Decode(loginCookieName, cookie.Value, &lc) != nil {
		e.t.Fatalf("callback set no login cookie: %v", w.Result().Cookies())
	}
	if page := e.do(http.MethodGet, w.Header().Get("Location"), nil, nil, cookie); page.Code != http.StatusOK || !strings.Contains(page.Body.String(), lc.CSRF) {
		e.t.Fatalf("selection page: %d, want 200 with the CSRF token:\n%s", page.Code, page.Body)
	}
	return cookie, url.Values{
		"s":              {lc.Flow.SessionID},
		web.FieldCSRF:    {lc.CSRF},
		web.FieldAPI:     {"mangodbs.mangodb.com"},
		web.FieldAction:  {web.ActionBind},
		web.FieldConfirm: {web.ConfirmYes},
	}
}

func (e *refusalEnv) post(form url.Values, header http.Header, cookie *http.Cookie) *httptest.ResponseRecorder {
	e.t.Helper()
	if cookie == nil {
		return e.do(http.MethodPost, "/bind", form, header)
	}
	return e.do(http.MethodPost, "/bind", form, header, cookie)
}

func TestRefusalsInProcess(t *testing.T) {
	const (
		pending = "pending"
		denied  = "denied"
		gone    = "gone"
		done    = "completed"
	)
	cases := []struct {
		name string
		// run sends the refused request (after whatever leads up to it)
		// and returns its answer and the session it is about.
		run        func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session)
		wantStatus int
		wantText   string
		wantState  string // pending, denied, gone or completed
		wantReason string // in the deny reason, when denied
		// wantProvisions is 1 only for the control cases that bind.
		wantProvisions int
	}{
		{
			name:       "control: a good bind provisions once",
			run:        daveBinds(nil, nil),
			wantStatus: http.StatusOK, wantText: "mangodbs.mangodb.com", wantState: done, wantProvisions: 1,
		},
		{
			name: "tampered signature",
			run: getsLink(func(e *refusalEnv, link string) string {
				i := strings.Index(link, "&h=") + 3
				b := []byte(link)
				b[i] ^= 1
				return string(b)
			}),
			wantStatus: http.StatusUnauthorized, wantText: "not valid", wantState: pending,
		},
		{
			// Opening a link spends nothing; the first sign-in through
			// it does, and a second sign-in through it is refused.
			name: "reused nonce",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				s, link := e.pollLink("", nil)
				again := e.loginState(link)
				if n := e.marks(); n != 0 {
					e.t.Errorf("opening a link wrote %d marks, want none", n)
				}
				e.login(link, "dave")
				return e.do(http.MethodGet, "/callback?"+url.Values{"state": {again}, "user": {"dave"}}.Encode(), nil, nil), s
			},
			wantStatus: http.StatusUnauthorized, wantText: "already used", wantState: pending,
		},
		{
			name: "unknown session",
			run: getsLink(func(e *refusalEnv, link string) string {
				u, _ := url.Parse(link)
				q := u.Query()
				q.Set("s", "AAAAAAAAAAAAAAAAAAAAAA")
				u.RawQuery = q.Encode()
				return u.String()
			}),
			wantStatus: http.StatusNotFound, wantText: "not known", wantState: pending,
		},
		{
			name: "expired session",
			run: getsLink(func(e *refusalEnv, link string) string {
				e.clock.Advance(refusalTTL + time.Second)
				return link
			}),
			wantStatus: http.StatusGone, wantText: "expired", wantState: gone,
		},
		{
			// The pending check comes before the nonce: a link of a
			// completed session says so, whether its nonce was spent
			// (the link that was used) or not (a fresh one, which
			// stays unspent).
			name: "link of a completed session",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				s, link := e.pollLink("", nil)
				c, form := e.login(link, "dave")
				if w := e.post(form, nil, c); w.Code != http.StatusOK {
					e.t.Fatalf("bind: %d:\n%s", w.Code, w.Body)
				}
				marks := e.marks()
				if w := e.do(http.MethodGet, e.sign(s, nil), nil, nil); w.Code != http.StatusConflict || e.marks() != marks {
					e.t.Errorf("fresh link of a completed session: %d, marks %d -> %d; want 409 and nothing spent", w.Code, marks, e.marks())
				}
				return e.do(http.MethodGet, link, nil, nil), s
			},
			wantStatus: http.StatusConflict, wantText: "Already bound", wantState: done, wantProvisions: 1,
		},
		{
			name: "link of a denied session",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				s, link := e.pollLink("", nil)
				state := e.loginState(link)
				if w := e.do(http.MethodGet, "/callback?"+url.Values{"state": {state}, "user": {"mallory"}}.Encode(), nil, nil); w.Code != http.StatusForbidden {
					e.t.Fatalf("mallory's login: %d:\n%s", w.Code, w.Body)
				}
				return e.do(http.MethodGet, link, nil, nil), s
			},
			wantStatus: http.StatusForbidden, wantText: "Access denied", wantState: denied, wantReason: "may not bind",
		},
		{
			name:       "bind after the session expired",
			run:        daveBinds(func(e *refusalEnv, form url.Values) { e.clock.Advance(refusalTTL) }, nil),
			wantStatus: http.StatusGone, wantText: "expired", wantState: gone,
		},
		{
			name: "forged login state",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				s, link := e.pollLink("", nil)
				state := e.loginState(link)
				return e.do(http.MethodGet, "/callback?"+url.Values{"state": {state + "x"}, "user": {"carol"}}.Encode(), nil, nil), s
			},
			wantStatus: http.StatusBadRequest, wantText: "cannot be finished", wantState: pending,
		},
		{
			name: "replayed login state",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				s, link := e.pollLink("", nil)
				state := e.loginState(link)
				callback := "/callback?" + url.Values{"state": {state}, "user": {"carol"}}.Encode()
				if w := e.do(http.MethodGet, callback, nil, nil); w.Code != http.StatusSeeOther {
					e.t.Fatalf("genuine callback: %d:\n%s", w.Code, w.Body)
				}
				return e.do(http.MethodGet, callback, nil, nil), s
			},
			wantStatus: http.StatusBadRequest, wantText: "cannot be finished", wantState: pending,
		},
		{
			name:       "bind without the CSRF token",
			run:        daveBinds(func(e *refusalEnv, form url.Values) { form.Del(web.FieldCSRF) }, nil),
			wantStatus: http.StatusForbidden, wantText: "did not come from", wantState: pending,
		},
		{
			name:       "bind with a guessed CSRF token",
			run:        daveBinds(func(e *refusalEnv, form url.Values) { form.Set(web.FieldCSRF, "guessed") }, nil),
			wantStatus: http.StatusForbidden, wantText: "did not come from", wantState: pending,
		},
		{
			name:       "bind marked cross-site",
			run:        daveBinds(nil, http.Header{"Sec-Fetch-Site": {"cross-site"}}),
			wantStatus: http.StatusForbidden, wantText: "did not come from", wantState: pending,
		},
		{
			name:       "bind from a foreign origin",
			run:        daveBinds(nil, http.Header{"Origin": {"http://evil.example.com"}}),
			wantStatus: http.StatusForbidden, wantText: "did not come from", wantState: pending,
		},
		{
			name: "bind without the login cookie",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				s, link := e.pollLink("", nil)
				_, form := e.login(link, "dave")
				return e.post(form, nil, nil), s
			},
			wantStatus: http.StatusUnauthorized, wantText: "not signed in", wantState: pending,
		},
		{
			name: "bind of another session than the login's",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				_, link := e.pollLink("", nil)
				c, form := e.login(link, "dave")
				other, _ := e.pollLink("", nil)
				form.Set("s", other.ID)
				return e.post(form, nil, c), other
			},
			wantStatus: http.StatusBadRequest, wantText: "Another binding", wantState: pending,
		},
		{
			name: "API that is not exported",
			run: daveBinds(func(e *refusalEnv, form url.Values) {
				form[web.FieldAPI] = []string{"mangodbs.mangodb.com", "secretthings.internal.example.com"}
			}, nil),
			wantStatus: http.StatusUnprocessableEntity, wantText: "not offered", wantState: pending,
		},
		{
			name:       "bind without the confirmation",
			run:        daveBinds(func(e *refusalEnv, form url.Values) { form.Del(web.FieldConfirm) }, nil),
			wantStatus: http.StatusUnprocessableEntity, wantText: "Confirm that you started this binding yourself", wantState: pending,
		},
		{
			name:       "bind with a confirmation of another value",
			run:        daveBinds(func(e *refusalEnv, form url.Values) { form.Set(web.FieldConfirm, "on") }, nil),
			wantStatus: http.StatusUnprocessableEntity, wantText: "Confirm that you started", wantState: pending,
		},
		{
			name:       "cancel",
			run:        daveBinds(func(e *refusalEnv, form url.Values) { form.Set(web.FieldAction, web.ActionCancel) }, nil),
			wantStatus: http.StatusOK, wantText: "cancelled", wantState: denied, wantReason: "cancelled",
		},
		{
			name: "bind after cancel",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				s, link := e.pollLink("", nil)
				c, form := e.login(link, "dave")
				cancel := url.Values{}
				for k, v := range form {
					cancel[k] = v
				}
				cancel.Set(web.FieldAction, web.ActionCancel)
				if w := e.post(cancel, nil, c); w.Code != http.StatusOK {
					e.t.Fatalf("cancel: %d:\n%s", w.Code, w.Body)
				}
				return e.post(form, nil, c), s
			},
			wantStatus: http.StatusForbidden, wantText: "Access denied", wantState: denied, wantReason: "cancelled",
		},
		{
			name: "user outside the allow-list",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				s, link := e.pollLink("", nil)
				state := e.loginState(link)
				return e.do(http.MethodGet, "/callback?"+url.Values{"state": {state}, "user": {"mallory"}}.Encode(), nil, nil), s
			},
			wantStatus: http.StatusForbidden, wantText: "Access denied", wantState: denied, wantReason: "may not bind",
		},
		{
			// Declined at the identity provider, or an error callback
			// forged by whoever holds the link: nobody signed in, so
			// nothing is recorded and the link still works.
			name: "user declines at the identity provider",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				s, link := e.pollLink("", nil)
				state := e.loginState(link)
				w := e.do(http.MethodGet, "/callback?"+url.Values{"state": {state}, "error": {"access_denied"}}.Encode(), nil, nil)
				if o, d, m := e.store.Len(); o+d+m != 0 {
					e.t.Errorf("an error callback recorded %d outcomes, %d deliveries, %d marks; want none", o, d, m)
				}
				e.login(link, "dave")
				return w, s
			},
			wantStatus: http.StatusForbidden, wantText: "open the link from your terminal again", wantState: pending,
		},
		{
			name: "a code the identity provider refuses records nothing",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				s, link := e.pollLink("", nil)
				state := e.loginState(link)
				e.idp.Err = fmt.Errorf("%w: invalid_grant", oidc.ErrInvalidCallback)
				w := e.do(http.MethodGet, "/callback?"+url.Values{"state": {state}}.Encode(), nil, nil)
				if o, d, m := e.store.Len(); o+d+m != 0 {
					e.t.Errorf("a failed login recorded %d outcomes, %d deliveries, %d marks; want none", o, d, m)
				}
				return w, s
			},
			wantStatus: http.StatusBadRequest, wantText: "Nothing was recorded", wantState: pending,
		},
		{
			name: "HEAD of a signed link spends nothing",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				s, link := e.pollLink("", nil)
				w := e.do(http.MethodHead, link, nil, nil)
				if w.Header().Get("Location") != "" || w.Header().Get("Set-Cookie") != "" || w.Body.Len() != 0 {
					e.t.Errorf("HEAD: Location %q, Set-Cookie %q, %d body bytes; want none", w.Header().Get("Location"), w.Header().Get("Set-Cookie"), w.Body.Len())
				}
				if w.Code != http.StatusOK {
					return w, s
				}
				// The GET after it is the link's first use.
				e.loginState(link)
				return w, s
			},
			wantStatus: http.StatusOK, wantState: pending,
		},
		{
			name: "HEAD of a tampered link answers as its GET",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				s, link := e.pollLink("", nil)
				return e.do(http.MethodHead, link[:len(link)-2]+"xx", nil, nil), s
			},
			wantStatus: http.StatusUnauthorized, wantState: pending,
		},
		{
			name: "HEAD of the selection page",
			run: func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
				s, link := e.pollLink("", nil)
				c, _ := e.login(link, "dave")
				return e.do(http.MethodHead, "/bind?s="+url.QueryEscape(s.ID), nil, nil, c), s
			},
			wantStatus: http.StatusOK, wantState: pending,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newRefusalEnv(t)
			w, s := c.run(e)
			body := w.Body.String()
			if w.Code != c.wantStatus || !strings.Contains(body, c.wantText) {
				t.Errorf("got %d, want %d with %q in the page:\n%s", w.Code, c.wantStatus, c.wantText, body)
			}
			if w.Code >= 500 {
				t.Errorf("a client's mistake answered %d", w.Code)
			}
			if calls := e.prov.Take(); len(calls) != c.wantProvisions {
				t.Errorf("provisioned %d times, want %d: %+v", len(calls), c.wantProvisions, calls)
			}
			_, openErr := e.h.svc.Open(s.ID)
			got, err := e.store.Outcome(context.Background(), s.ID)
			switch {
			case c.wantState == gone:
				if !errors.Is(openErr, lifecycle.ErrExpired) {
					t.Errorf("session: %v (%v), want it expired", got.State, openErr)
				}
			case openErr != nil:
				t.Errorf("session: %v, want it %s", openErr, c.wantState)
			case err != nil:
				t.Errorf("session: %v, want it %s", err, c.wantState)
			case got.State.String() != c.wantState:
				t.Errorf("session is %v (%q), want %s", got.State, got.DenyReason, c.wantState)
			case !strings.Contains(got.DenyReason, c.wantReason):
				t.Errorf("deny reason %q, want it to say %q", got.DenyReason, c.wantReason)
			}
		})
	}
}

// A callback-flow link off this computer creates no session, and neither
// does the HEAD of a good one.
func TestCallbackFlowRefusalsInProcess(t *testing.T) {
	e := newRefusalEnv(t)
	for _, u := range []string{"https://evil.example.com/callback", "http://evil.example.com/callback", "http://127.0.0.1.evil.example.com/callback", "javascript:alert(1)", "//evil.example.com/x"} {
		link := "/authorize?" + url.Values{"u": {u}, "s": {"aB3dE9"}, "c": {"Zx81Qp"}}.Encode()
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			w := e.do(method, link, nil, nil)
			if w.Code != http.StatusBadRequest || (method == http.MethodGet && !strings.Contains(w.Body.String(), "cannot be used")) {
				t.Errorf("%s u=%s: %d, want 400 saying it cannot be used:\n%s", method, u, w.Code, w.Body)
			}
		}
	}
	good := "/authorize?" + url.Values{"p": {"41234"}, "s": {"aB3dE9"}, "c": {"Zx81Qp"}}.Encode()
	if w := e.do(http.MethodHead, good, nil, nil); w.Code != http.StatusOK || w.Header().Get("Location") != "" {
		t.Errorf("HEAD of a good callback link: %d, Location %q; want 200 and none", w.Code, w.Header().Get("Location"))
	}
	if n := e.loginsBegun(); n != 0 {
		t.Errorf("%d logins begun, want none", n)
	}
	// The control: its GET begins the one login, for a session of the
	// callback flow that is derived, not stored.
	e.loginState(e.h.path(good))
	if n := e.loginsBegun(); n != 1 {
		t.Errorf("GET of a good callback link: %d logins, want 1", n)
	}
	if o, d, m := e.store.Len(); o+d+m != 0 {
		t.Errorf("a callback-flow link stored %d outcomes, %d deliveries, %d marks; want nothing", o, d, m)
	}
}

// getsLink is a case's run: a GET of a fresh poll link, changed by edit.
func getsLink(edit func(e *refusalEnv, link string) string) func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
	return func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
		s, link := e.pollLink("", nil)
		return e.do(http.MethodGet, edit(e, link), nil, nil), s
	}
}

// daveBinds is a case's run: dave logs in through a fresh poll link and
// posts the bind form, changed by edit (nil: as served), with header.
func daveBinds(edit func(e *refusalEnv, form url.Values), header http.Header) func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
	return func(e *refusalEnv) (*httptest.ResponseRecorder, lifecycle.Session) {
		s, link := e.pollLink("", nil)
		c, form := e.login(link, "dave")
		if edit != nil {
			edit(e, form)
		}
		return e.post(form, header, c), s
	}
}

func (e *refusalEnv) loginsBegun() int { return e.idp.Begun() }

// The callback flow's bind hands the response to the CLI's callback and
// records nothing for a poll: the session stays pending in the store, and
// nothing can poll it. Its cancel records nothing either.
func TestCallbackFlowBindInProcess(t *testing.T) {
	e := newRefusalEnv(t)
	link := "/authorize?" + url.Values{"p": {"41234"}, "s": {"cliSession1"}, "c": {"Zx81Qp"}}.Encode()
	c, form := e.login(link, "dave")
	sess, err := e.h.svc.Open(form.Get("s"))
	if err != nil || sess.Flow != sessionkey.FlowCallback {
		t.Fatalf("session %q: flow %d, %v; want one of the callback flow", form.Get("s"), sess.Flow, err)
	}
	w := e.post(form, nil, c)
	loc, err := url.Parse(w.Header().Get("Location"))
	if w.Code != http.StatusFound || err != nil || loc.Host != "localhost:41234" || loc.Query().Get("response") == "" {
		t.Fatalf("bind: %d to %q, want 302 to the CLI's callback with the response", w.Code, w.Header().Get("Location"))
	}
	// The URL carries the response: no cache keeps the answer, and no
	// Referer goes on to the callback.
	if rp, cc := w.Header().Get("Referrer-Policy"), w.Header().Get("Cache-Control"); rp != "no-referrer" || cc != "no-store" {
		t.Errorf("the redirect with the response: Referrer-Policy %q, Cache-Control %q; want no-referrer, no-store", rp, cc)
	}
	if calls := e.prov.Take(); len(calls) != 1 || calls[0].ClusterID != "Zx81Qp" {
		t.Fatalf("provisioned %+v, want once for the CLI's cluster ID", calls)
	}
	if o, _ := e.store.Outcome(context.Background(), sess.ID); o.State != sessions.StatePending {
		t.Errorf("callback-flow session after the bind: %v, want nothing recorded", o.State)
	}

	link = "/authorize?" + url.Values{"p": {"41234"}, "s": {"cliSession2"}, "c": {"Zx81Qp"}}.Encode()
	c, form = e.login(link, "dave")
	form.Set(web.FieldAction, web.ActionCancel)
	if w := e.post(form, nil, c); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "cancelled") {
		t.Fatalf("cancel: %d:\n%s", w.Code, w.Body)
	}
	// (The scripted identity provider keeps its own login states.)
	if o, d, m := e.store.Len(); o+d+m != 0 {
		t.Errorf("store after two callback-flow logins: %d outcomes, %d deliveries, %d marks; want nothing", o, d, m)
	}
}

// The attack of phishing_test.go, in process: a link presenting a cluster
// ID without its proof (or with a forged one, or one of another session)
// binds under a new cluster ID, and the page says so; with the proof the
// presented ID is kept.
func TestPresentedClusterNeedsProofInProcess(t *testing.T) {
	const victim = "victimclusteridabcdefghijk"
	proofFor := func(e *refusalEnv, sid string) string {
		return protocol.ClusterProof(e.key.Secret(victim), sid)
	}
	cases := []struct {
		name  string
		extra func(e *refusalEnv) url.Values
	}{
		{"no proof", func(*refusalEnv) url.Values { return nil }},
		{"forged proof", func(*refusalEnv) url.Values {
			return url.Values{protocol.ProofParam: {protocol.ClusterProof("guessed-cluster-secret", "x")}}
		}},
		{"proof of another session", func(e *refusalEnv) url.Values {
			return url.Values{protocol.ProofParam: {proofFor(e, "AnotherSessionIDabcdef")}}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newRefusalEnv(t)
			_, link := e.pollLink(victim, c.extra(e))
			cookie, form := e.login(link, "alice")
			page := e.do(http.MethodGet, "/bind?s="+url.QueryEscape(form.Get("s")), nil, nil, cookie)
			if !strings.Contains(page.Body.String(), "could not prove") {
				t.Errorf("the selection page does not say the cluster was not proven:\n%s", page.Body)
			}
			if w := e.post(form, nil, cookie); w.Code != http.StatusOK {
				t.Fatalf("bind: %d:\n%s", w.Code, w.Body)
			}
			calls := e.prov.Take()
			if len(calls) != 1 || calls[0].ClusterID == victim {
				t.Fatalf("provisioned %+v, want once under a new cluster ID", calls)
			}
		})
	}
	t.Run("control: with the proof", func(t *testing.T) {
		e := newRefusalEnv(t)
		s, _, _ := e.h.svc.CreateSession(lifecycle.SessionRequest{Flow: sessionkey.FlowPoll, ClusterID: victim})
		if s.ClusterID != victim {
			t.Fatalf("session presents %q, want %q", s.ClusterID, victim)
		}
		cookie, form := e.login(e.sign(s, url.Values{protocol.ProofParam: {proofFor(e, s.ID)}}), "alice")
		if w := e.post(form, nil, cookie); w.Code != http.StatusOK {
			t.Fatalf("bind: %d:\n%s", w.Code, w.Body)
		}
		if calls := e.prov.Take(); len(calls) != 1 || calls[0].ClusterID != victim {
			t.Fatalf("provisioned %+v, want once under the proven cluster ID", calls)
		}
	})
}

// Past the store's write budget, a signed-in user's Bind is 503 with
// Retry-After and records nothing; once the budget refills, the same form
// binds (provisioning is idempotent) and records the one outcome.
func TestBindPastWriteBudget(t *testing.T) {
	e := newRefusalEnv(t)
	s, link := e.pollLink("", nil)
	c, form := e.login(link, "dave")
	spent := 0
	for ; spent <= sessions.DefaultLimits.WriteBurst; spent++ {
		if err := e.store.UseOnce(context.Background(), fmt.Sprint("filler-", spent), s.ExpiresAt); err != nil {
			if !errors.Is(err, sessions.ErrOverBudget) {
				t.Fatal(err)
			}
			break
		}
	}
	if spent > sessions.DefaultLimits.WriteBurst {
		t.Fatalf("%d writes at one instant, beyond the burst of %d", spent, sessions.DefaultLimits.WriteBurst)
	}
	w := e.post(form, nil, c)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Fatalf("bind past the write budget: %d (Retry-After %q), want 503 with Retry-After:\n%s", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	if o, err := e.store.Outcome(context.Background(), s.ID); err != nil || o.State != sessions.StatePending {
		t.Fatalf("after the refused bind the session is %v (%v), want pending", o.State, err)
	}
	e.clock.Advance(time.Second)
	if w := e.post(form, nil, c); w.Code != http.StatusOK {
		t.Fatalf("the same bind a second later: %d:\n%s", w.Code, w.Body)
	}
	if o, err := e.store.Outcome(context.Background(), s.ID); err != nil || o.State != sessions.StateCompleted {
		t.Fatalf("after the bind the session is %v (%v), want completed", o.State, err)
	}
}
