package httpapi

import (
	"bytes"
	"context"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/internal/testutil/fakes"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

var hiddenField = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// selection logs idpUser in through link and returns the client and the
// selection page's form as a browser would post it, one API ticked.
func (be *browserEnv) selection(link string) (*http.Client, url.Values) {
	be.t.Helper()
	client, back := be.loginCallback(link)
	resp, body := be.send(client, http.MethodGet, back.String())
	if resp.StatusCode != http.StatusSeeOther {
		be.t.Fatalf("login callback: %d\n%s", resp.StatusCode, body)
	}
	resp, body = be.send(client, http.MethodGet, be.ext.String()+strings.TrimPrefix(resp.Header.Get("Location"), be.ext.String()))
	if resp.StatusCode != http.StatusOK {
		be.t.Fatalf("selection page: %d\n%s", resp.StatusCode, body)
	}
	form := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(body, -1) {
		form.Set(html.UnescapeString(m[1]), html.UnescapeString(m[2]))
	}
	form.Set("api", "mangodbs.mangodb.com")
	form.Set("action", "bind")
	return client, form
}

func (be *browserEnv) postBind(client *http.Client, form url.Values) (*http.Response, string) {
	be.t.Helper()
	resp, err := client.PostForm(be.ext.String()+"/bind", form)
	if err != nil {
		be.t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp, string(readAll(be.t, resp))
}

// A form naming an API the provider does not export is a request that
// cannot be done: 422 with the page again saying so, nothing provisioned.
func TestBindForgedAPIIs422(t *testing.T) {
	be := newBrowserEnv(t, browserOpts{})
	ps, link := be.authURL()
	client, form := be.selection(link)
	form["api"] = []string{"mangodbs.mangodb.com", "secretthings.internal.example.com"}
	resp, body := be.postBind(client, form)
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, "not offered") || !strings.Contains(body, "Choose APIs") {
		t.Fatalf("forged API: %d, want 422 with the selection page saying it is not offered:\n%s", resp.StatusCode, body)
	}
	form.Del("api")
	if resp, body := be.postBind(client, form); resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, "at least one") {
		t.Fatalf("no API: %d, want 422 asking for one:\n%s", resp.StatusCode, body)
	}
	if s := be.sessionState(ps.SessionID); s.State != sessions.StatePending {
		t.Fatalf("session after refused forms: %v", s.State)
	}
}

// The browser routes answer a method they do not take with 405 and the
// methods they do take, like the API routes.
func TestBrowserRoutesWrongMethod(t *testing.T) {
	be := newBrowserEnv(t, browserOpts{})
	for _, c := range []struct{ method, path, allow string }{
		{"POST", "/authorize", "GET, HEAD"},
		{"DELETE", "/authorize", "GET, HEAD"},
		{"POST", "/callback", "GET"},
		{"HEAD", "/callback", "GET"},
		{"PUT", "/bind", "GET, HEAD, POST"},
		{"OPTIONS", "/bind", "GET, HEAD, POST"},
	} {
		resp, body := be.send(be.jar(), c.method, be.ext.String()+c.path)
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d, Allow %q; want 405, Allow %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), c.allow)
		}
		if c.method != "HEAD" && !strings.Contains(body, "not allowed") {
			t.Errorf("%s %s: page does not say so:\n%s", c.method, c.path, body)
		}
	}
	if resp, _ := be.send(be.jar(), "GET", be.ext.String()+"/static/nothing.css"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET of a missing static file: %d, want 404", resp.StatusCode)
	}
}

// A session of the callback flow cannot be polled: 410, as documented,
// not 401 for a signature nobody can make.
func TestPollOfCallbackFlowSessionIs410(t *testing.T) {
	be := newBrowserEnv(t, browserOpts{})
	link := be.ext.String() + "/authorize?" + url.Values{"p": {"41234"}, "s": {"aB3dE9"}, "c": {"Zx81Qp"}}.Encode()
	client := be.jar()
	back, err := be.idp.Login(context.Background(), client, link, idpUser.Name, idpUser.Password)
	if err != nil {
		t.Fatal(err)
	}
	resp, _ := be.send(client, http.MethodGet, back.String())
	sel, _ := url.Parse(resp.Header.Get("Location"))
	sid := sel.Query().Get("s")
	if sid == "" {
		t.Fatalf("callback-flow login did not lead to the selection page: %d %v", resp.StatusCode, resp.Header)
	}
	// Whoever polls it signs with some secret: there is none to know.
	msg := wantError(t, be.poll(v1alpha1.PollSession{SessionID: sid, SessionSecret: "guessed-secret-guessed-secret-guessed-secre"}),
		http.StatusGone, v1alpha1.ErrorExpiredToken)
	if !strings.Contains(msg, "start over") {
		t.Errorf("message %q", msg)
	}
}

