package httpapi

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
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
		if got := be.stored(); got != [3]int{} {
			t.Fatalf("p=%q: the store holds %v (outcomes, deliveries, marks), want nothing", p, got)
		}
		if c := resp.Header.Get("Set-Cookie"); c != "" || resp.Header.Get("Location") != "" {
			t.Errorf("p=%q: a refused link set a cookie (%s) or redirected (%s)", p, c, resp.Header.Get("Location"))
		}
	}
	// A good port goes on to the identity provider, with the login's
	// cookie; a callback-flow session is derived, so nothing is stored.
	link := be.ext.String() + "/authorize?" + url.Values{"p": {"41234"}, "s": {"aB3dE9"}, "c": {"Zx81Qp"}}.Encode()
	resp, body := be.send(be.jar(), http.MethodGet, link)
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), be.idp.IssuerURL) || resp.Header.Get("Set-Cookie") == "" {
		t.Fatalf("p=41234: %d to %q, want 303 to the identity provider with a cookie:\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	if got := be.stored(); got != [3]int{} {
		t.Errorf("p=41234: the store holds %v, want nothing", got)
	}
}

// HEAD changes nothing: link previews and scanners send it, and the user's
// GET of the same link must still work. Every browser route and /poll.
func TestHeadHasNoSideEffects(t *testing.T) {
	be := newBrowserEnv(t, browserOpts{})

	t.Run("signed link", func(t *testing.T) {
		ps, link := be.authURL()
		client := be.jar()
		resp, _ := be.send(client, http.MethodHead, link)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Set-Cookie") != "" || resp.Header.Get("Location") != "" {
			t.Fatalf("HEAD of a good link: %d, Set-Cookie %q, Location %q; want 200 and neither header",
				resp.StatusCode, resp.Header.Get("Set-Cookie"), resp.Header.Get("Location"))
		}
		if s := be.sessionState(ps.SessionID); s.State != sessions.StatePending {
			t.Fatalf("session after HEAD: %v", s.State)
		}
		marks := be.stored()[2]
		resp, _ = be.send(client, http.MethodHead, link)
		if resp.StatusCode != http.StatusOK || be.stored()[2] != marks {
			t.Fatalf("second HEAD: %d, marks %d -> %d; want 200 and the nonce unspent", resp.StatusCode, marks, be.stored()[2])
		}
		// The GET that follows begins the login, and spends nothing
		// either: the nonce is spent by a sign-in.
		resp, body := be.send(client, http.MethodGet, link)
		if resp.StatusCode != http.StatusSeeOther || be.stored()[2] != marks {
			t.Fatalf("GET after HEAD: %d, marks %d -> %d; want 303 to the identity provider and nothing spent:\n%s", resp.StatusCode, marks, be.stored()[2], body)
		}
		// HEAD of a link that is not good answers what its GET answers.
		resp, _ = be.send(be.jar(), http.MethodHead, link[:len(link)-2]+"xx")
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("HEAD of a tampered link: %d, want 401", resp.StatusCode)
		}
	})

	t.Run("callback-flow link", func(t *testing.T) {
		before := be.stored()
		link := be.ext.String() + "/authorize?" + url.Values{"p": {"41234"}, "s": {"aB3dE9"}, "c": {"Zx81Qp"}}.Encode()
		resp, _ := be.send(be.jar(), http.MethodHead, link)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Set-Cookie") != "" || resp.Header.Get("Location") != "" {
			t.Fatalf("HEAD: %d, Set-Cookie %q, Location %q", resp.StatusCode, resp.Header.Get("Set-Cookie"), resp.Header.Get("Location"))
		}
		if got := be.stored(); got != before {
			t.Fatalf("HEAD changed the store: %v -> %v", before, got)
		}
	})

	t.Run("login callback and selection page", func(t *testing.T) {
		ps, link := be.authURL()
		client, back := be.loginCallback(link)
		resp, _ := be.send(client, http.MethodHead, back.String())
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET" || resp.Header.Get("Set-Cookie") != "" {
			t.Fatalf("HEAD of the callback: %d, Allow %q, Set-Cookie %q; want 405, GET, none",
				resp.StatusCode, resp.Header.Get("Allow"), resp.Header.Get("Set-Cookie"))
		}
		resp, body := be.send(client, http.MethodGet, back.String())
		if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "/bind?s=") {
			t.Fatalf("GET of the callback after HEAD: %d, want 303 to /bind:\n%s", resp.StatusCode, body)
		}
		sel := resp.Header.Get("Location")
		if !strings.HasPrefix(sel, "http") {
			sel = be.ext.String() + sel
		}
		head, _ := be.send(client, http.MethodHead, sel)
		get, page := be.send(client, http.MethodGet, sel)
		if head.StatusCode != http.StatusOK || get.StatusCode != http.StatusOK || !strings.Contains(page, "mangodbs.mangodb.com") {
			t.Fatalf("selection page: HEAD %d, GET %d", head.StatusCode, get.StatusCode)
		}
		if s := be.sessionState(ps.SessionID); s.State != sessions.StatePending {
			t.Fatalf("session after HEADs: %v", s.State)
		}
	})

	t.Run("poll", func(t *testing.T) {
		ps := be.createSession("")
		signed := be.pollURL(ps)
		resp, _ := be.send(be.jar(), http.MethodHead, signed)
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("HEAD /poll: %d, want 405", resp.StatusCode)
		}
		wantError(t, be.do(http.MethodGet, signed, nil), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
	})
}
