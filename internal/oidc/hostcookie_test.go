package oidc

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// The browser-binding cookie over https is a __Host- cookie (Secure,
// Path=/, no Domain: no other host, sibling or parent, can set or shadow
// it), and Finish reads it under that name only; over plain http (local
// development) it keeps its plain name.
func TestBindingCookieHostPrefix(t *testing.T) {
	idp := newTokenIdP(t)
	for _, c := range []struct {
		secure bool
		name   string // the cookie's name without the state ID
		attrs  []string
	}{
		{true, "__Host-kbp_oidc_", []string{"Path=/", "HttpOnly", "Secure", "SameSite=Lax"}},
		{false, "kbp_oidc_", []string{"Path=/", "HttpOnly", "SameSite=Lax"}},
	} {
		a, err := New(Config{
			IssuerURL: idp.srv.URL, ClientID: "backend", ClientSecret: "secret", RedirectURL: "https://bind.example.com/callback",
			SigningKey: signingKey, HTTPClient: idp.srv.Client(), SecureCookies: c.secure,
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.discover(t.Context(), true); err != nil {
			t.Fatal(err)
		}
		// begin starts a login and returns the Set-Cookie header, the
		// cookie and the callback query that the identity provider
		// would send back with an honoured code.
		begin := func() (string, *http.Cookie, url.Values) {
			t.Helper()
			w := httptest.NewRecorder()
			authURL, err := a.Begin(w, httptest.NewRequest(http.MethodGet, "https://bind.example.com/authorize", nil), []byte("flow"))
			if err != nil {
				t.Fatal(err)
			}
			cookies := w.Result().Cookies()
			if len(cookies) != 1 {
				t.Fatalf("secure %v: Begin set %d cookies, want 1", c.secure, len(cookies))
			}
			au, _ := url.Parse(authURL)
			code := "code-" + au.Query().Get("state")[:8]
			idp.issue(code, au.Query().Get("nonce"))
			return w.Header().Get("Set-Cookie"), cookies[0], url.Values{"state": {au.Query().Get("state")}, "code": {code}}
		}
		finish := func(q url.Values, cookie *http.Cookie) (*httptest.ResponseRecorder, error) {
			t.Helper()
			r := httptest.NewRequest(http.MethodGet, "https://bind.example.com/callback?"+q.Encode(), nil)
			r.AddCookie(cookie)
			w := httptest.NewRecorder()
			_, _, err := a.Finish(w, r)
			return w, err
		}

		setCookie, cookie, q := begin()
		if !strings.HasPrefix(setCookie, c.name) || !strings.HasPrefix(cookie.Name, c.name) {
			t.Errorf("secure %v: Set-Cookie %q, want the name to start with %q", c.secure, setCookie, c.name)
		}
		for _, want := range c.attrs {
			if !strings.Contains(setCookie, "; "+want) {
				t.Errorf("secure %v: Set-Cookie %q lacks %q", c.secure, setCookie, want)
			}
		}
		if strings.Contains(setCookie, "Domain=") || (!c.secure && strings.Contains(setCookie, "Secure")) {
			t.Errorf("secure %v: Set-Cookie %q has a Domain, or Secure over http", c.secure, setCookie)
		}
		// Finish reads the cookie under the name Begin set, and clears
		// that very cookie.
		w, err := finish(q, cookie)
		if err != nil {
			t.Fatalf("secure %v: Finish with the cookie Begin set: %v", c.secure, err)
		}
		if cleared := w.Result().Cookies(); len(cleared) != 1 || cleared[0].Name != cookie.Name || cleared[0].MaxAge >= 0 ||
			cleared[0].Path != "/" || cleared[0].Secure != c.secure {
			t.Errorf("secure %v: Finish cleared %+v, want %s (Path=/, Secure %v)", c.secure, cleared, cookie.Name, c.secure)
		}
		if c.secure {
			// The same value under the plain name (which any host of the
			// domain could set) is not this browser.
			_, cookie, q := begin()
			plain := &http.Cookie{Name: strings.TrimPrefix(cookie.Name, "__Host-"), Value: cookie.Value}
			if _, err := finish(q, plain); !errors.Is(err, ErrBrowserMismatch) {
				t.Errorf("the binding cookie without its __Host- prefix: %v, want ErrBrowserMismatch", err)
			}
		}
	}
}
