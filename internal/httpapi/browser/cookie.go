package browser

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"

	"github.com/kbprovider/backend/internal/sessions"
)

// loginCookieName carries a logged-in user from the login callback to the
// bind POST. It is signed and encrypted, so the browser can neither read
// nor change who it says logged in.
const loginCookieName = "kbp_login"

type loginCookie struct {
	SessionID string `json:"s"`
	Issuer    string `json:"iss"`
	Subject   string `json:"sub"`
	Email     string `json:"email,omitempty"`
	// ClusterID is the cluster ID the bind uses and ClusterKind how
	// /authorize settled it (flow.go).
	ClusterID   string      `json:"c"`
	ClusterKind clusterKind `json:"ck"`
	// CSRF is the token the selection form must post back.
	CSRF string `json:"csrf"`
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
		Name: loginCookieName, Value: v, Path: h.path("/bind"),
		MaxAge: int(h.cfg.SessionTTL.Seconds()), HttpOnly: true, Secure: h.secure,
		SameSite: http.SameSiteLaxMode,
	})
	return nil
}

func (h *Handler) clearLoginCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{
		Name: loginCookieName, Value: "", Path: h.path("/bind"), MaxAge: -1,
		HttpOnly: true, Secure: h.secure, SameSite: http.SameSiteLaxMode,
	})
}

// loggedIn returns the browser's login and its pending session sid, or
// renders the page that says why there is none.
func (h *Handler) loggedIn(w http.ResponseWriter, r *http.Request, sid string) (loginCookie, sessions.Session, bool) {
	var lc loginCookie
	c, err := r.Cookie(loginCookieName)
	if err != nil || h.cookies.Decode(loginCookieName, c.Value, &lc) != nil {
		h.page(w, http.StatusUnauthorized, pageNotLoggedIn, "")
		return lc, sessions.Session{}, false
	}
	if sid == "" || !constantTimeEqual(sid, lc.SessionID) {
		h.page(w, http.StatusBadRequest, pageOtherSession, "")
		return lc, sessions.Session{}, false
	}
	sess, err := h.cfg.Store.Get(r.Context(), sid)
	if err != nil {
		h.storeFailed(w, err)
		return lc, sessions.Session{}, false
	}
	if !h.stillPending(w, sess) {
		return lc, sessions.Session{}, false
	}
	return lc, sess, true
}
