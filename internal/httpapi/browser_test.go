package httpapi

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// A callback-flow link whose port is not plain digits is refused before
// anything happens: no session, no login, no binding whose response would
// be lost on the way back (http://localhost:+41234/callback does not parse).
func TestAuthorizeCallbackPortDigitsOnly(t *testing.T) {
	be := newBrowserEnv(t, browserOpts{})
	for _, p := range []string{"+41234", "-41234", " 41234", "41234 ", "041234", "0x1F90", "65536", "0", "4e4"} {
		link := be.ext.String() + "/authorize?" + url.Values{"p": {p}, "s": {"aB3dE9"}, "c": {"Zx81Qp"}}.Encode()
		resp, body := be.send(be.jar(), http.MethodGet, link)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "port number") {
			t.Errorf("p=%q: %d, want 400 naming the port:\n%s", p, resp.StatusCode, body)
		}
		if n := be.store.Len(); n != 0 {
			t.Fatalf("p=%q: the store holds %d sessions, want none", p, n)
		}
		if c := resp.Header.Get("Set-Cookie"); c != "" {
			t.Errorf("p=%q: a refused link set a cookie: %s", p, c)
		}
	}
	// A good port goes on to the identity provider.
	link := be.ext.String() + "/authorize?" + url.Values{"p": {"41234"}, "s": {"aB3dE9"}, "c": {"Zx81Qp"}}.Encode()
	if resp, body := be.send(be.jar(), http.MethodGet, link); resp.StatusCode != http.StatusSeeOther || be.store.Len() != 1 {
		t.Fatalf("p=41234: %d (store %d sessions), want 303 and one session:\n%s", resp.StatusCode, be.store.Len(), body)
	}
}
