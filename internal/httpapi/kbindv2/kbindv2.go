// Package kbindv2 serves kbind v2 consumers (core.kbind.io, docs/v2.md):
// its discovery (GET /v2), the start of its browser flow (GET /v2/bind,
// the login and selection pages are internal/httpapi/browser's), and the
// single-use pickup of the bundle (POST /v2/pickup); and it registers
// the v2 generation's renderer, the bundle.
package kbindv2

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/v2bundle"
	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/httpapi/mount"
	"github.com/kbprovider/backend/internal/httpapi/respond"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/pkg/protocol"
)

// Paths, below the external URL's path.
const (
	PathDiscovery = "/v2"
	PathBind      = "/v2/bind"
	PathPickup    = browser.PathV2Pickup
)

// The v2 sessions pick APIs of the catalog, namespaced ones only, make
// their export requests at the bind (the v2 konnector makes none), and
// end with the bundle.
func init() {
	lifecycle.Register(lifecycle.Generation{Name: lifecycle.V2, Render: Render, NamespacedOnly: true, RequestsAPIs: true})
}

// Render renders a bind's result as the v2 bundle, a JSON v1/List (the
// pickup renders it as YAML on request).
func Render(r lifecycle.Result) ([]byte, error) {
	b, err := v2bundle.Build(v2bundle.Input{Namespace: r.Namespace, Kubeconfig: r.Kubeconfig, APIs: r.APIs})
	if err != nil {
		return nil, err
	}
	return b.JSON()
}

// Browser begins the v2 browser flow (implemented by *browser.Handler).
type Browser interface {
	BeginV2(w http.ResponseWriter, r *http.Request)
}

// Config configures the Handler.
type Config struct {
	// ExternalURL is the public URL of the backend. Required.
	ExternalURL *url.URL
	PrettyName  string
	// Sessions is the session service every part shares. Required.
	Sessions *lifecycle.Service
	// Browser runs the login; nil: /v2/bind answers 503.
	Browser Browser
	Logger  *slog.Logger
}

// Handler serves the routes.
type Handler struct {
	cfg       Config
	discovery []byte
}

