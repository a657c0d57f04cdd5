package browser

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"

	"github.com/gorilla/securecookie"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
)

// loginCookieName carries a logged-in user from the login callback to the
// bind POST. It is signed and encrypted, so the browser can neither read
// nor change who it says logged in. It is the name the content is signed
// under, and the cookie's name over plain http; over https the cookie is
// a __Host- cookie (see newLoginCookieSpec).
const loginCookieName = "kbp_login"

// loginCookieSpec is the name and path the login cookie is set, read and
// cleared with.
type loginCookieSpec struct {
	name, path string
	secure     bool
}

// newLoginCookieSpec: over https (secure) the cookie is
// "__Host-kbp_login" with Path=/ and no Domain, which a browser accepts
// only from this very host, so that no other host of the domain (a
// sibling or the parent) can set, shadow or overwrite a login; the same
// prefix as the identity provider's binding cookie (oidc.HostCookiePrefix).
// Over plain http (local development), where browsers refuse __Host-
// cookies, it keeps its name and the path of the selection page.
func newLoginCookieSpec(secure bool, bindPath string) loginCookieSpec {
	if secure {
		return loginCookieSpec{name: oidc.HostCookiePrefix + loginCookieName, path: "/", secure: true}
	}
	return loginCookieSpec{name: loginCookieName, path: bindPath}
}

type loginCookie struct {
	// Flow is the login's flow: its session, the cluster ID the bind uses
	// and how /authorize settled it (flow.go).
	Flow    flow   `json:"f"`
	Issuer  string `json:"iss"`
	Subject string `json:"sub"`
	Email   string `json:"email,omitempty"`
	// EmailVerified, Groups and GroupsKnown are recorded with the binding
	// for the allow-list re-check (binding.Claims).
	EmailVerified bool     `json:"ev,omitempty"`
	Groups        []string `json:"grp,omitempty"`
	GroupsKnown   bool     `json:"gk,omitempty"`
	// CSRF is the token the selection form must post back.
	CSRF string `json:"csrf"`
}

// cookieCodecs sign and encrypt the login cookie with the current key
// pair (the first codec) and open it with any pair of the configured
// signing and encryption keys (a key rotation).
type cookieCodecs []securecookie.Codec

// newCookieCodecs returns a codec for every pair of a signing key and an
// encryption key, the pair of the two current keys first. maxAge bounds
// the age of a cookie, in seconds.
func newCookieCodecs(hashKeys, blockKeys [][]byte, maxAge int) cookieCodecs {
	var cs cookieCodecs
	for _, hk := range hashKeys {
		for _, bk := range blockKeys {
			c := securecookie.New(hk, bk)
			c.MaxAge(maxAge)
			c.SetSerializer(securecookie.JSONEncoder{})
			cs = append(cs, c)
		}
	}
	return cs
}

// Encode signs and encrypts value with the current keys.
func (cs cookieCodecs) Encode(name string, value any) (string, error) {
	return securecookie.EncodeMulti(name, value, cs...)
}

// Decode opens a cookie made with any of the keys.
func (cs cookieCodecs) Decode(name, value string, dst any) error {
	return securecookie.DecodeMulti(name, value, dst, cs...)
}

func newCSRFToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (h *Handler) setLoginCookie(w http.ResponseWriter, lc loginCookie) error {
	v, err := h.cookies.Encode(loginCookieName, lc)
	if err != nil {
		return err
	}
	http.SetCookie(w, &http.Cookie{
		Name: h.loginCookie.name, Value: v, Path: h.loginCookie.path,
		MaxAge: int(h.svc.SessionTTL().Seconds()), HttpOnly: true, Secure: h.loginCookie.secure,
		SameSite: http.SameSiteLaxMode,
	})
	return nil
}

func (h *Handler) clearLoginCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{
		Name: h.loginCookie.name, Value: "", Path: h.loginCookie.path, MaxAge: -1,
		HttpOnly: true, Secure: h.loginCookie.secure, SameSite: http.SameSiteLaxMode,
	})
}

// loggedIn returns the browser's login and its pending session sid, or
// renders the page that says why there is none.
func (h *Handler) loggedIn(w http.ResponseWriter, r *http.Request, sid string) (loginCookie, lifecycle.Session, bool) {
	var lc loginCookie
	c, err := r.Cookie(h.loginCookie.name)
	if err != nil || h.cookies.Decode(loginCookieName, c.Value, &lc) != nil {
		h.page(w, http.StatusUnauthorized, pageNotLoggedIn, "")
		return lc, lifecycle.Session{}, false
	}
	if sid == "" || !constantTimeEqual(sid, lc.Flow.SessionID) {
		h.page(w, http.StatusBadRequest, pageOtherSession, "")
		return lc, lifecycle.Session{}, false
	}
	sess, err := h.session(lc.Flow)
	if err != nil {
		h.page(w, http.StatusGone, pageExpired, "")
		return lc, lifecycle.Session{}, false
	}
	if !h.stillPending(r.Context(), w, sess) {
		return lc, lifecycle.Session{}, false
	}
	return lc, sess, true
}

// claims are the login's claims the binding records.
func (lc loginCookie) claims() *binding.Claims {
	c := &binding.Claims{Groups: lc.Groups, GroupsKnown: lc.GroupsKnown}
	if lc.EmailVerified {
		c.Email = lc.Email
	}
	return c
}
