// Package browser serves the browser part of both binding flows
// (docs/protocol.md §5 and §8): GET /authorize checks the link the CLI
// printed and sends the browser to the identity provider, GET /callback
// finishes the login, GET /bind shows the API selection page and POST /bind
// provisions the consumer and hands the BindingResponse over: into the
// session store for the poll flow, as a redirect to the CLI's localhost
// callback for the callback flow.
//
// The handlers parse, call the packages that own the logic and render:
// protocol checks links, lifecycle creates, completes and denies sessions
// (provisioning through binding), oidc logs users in, web renders pages.
package browser

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kbprovider/backend/internal/httpapi/mount"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/oidc/clitoken"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
)

// Login is the identity provider login (implemented by *oidc.Authenticator).
type Login interface {
	Begin(w http.ResponseWriter, r *http.Request, flowState []byte) (string, error)
	Finish(w http.ResponseWriter, r *http.Request) (oidc.Identity, []byte, error)
}

// Config configures the browser handler.
type Config struct {
	// ExternalURL is the backend's public URL: links are checked against
	// its scheme and host, and every page and redirect of ours is built
	// from it.
	ExternalURL  *url.URL
	ProviderName string
	// Sessions issues, checks, binds and ends sessions, and lists what
	// consumers may pick (the one instance every part shares). Required.
	Sessions *lifecycle.Service
	Login    Login
	// CookieHashKeys authenticate (SigningKeyLengths) and
	// CookieBlockKeys (EncryptionKeyLengths) encrypt the cookie that
	// carries a logged-in user to the bind POST; at least one of each.
	// The first of each list is current: a cookie is made with that pair.
	// The others (during a rotation) are still accepted: a cookie made
	// with any signing key and any encryption key of the lists decodes
	// (every pair is tried), so the two lists may have different lengths
	// and rotate independently.
	CookieHashKeys, CookieBlockKeys [][]byte
	// CallbackAllowList are callback URLs (scheme://host[:port]/path) that
	// a callback-flow u may be, exactly, besides http URLs on a loopback
	// host. Empty when NoCallbackFlow is set.
	CallbackAllowList []string
	// NoCallbackFlow turns the callback flow (OAuth2CodeGrant) off:
	// /authorize refuses a callback link (p or u) before any login.
	NoCallbackFlow bool
	Logger         *slog.Logger
	Now            func() time.Time
	// Tokens mint the CLI token at the end of `kubectl bind login`
	// (FlowCLILogin); nil: that login is not served.
	Tokens *clitoken.Tokens
}

// Handler serves the browser routes.
type Handler struct {
	cfg       Config
	svc       *lifecycle.Service
	log       *slog.Logger
	cookies   cookieCodecs
	allowList []*url.URL
	prefix    string
	// loginCookie is the login cookie's name and path: a __Host- cookie
	// when the external URL is https.
	loginCookie loginCookieSpec
}

// New checks cfg and returns the handler.
func New(cfg Config) (*Handler, error) {
	switch {
	case cfg.ExternalURL == nil:
		return nil, errors.New("browser: ExternalURL is required")
	case cfg.Sessions == nil || cfg.Login == nil:
		return nil, errors.New("browser: Sessions and Login are required")
	case len(cfg.CookieHashKeys) == 0 || len(cfg.CookieBlockKeys) == 0:
		return nil, errors.New("browser: a cookie signing key and a cookie encryption key are required")
	}
	if err := checkKeys("cookie signing key", cfg.CookieHashKeys, SigningKeyLengths); err != nil {
		return nil, err
	}
	if err := checkKeys("cookie encryption key", cfg.CookieBlockKeys, EncryptionKeyLengths); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.NoCallbackFlow && len(cfg.CallbackAllowList) > 0 {
		return nil, errors.New("browser: a callback allow-list with the callback flow off")
	}
	allow, errs := ParseCallbackAllowList(cfg.CallbackAllowList)
	if len(errs) > 0 {
		return nil, fmt.Errorf("browser: callback allow-list: %w", errors.Join(errs...))
	}
	h := &Handler{
		svc:       cfg.Sessions,
		cfg:       cfg,
		log:       cfg.Logger,
		cookies:   newCookieCodecs(cfg.CookieHashKeys, cfg.CookieBlockKeys, int(cfg.Sessions.SessionTTL()/time.Second)),
		allowList: allow,
		prefix:    strings.TrimSuffix(cfg.ExternalURL.EscapedPath(), "/"),
	}
	h.loginCookie = newLoginCookieSpec(strings.EqualFold(cfg.ExternalURL.Scheme, "https"), h.path("/bind"))
	return h, nil
}

// Mount mounts the browser routes below the external URL's path. GET
// routes take HEAD too (see linkLooksGood for /authorize), except the
// callback, whose GET finishes the login (exchanging its code, which
// works once) and which has nothing to check without doing so. The GETs
// that start a login or spend its state are paced.
func (h *Handler) Mount(r mount.Router) {
	for _, rt := range []mount.Route{
		{Method: http.MethodGet, Path: "/authorize", Handler: h.authorize, Creates: mount.CreatesLogin},
		{Method: http.MethodHead, Path: "/authorize", Handler: h.authorize},
		{Method: http.MethodGet, Path: "/callback", Handler: h.callback, Creates: mount.CreatesLogin},
		{Method: http.MethodGet, Path: "/bind", Handler: h.showSelection},
		{Method: http.MethodHead, Path: "/bind", Handler: h.showSelection},
		{Method: http.MethodPost, Path: "/bind", Handler: h.bind},
	} {
		r.Handle(rt)
	}
}

// MethodNotAllowed answers a browser route asked with a method it does
// not take; allow is the Allow header (the methods it takes).
func (h *Handler) MethodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	h.page(w, http.StatusMethodNotAllowed, pageMethodNotAllowed, r.Method+" is not taken here")
}

// path returns p under the external URL's path prefix.
func (h *Handler) path(p string) string { return h.prefix + p }

// constantTimeEqual compares two tokens without leaking where they differ.
func constantTimeEqual(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// Unconfigured is the browser part of a backend without an identity
// provider: /authorize answers 503 with a line for the person who opened
// the link.
type Unconfigured struct{}

// Mount mounts GET /authorize.
func (Unconfigured) Mount(r mount.Router) {
	r.Handle(mount.Route{Method: http.MethodGet, Path: "/authorize", Handler: unconfigured})
}

func unconfigured(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Retry-After", "30")
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, "The sign-in page of this provider is not available: the backend runs without its browser login.\n"+
		"Ask the provider's operator to configure it, then run your bind command again.\n")
}