// A link whose session's key was retired (rotated out after its sessions
// expired, or never this backend's) says the session ended (410, "run the
// command again"), as does an expired one; a link that cannot be one of
// this backend's is unknown (404). The poll of the same session is 410.
func TestLinkOfRetiredKeyIs410(t *testing.T) {
	retired, err := sessionkey.New(bytes.Repeat([]byte("r"), sessionkey.MinKeyLen))
	if err != nil {
		t.Fatal(err)
	}
	login := &fakes.Login{}
	e := newEnv(t, envOpts{login: login, ttl: time.Minute})
	authorize := func(s sessionkey.Session) string {
		return e.signedURL(v1alpha1.PollSession{SessionID: s.ID, SessionSecret: s.Secret}, e.ext.String()+"/authorize")
	}
	get := func(link string) (int, string) {
		resp := e.do(http.MethodGet, link, nil)
		return resp.StatusCode, string(readAll(t, resp))
	}

	old := retired.Issue(sessionkey.FlowPoll, "", e.clock.Now().Add(time.Minute))
	if code, body := get(authorize(old)); code != http.StatusGone || !strings.Contains(body, "expired") {
		t.Fatalf("link of a retired key: %d, want 410 expired:\n%s", code, body)
	}
	wantError(t, e.poll(v1alpha1.PollSession{SessionID: old.ID, SessionSecret: old.Secret}), http.StatusGone, v1alpha1.ErrorExpiredToken)

	ps := e.createSession("")
	link := authorize(e.open(ps.SessionID).Session)
	e.clock.Advance(time.Minute)
	if code, body := get(link); code != http.StatusGone || !strings.Contains(body, "expired") {
		t.Fatalf("link of an expired session: %d, want 410 expired:\n%s", code, body)
	}

	// A link that was never ours is unknown, and so is one of our keys of
	// the callback flow (nobody outside holds its secret, nothing signs
	// links for it).
	u, _ := url.Parse(link)
	q := u.Query()
	q.Set("s", "AAAAAAAAAAAAAAAAAAAAAA")
	u.RawQuery = q.Encode()
	if code, _ := get(u.String()); code != http.StatusNotFound {
		t.Errorf("link with a made-up session ID: %d, want 404", code)
	}
	cb := callbackSession(e.svc, "http://127.0.0.1:5000/callback", "cli")
	if code, body := get(authorize(cb.Session)); code != http.StatusNotFound || !strings.Contains(body, "not known") {
		t.Errorf("signed link of a callback-flow session: %d, want 404:\n%s", code, body)
	}
	if login.Begun() != 0 || e.stored() != [3]int{} {
		t.Errorf("refused links began %d logins and stored %v", login.Begun(), e.stored())
	}
}

// No 400 answer names a Go type: the message is for the client's author.
func TestBadRequestMessagesNameNoGoTypes(t *testing.T) {
	e := newEnv(t, envOpts{})
	for _, body := range []string{`[]`, `"x"`, `42`, `true`, `{"clusterID": 5}`, `{"clusterID": {}}`, `{"clusterID": []}`, `{"clusterID": true}`, `{"clusterID":`, `{"a":1}`} {
		msg := wantError(t, e.do("POST", "/sessions", strings.NewReader(body)), 400, "invalid_request")
		for _, leak := range []string{"CreateSessionRequest", "v1alpha1", "struct", "json:", "Go value", "main."} {
			if strings.Contains(msg, leak) {
				t.Errorf("body %s: message %q shows %q", body, msg, leak)
			}
		}
	}
}

// logLines returns the log lines at level.
func logLines(logs, level string) []string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, `"level":"`+level+`"`) {
			out = append(out, l)
		}
	}
	return out
}

