package browser

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// With the callback flow off (--callback-flow=false), a callback link (p
// or u, good or not) is refused before any login, creating nothing, and
// its HEAD gets the same status; poll-flow links still work.
func TestNoCallbackFlowRefusesCallbackLinks(t *testing.T) {
	e := newRefusalEnvWith(t, &url.URL{Scheme: "https", Host: "bind.example.com"}, func(c *Config) { c.NoCallbackFlow = true })
	for _, q := range []url.Values{
		{"p": {"41234"}, "s": {"aB3dE9"}, "c": {"Zx81Qp"}},
		{"u": {"http://127.0.0.1:5000/callback"}, "s": {"aB3dE9"}, "c": {"Zx81Qp"}},
		{"u": {"https://evil.example.com/callback"}},
		{"p": {"0"}},
	} {
		link := "/authorize?" + q.Encode()
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			w := e.do(method, link, nil, nil)
			if w.Code != http.StatusNotFound || w.Header().Get("Location") != "" {
				t.Errorf("%s %s: %d, Location %q; want 404 and none", method, link, w.Code, w.Header().Get("Location"))
			}
			if method == http.MethodGet {
				body := w.Body.String()
				if !strings.Contains(body, "poll flow only") || !strings.Contains(body, "kube-bind-poll") ||
					!strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
					t.Errorf("GET %s: the page does not say the provider binds with the poll flow only:\n%s", link, body)
				}
			}
		}
	}
	if n := e.loginsBegun(); n != 0 {
		t.Errorf("%d logins begun, want none", n)
	}
	if o, d, m := e.store.Len(); o+d+m != 0 {
		t.Errorf("refused callback links stored %d outcomes, %d deliveries, %d marks; want nothing", o, d, m)
	}
	// The poll flow is untouched.
	_, link := e.pollLink("", nil)
	e.loginState(link)
	if n := e.loginsBegun(); n != 1 {
		t.Errorf("poll-flow link: %d logins begun, want 1", n)
	}
}

// An allow-list belongs to the callback flow: with the flow off it is a
// configuration error, not something silently ignored.
func TestNewRefusesAllowListWithoutCallbackFlow(t *testing.T) {
	e := newRefusalEnv(t)
	cfg := e.h.cfg
	cfg.NoCallbackFlow = true
	cfg.CallbackAllowList = []string{"https://cli.example.com/cb"}
	if _, err := New(cfg); err == nil {
		t.Error("New accepted a callback allow-list with the callback flow off")
	}
	cfg.CallbackAllowList = nil
	if _, err := New(cfg); err != nil {
		t.Errorf("New refused the callback flow off without an allow-list: %v", err)
	}
}

// An allow-listed callback URL is matched exactly: nothing below its
// path, nothing that merely starts with it, no query; loopback http and p
// are not affected.
func TestCallbackAllowListIsExact(t *testing.T) {
	allow, errs := ParseCallbackAllowList([]string{"https://cli.example.com/cb", "https://root.example.com"})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	h := &Handler{allowList: allow}
	for u, ok := range map[string]bool{
		"https://cli.example.com/cb":     true,
		"https://CLI.example.com/cb":     true,
		"https://cli.example.com/cb/x":   false,
		"https://cli.example.com/cbx":    false,
		"https://cli.example.com/cb/":    false,
		"https://cli.example.com/cb?x=1": false,
		"https://cli.example.com/cb?":    false,
		"https://cli.example.com/%63b":   false,
		"https://cli.example.com:443/cb": false,
		"https://cli.example.com/":       false,
		"http://cli.example.com/cb":      false,
		// Userinfo, another port, a longer host, encoded or extra path
		// characters, a fragment: none is the allowed URL.
		"https://cli.example.com@evil.example.com/cb":   false,
		"https://evil@cli.example.com/cb":               false,
		"https://cli.example.com:8443/cb":               false,
		"https://cli.example.com.evil.example.com/cb":   false,
		"https://cli.example.com./cb":                   false,
		"https://cli.example.com/cb%2F..%2Fx":           false,
		"https://cli.example.com/cb/../cb":              false,
		"https://cli.example.com/c%62":                  false,
		"https://cli.example.com/cb%00":                 false,
		"https://cli.example.com/cb;x":                  false,
		"https://cli.example.com/cb#x":                  false,
		"https://cli.example.com/cb\\x":                 false,
		"https://cli.example.com%2Eevil.example.com/cb": false,
		"https://root.example.com":                      true,
		"https://root.example.com/":                     true,
		"https://root.example.com/x":                    false,
		"http://127.0.0.1:5000/cb?x=1":                  true,
		"http://localhost:8000/any/thing":               true,
	} {
		got, problem := h.callbackURL(url.Values{"u": {u}})
		switch {
		case ok && (got == nil || got.String() != u):
			t.Errorf("u=%s: got %v (%s), want it accepted as is", u, got, problem)
		case !ok && got != nil:
			t.Errorf("u=%s: accepted %s", u, got)
		}
	}
	if got, _ := h.callbackURL(url.Values{"p": {"43210"}}); got == nil || got.String() != "http://localhost:43210/callback" {
		t.Errorf("p=43210: got %v", got)
	}
	// An entry with a dot segment could only ever match a URL a browser
	// resolves elsewhere.
	if _, errs := ParseCallbackAllowList([]string{"https://cli.example.com/a/../cb", "https://x.example.com/cb?"}); len(errs) != 2 {
		t.Errorf("entries with a dot segment or an empty query: %v", errs)
	}
}

// A callback-flow login begun where the flow was on (another replica
// during a roll-out, or before a restart) and finished where it is off
// sends nothing to the callback: the login callback and the bind answer
// the 404 page, and nothing is provisioned.
func TestNoCallbackFlowRefusesLoginsInFlight(t *testing.T) {
	e := newRefusalEnv(t)
	link := func(s string) string {
		return "/authorize?" + url.Values{"p": {"41234"}, "s": {s}, "c": {"Zx81Qp"}}.Encode()
	}
	// Logged in with the flow on; the flow is turned off before Bind.
	c, form := e.login(link("cliSession1"), "dave")
	state := e.loginState(link("cliSession2"))
	e.h.cfg.NoCallbackFlow = true

	w := e.post(form, nil, c)
	if w.Code != http.StatusNotFound || w.Header().Get("Location") != "" || !strings.Contains(w.Body.String(), "poll flow only") {
		t.Errorf("bind with the flow turned off: %d to %q, want the 404 page:\n%.300s", w.Code, w.Header().Get("Location"), w.Body)
	}
	w = e.do(http.MethodGet, "/callback?"+url.Values{"state": {state}, "user": {"dave"}}.Encode(), nil, nil)
	if w.Code != http.StatusNotFound || w.Header().Get("Location") != "" || !strings.Contains(w.Body.String(), "poll flow only") {
		t.Errorf("login callback with the flow turned off: %d to %q, want the 404 page:\n%.300s", w.Code, w.Header().Get("Location"), w.Body)
	}
	if calls := e.prov.Take(); len(calls) != 0 {
		t.Errorf("provisioned %+v, want nothing", calls)
	}
}
