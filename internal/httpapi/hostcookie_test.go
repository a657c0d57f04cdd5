package httpapi

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Over an https external URL every cookie the browser gets (the identity
// provider's binding cookie, the login cookie, and their clearing) is a
// __Host- cookie: Path=/, Secure, HttpOnly, SameSite=Lax, no Domain; and a
// browser that keeps them as set gets through the login to the selection
// page, so each is read under the name it was set with. The
// real router, browser handler, oidc.Authenticator and identity provider.
func TestHostCookiesOverHTTPS(t *testing.T) {
	be := newBrowserEnv(t, browserOpts{https: true})
	if be.ext.Scheme != "https" {
		t.Fatalf("external URL %s", be.ext)
	}
	checkCookies := func(step string, resp *http.Response, want int) {
		t.Helper()
		set := resp.Header.Values("Set-Cookie")
		if len(set) != want {
			t.Errorf("%s: %d cookies set, want %d: %q", step, len(set), want, set)
		}
		for _, sc := range set {
			if !strings.HasPrefix(sc, "__Host-") {
				t.Errorf("%s: Set-Cookie %q without the __Host- prefix", step, sc)
			}
			attrs := strings.Split(sc, "; ")[1:]
			for _, a := range []string{"Path=/", "Secure", "HttpOnly", "SameSite=Lax"} {
				if !strings.Contains(";"+strings.Join(attrs, ";")+";", ";"+a+";") {
					t.Errorf("%s: Set-Cookie %q lacks %s", step, sc, a)
				}
			}
			if strings.Contains(sc, "Domain=") {
				t.Errorf("%s: Set-Cookie %q has a Domain", step, sc)
			}
		}
		if got := resp.Header.Get("Strict-Transport-Security"); got != "max-age=31536000" {
			t.Errorf("%s: Strict-Transport-Security %q", step, got)
		}
	}

	_, link := be.authURL()
	client := be.tlsJar()
	resp, body := be.send(client, http.MethodGet, link)
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), be.idp.IssuerURL) {
		t.Fatalf("GET %s: %d to %q, want 303 to the identity provider:\n%s", link, resp.StatusCode, resp.Header.Get("Location"), body)
	}
	checkCookies("authorize", resp, 1)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	back, err := be.idp.Login(ctx, client, resp.Header.Get("Location"), idpUser.Name, idpUser.Password)
	if err != nil {
		t.Fatalf("login at the identity provider: %v", err)
	}
	// The identity provider redirects to the registered callback URL of
	// the test server; the browser reaches it through the ingress.
	back.Scheme, back.Host = be.ext.Scheme, be.ext.Host
	resp, body = be.send(client, http.MethodGet, back.String())
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "/bind?s=") {
		t.Fatalf("callback: %d to %q, want 303 to /bind:\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	checkCookies("callback", resp, 2) // the binding cookie cleared, the login cookie set

	sel, err := be.ext.Parse(resp.Header.Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	resp, body = be.send(client, http.MethodGet, sel.String())
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "mangodbs.mangodb.com") {
		t.Fatalf("selection page with the browser's cookies: %d, want 200 with the APIs:\n%s", resp.StatusCode, body)
	}
	u, _ := url.Parse(be.ext.String())
	for _, c := range client.Jar.Cookies(u) {
		if !strings.HasPrefix(c.Name, "__Host-") && strings.HasPrefix(c.Name, "kbp_") {
			t.Errorf("the browser holds the backend's cookie %s without the __Host- prefix", c.Name)
		}
	}
}