// New checks cfg and returns the handler.
func New(cfg Config) (*Handler, error) {
	if cfg.ExternalURL == nil || cfg.Sessions == nil {
		return nil, errors.New("kbindv2: ExternalURL and Sessions are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	doc, err := discovery(cfg)
	if err != nil {
		return nil, err
	}
	return &Handler{cfg: cfg, discovery: doc}, nil
}

// Mount mounts the routes. The pickup takes POST only: a GET or HEAD
// (a link preview, a scanner) gets 405 and spends nothing.
func (h *Handler) Mount(r mount.Router) {
	r.Handle(mount.Route{Method: http.MethodGet, Path: PathDiscovery, Handler: h.serveDiscovery})
	r.Handle(mount.Route{Method: http.MethodGet, Path: PathBind, Handler: h.bind, Creates: mount.CreatesLogin})
	r.Handle(mount.Route{Method: http.MethodHead, Path: PathBind, Handler: h.bind})
	r.Handle(mount.Route{Method: http.MethodPost, Path: PathPickup, Handler: h.pickup})
}

// Discovery is the document at GET /v2: the generation, how a consumer
// binds, and the label its APIs carry.
type Discovery struct {
	Generation         string   `json:"generation"`
	APIGroup           string   `json:"apiGroup"`
	ProviderPrettyName string   `json:"providerPrettyName,omitempty"`
	ExportedLabel      string   `json:"exportedLabel"`
	Methods            []Method `json:"methods"`
}

// Method is one way to bind.
type Method struct {
	// Method is "BrowserPickup": open BindURL in a browser, then POST to
	// the pickup URL the done page shows.
	Method        string   `json:"method"`
	BindURL       string   `json:"bindURL"`
	PickupMethod  string   `json:"pickupMethod"`
	PickupFormats []string `json:"pickupFormats"`
}

func discovery(cfg Config) ([]byte, error) {
	u := url.URL{Scheme: cfg.ExternalURL.Scheme, Host: cfg.ExternalURL.Host,
		Path: strings.TrimSuffix(cfg.ExternalURL.Path, "/") + PathBind}
	b, err := json.Marshal(Discovery{
		Generation: lifecycle.V2, APIGroup: v2bundle.GroupVersion, ProviderPrettyName: cfg.PrettyName,
		ExportedLabel: binding.ExportedLabelV2,
		Methods: []Method{{Method: "BrowserPickup", BindURL: u.String(), PickupMethod: http.MethodPost,
			PickupFormats: []string{formatYAML, formatJSON}}},
	})
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func (h *Handler) serveDiscovery(w http.ResponseWriter, _ *http.Request) {
	respond.JSONBytes(w, http.StatusOK, h.discovery)
}

func (h *Handler) bind(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Browser == nil {
		text(w, http.StatusServiceUnavailable, "The sign-in of this provider is not configured; ask its operator.")
		return
	}
	h.cfg.Browser.BeginV2(w, r)
}

const (
	formatYAML = "yaml"
	formatJSON = "json"
)

// pickupQuery reads the pickup's query strictly: s and k once each, and
// an optional format.
func pickupQuery(raw string) (sid, secret, format string, problem string) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return "", "", "", "the query does not parse"
	}
	for k := range q {
		if k != "s" && k != "k" && k != "format" {
			return "", "", "", "unknown parameter " + strconvQuote(k)
		}
	}
	sid, okS := protocol.Single(q, "s")
	secret, okK := protocol.Single(q, "k")
	if !okS || !okK || !protocol.URLSafe(sid, 128) || !protocol.URLSafe(secret, 128) {
		return "", "", "", "s and k must each appear once, as the done page printed them"
	}
	format = formatYAML
	if q.Has("format") {
		f, ok := protocol.Single(q, "format")
		if !ok || (f != formatYAML && f != formatJSON) {
			return "", "", "", "format must be yaml or json"
		}
		format = f
	}
	return sid, secret, format, ""
}

// strconvQuote quotes a parameter name for a message, bounded.
func strconvQuote(s string) string {
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	b, _ := json.Marshal(s)
	return string(b)
}

// pickup hands out the bundle once. Every refusal is one line of text
// that says what to do (curl -fsS prints the status; without -f the
// line).
func (h *Handler) pickup(w http.ResponseWriter, r *http.Request) {
	sid, secret, format, problem := pickupQuery(r.URL.RawQuery)
	if problem != "" {
		text(w, http.StatusBadRequest, "Not a pickup URL: "+problem+".")
		return
	}
	sess, err := h.cfg.Sessions.Open(sid)
	switch {
	case errors.Is(err, lifecycle.ErrExpired):
		text(w, http.StatusGone, "This pickup URL has expired: bind again for a new one.")
		return
	case err != nil:
		text(w, http.StatusNotFound, "No such pickup URL.")
		return
	}
	body, err := h.cfg.Sessions.Pickup(r.Context(), sess, secret)
	var denied *lifecycle.PickupDeniedError
	switch {
	case err == nil:
	case errors.Is(err, lifecycle.ErrPickupDenied):
		text(w, http.StatusNotFound, "No such pickup URL.")
		return
	case errors.Is(err, lifecycle.ErrPickupUsed):
		text(w, http.StatusGone, "This pickup URL was used already (it works once): bind again for a new one.")
		return
	case errors.Is(err, lifecycle.ErrPickupPending):
		text(w, http.StatusConflict, "Nothing to pick up yet: finish the binding in the browser first.")
		return
	case errors.As(err, &denied):
		text(w, http.StatusForbidden, "The binding was refused: "+denied.Reason+".")
		return
	case errors.Is(err, lifecycle.ErrBindingGone):
		text(w, http.StatusGone, "The binding is gone from the provider (unbound or revoked): bind again.")
		return
	case errors.Is(err, sessions.ErrUnavailable):
		respond.RetryAfter(w.Header(), 5)
		text(w, http.StatusServiceUnavailable, "The provider cannot hand it out right now: try the same command again in a few seconds.")
		return
	default:
		h.cfg.Logger.Error("pickup failed", "session", sess.ID, "error", err)
		text(w, http.StatusInternalServerError, "The provider failed to hand it out; tell its operator.")
		return
	}
	h.cfg.Logger.Info("v2 bundle picked up", "session", sess.ID, "format", format)
	if format == formatJSON {
		respond.JSONBytes(w, http.StatusOK, body)
		return
	}
	y, err := v2bundle.ListToYAML(body)
	if err != nil {
		h.cfg.Logger.Error("a stored v2 bundle does not render", "session", sess.ID, "error", err)
		text(w, http.StatusInternalServerError, "The provider failed to hand it out; tell its operator.")
		return
	}
	respond.Text(w, http.StatusOK, "application/yaml", y)
}

func text(w http.ResponseWriter, status int, line string) {
	respond.Text(w, status, "text/plain; charset=utf-8", []byte(line+"\n"))
}
