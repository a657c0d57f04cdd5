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
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/oidc/clitoken"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
)

// Login is the identity provider login (implemented by *oidc.Authenticator).
type Login interface {
	Begin(w http.ResponseWriter, r *http.Request, flowState []byte) (string, error)
	Finish(w http.ResponseWriter, r *http.Request) (oidc.Identity, []byte, error)
}

// Catalog lists the APIs a consumer may bind (implemented by *binding.Catalog).
type Catalog interface {
	List() []binding.ExportedAPI
	Lookup(group, resource string) (binding.ExportedAPI, bool)
}

// Provisioner sets a consumer up on the provider cluster (implemented by
// *binding.Provisioner).
type Provisioner interface {
	Provision(ctx context.Context, c binding.Consumer, clusterID string, resources []binding.Resource) (*binding.Result, error)
	// Existing says whether the identity is bound already, and since when.
	Existing(ctx context.Context, c binding.Consumer, clusterID string) (created time.Time, exists bool, err error)
}

// Config configures the browser handler.
type Config struct {
	// ExternalURL is the backend's public URL: links are checked against
	// its scheme and host, and every page and redirect of ours is built
	// from it.
	ExternalURL  *url.URL
	ProviderName string
	// Sessions issues, checks and ends sessions (the same instance as
	// httpapi.Config.Sessions). Required.
	Sessions    *lifecycle.Service
	Login       Login
	Catalog     Catalog
	Provisioner Provisioner
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
	// Offers list what the v1alpha2 flows' selection page offers; nil:
	// those flows (internal/httpapi/v1alpha2) are not served.
	Offers OfferLister
	// Tokens mint the CLI token at the end of `kubectl bind login`
	// (FlowCLILogin); nil: that login is not served.
	Tokens *clitoken.Tokens
}

// OfferLister lists the offers (implemented by *offers.Source).
type OfferLister interface {
	List() []offers.Offer
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
	case cfg.Sessions == nil || cfg.Login == nil || cfg.Catalog == nil || cfg.Provisioner == nil:
		return nil, errors.New("browser: Sessions, Login, Catalog and Provisioner are required")
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

// Route is one browser route: a method and a path below the external
// URL's path prefix. internal/httpapi mounts them in its router.
type Route struct {
	Method, Path string
	Handler      http.HandlerFunc
}

// Routes lists the browser routes. GET routes take HEAD too (see
// linkLooksGood for /authorize), except the callback, whose GET finishes
// the login (exchanging its code, which works once) and which has nothing
// to check without doing so.
func (h *Handler) Routes() []Route {
	return []Route{
		{http.MethodGet, "/authorize", h.authorize},
		{http.MethodHead, "/authorize", h.authorize},
		{http.MethodGet, "/callback", h.callback},
		{http.MethodGet, "/bind", h.showSelection},
		{http.MethodHead, "/bind", h.showSelection},
		{http.MethodPost, "/bind", h.bind},
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
