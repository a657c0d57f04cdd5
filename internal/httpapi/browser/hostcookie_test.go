package browser

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/kbprovider/backend/web"
)

// The login cookie over https is a __Host- cookie (Secure, Path=/, no
// Domain: no other host of the domain can set, shadow or overwrite it),
// and the selection page and the bind read it under that name only; over
// plain http (local development) it keeps its name and path.
func TestLoginCookieHostPrefix(t *testing.T) {
	for _, c := range []struct {
		ext   string
		name  string
		attrs []string
	}{
		{"https://bind.example.com", "__Host-kbp_login", []string{"Path=/", "HttpOnly", "Secure", "SameSite=Lax"}},
		{"https://bind.example.com/kb", "__Host-kbp_login", []string{"Path=/", "HttpOnly", "Secure", "SameSite=Lax"}},
		{"http://127.0.0.1:8080", "kbp_login", []string{"Path=/bind", "HttpOnly", "SameSite=Lax"}},
	} {
		ext, _ := url.Parse(c.ext)
		e := newRefusalEnvAt(t, ext)
		_, link := e.pollLink("", nil)
		state := e.loginState(link)
		w := e.do(http.MethodGet, "/callback?"+url.Values{"state": {state}, "user": {"ada"}}.Encode(), nil, nil)
		setCookies := w.Header().Values("Set-Cookie")
		if w.Code != http.StatusSeeOther || len(setCookies) != 1 {
			t.Fatalf("%s: callback: %d, Set-Cookie %q; want 303 with one cookie", c.ext, w.Code, setCookies)
		}
		setCookie := setCookies[0]
		if !strings.HasPrefix(setCookie, c.name+"=") {
			t.Errorf("%s: Set-Cookie %q, want the cookie %s", c.ext, setCookie, c.name)
		}
		for _, want := range c.attrs {
			if !strings.Contains(setCookie, "; "+want+";") && !strings.HasSuffix(setCookie, "; "+want) {
				t.Errorf("%s: Set-Cookie %q lacks %q", c.ext, setCookie, want)
			}
		}
		if strings.Contains(setCookie, "Domain=") || (ext.Scheme == "http" && strings.Contains(setCookie, "Secure")) {
			t.Errorf("%s: Set-Cookie %q has a Domain, or Secure over http", c.ext, setCookie)
		}
		cookie := w.Result().Cookies()[0]

		// The selection page reads the cookie under the name it was set
		// with, and under no other.
		// The routes are mounted below the path prefix; do takes them without.
		sel := strings.TrimPrefix(w.Header().Get("Location"), strings.TrimSuffix(ext.Path, "/"))
		if page := e.do(http.MethodGet, sel, nil, nil, cookie); page.Code != http.StatusOK {
			t.Errorf("%s: the selection page with the cookie set: %d, want 200:\n%s", c.ext, page.Code, page.Body)
		}
		if ext.Scheme == "https" {
			plain := &http.Cookie{Name: strings.TrimPrefix(cookie.Name, "__Host-"), Value: cookie.Value}
			if page := e.do(http.MethodGet, sel, nil, nil, plain); page.Code != http.StatusUnauthorized {
				t.Errorf("%s: the login cookie without its __Host- prefix: %d, want 401", c.ext, page.Code)
			}
		}

		// Cancel clears that very cookie (same name, path and flags).
		var lc loginCookie
		if err := e.h.cookies.Decode(loginCookieName, cookie.Value, &lc); err != nil {
			t.Fatal(err)
		}
		form := url.Values{"s": {lc.Flow.SessionID}, web.FieldCSRF: {lc.CSRF}, web.FieldAction: {web.ActionCancel}}
		w = e.do(http.MethodPost, "/bind", form, nil, cookie)
		cleared := w.Result().Cookies()
		if w.Code != http.StatusOK || len(cleared) != 1 || cleared[0].Name != cookie.Name || cleared[0].Path != cookie.Path ||
			cleared[0].Secure != cookie.Secure || cleared[0].MaxAge >= 0 {
			t.Errorf("%s: cancel: %d, cleared %+v; want 200 clearing %s (Path %s)", c.ext, w.Code, cleared, cookie.Name, cookie.Path)
		}
	}
}