// Client mistakes are 4xx and are logged below ERROR: ERROR is for what
// an operator must act on. A flood of sessions and callback-flow links is
// served: sessions are derived, not stored, so nothing fills up.
func TestClientMistakesAreNotErrors(t *testing.T) {
	be := newBrowserEnv(t, browserOpts{limits: sessions.Limits{MaxPolledSessions: 4}})

	// A callback whose code is missing or altered, or that names another
	// issuer, with the genuine state of this browser.
	for name, edit := range map[string]func(url.Values){
		"no code":      func(q url.Values) { q.Del("code") },
		"other issuer": func(q url.Values) { q.Set("iss", "https://evil.example.com") },
		"altered code": func(q url.Values) { q.Set("code", q.Get("code")+"x") },
	} {
		_, link := be.authURL()
		client, back := be.loginCallback(link)
		q := back.Query()
		edit(q)
		back.RawQuery = q.Encode()
		if resp, body := be.send(client, http.MethodGet, back.String()); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400:\n%s", name, resp.StatusCode, body)
		}
	}

	// A used link (a second sign-in through it), a tampered one, a poll
	// of an unknown session.
	_, link := be.authURL()
	client, back := be.loginCallback(link)
	if resp, body := be.send(client, http.MethodGet, back.String()); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("first sign-in through the link: %d, want 303:\n%s", resp.StatusCode, body)
	}
	client, back = be.loginCallback(link)
	if resp, _ := be.send(client, http.MethodGet, back.String()); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("used link: %d, want 401", resp.StatusCode)
	}
	if resp, _ := be.send(be.jar(), http.MethodGet, link[:len(link)-2]+"xx"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("tampered link: %d, want 401", resp.StatusCode)
	}
	wantError(t, be.poll(v1alpha1.PollSession{SessionID: "AAAAAAAAAAAAAAAAAAAAAA", SessionSecret: "x"}), http.StatusGone, v1alpha1.ErrorExpiredToken)

	// A flood, far beyond the store's limits: every one is served.
	for i := 0; i < 40; i++ {
		be.createSession("")
		link := be.ext.String() + "/authorize?" + url.Values{"p": {"41234"}, "s": {"aB3dE9"}, "c": {"Zx81Qp"}}.Encode()
		if resp, _ := be.send(be.jar(), http.MethodGet, link); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("callback-flow link %d of a flood: %d, want 303", i, resp.StatusCode)
		}
	}
	if errs := logLines(be.logs.String(), "ERROR"); len(errs) != 0 {
		t.Errorf("%d ERROR lines for client mistakes, e.g.\n%s", len(errs), errs[0])
	}
}

var retryLink = regexp.MustCompile(`<a class="button" id="retry" href="([^"]+)">Try again</a>`)

// An identity provider whose token endpoint accepts the connection and
// never answers: the callback gives up after the exchange timeout with 503
// and Retry-After, the session stays pending (the poll says so, not
// access_denied), and the page's "Try again" finishes the login once the
// provider answers again. Discovery and login are the real provider's.
func TestIdPHangsDuringExchange(t *testing.T) {
	be := newBrowserEnv(t, browserOpts{oidc: func(c *oidc.Config) { c.ExchangeTimeout = time.Second }})
	ps, link := be.authURL()
	client, back := be.loginCallback(link)

	hang := procs.HangingListener(t)
	be.tokenDiversion.Store(&hang)
	resp, body := be.send(client, http.MethodGet, back.String())
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "Try again") {
		t.Fatalf("callback while the token endpoint hangs: %d, Retry-After %q; want 503 with Retry-After and Try again:\n%s",
			resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if s := be.sessionState(ps.SessionID); s.State != sessions.StatePending {
		t.Fatalf("session after the hang: %v (%s), want pending", s.State, s.DenyReason)
	}
	be.clock.Advance(2 * time.Second)
	wantError(t, be.poll(ps), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
	if errs := logLines(be.logs.String(), "ERROR"); len(errs) != 0 {
		t.Errorf("a transient identity provider failure logged at ERROR: %s", errs[0])
	}

	// The provider answers again: Try again.
	be.tokenDiversion.Store(nil)
	m := retryLink.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no Try again link:\n%s", body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	back, err := be.idp.Login(ctx, client, html.UnescapeString(m[1]), idpUser.Name, idpUser.Password)
	if err != nil {
		t.Fatal(err)
	}
	resp, body = be.send(client, http.MethodGet, back.String())
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "/bind?s="+ps.SessionID) {
		t.Fatalf("callback after Try again: %d, want 303 to the selection page:\n%s", resp.StatusCode, body)
	}
}
