// Package httpapi is the backend's HTTP surface: discovery (GET /export),
// poll sessions (POST /sessions, GET /poll) per docs/protocol.md §2, §3 and
// §6, and the terse probes /healthz and /readyz (ok or not, no detail;
// /metrics and the detailed probes are internal/server/diagnostics', on a
// listener of their own).
// The browser routes (/authorize, /callback, /bind) are Config.Browser's,
// mounted here beside the others: New mounts every route in one router.
package httpapi

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/httpapi/browser"
	"github.com/kbprovider/backend/internal/httpapi/longpoll"
	"github.com/kbprovider/backend/internal/pace"
	"github.com/kbprovider/backend/internal/server/health"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
)

// ProtocolVersion is the kube-bind protocol level advertised in the
// BindingProvider's version: a strict semver at or above v0.3.0, which
// released CLIs require.
const ProtocolVersion = "v0.4.8"

// Paths of the API, relative to the external URL's path.
const (
	PathExport    = "/export"
	PathSessions  = "/sessions"
	PathPoll      = "/poll"
	PathAuthorize = "/authorize"
	PathCallback  = "/callback"
	PathBind      = "/bind"
	// PathSessionsV1alpha2 is at the host root (Config.V1alpha2Sessions).
	PathSessionsV1alpha2 = "/api/sessions"
)

// DefaultPollInterval is the poll interval of a zero Config.PollInterval.
const DefaultPollInterval = 2 * time.Second

// Config configures the handler returned by New.
type Config struct {
	// ExternalURL is the public URL of the backend (scheme, host and an
	// optional path prefix). Every advertised URL is built from it, and
	// signatures are checked against its scheme and host, never against
	// the request's Host header. Required.
	ExternalURL *url.URL
	// PrettyName is the provider's name shown to consumers.
	PrettyName string
	// PollInterval is the advertised poll interval (default 2s).
	PollInterval time.Duration
	// Sessions issues, checks and ends sessions; the browser part must
	// use the same one. Required.
	Sessions *lifecycle.Service
	// Logger receives access and error logs (default: discard).
	Logger *slog.Logger
	// Metrics is the registry the handler's metrics are registered in
	// (default: a new registry); it is served elsewhere (internal/
	// diagnostics). Pass a fresh one per handler; registering twice in one
	// registry fails.
	Metrics *prometheus.Registry
	// Readiness are the checks /readyz runs; it is ready when all pass.
	// They must read this replica's own state only: anybody may ask.
	Readiness []health.Check
	// Browser, if set, serves the browser routes /authorize, /callback
	// and /bind (under the external URL's path prefix). While it is nil,
	// /authorize answers 503.
	Browser *browser.Handler
	// Now is the clock of Retry-After answers (default time.Now); use
	// the one Sessions has.
	Now func() time.Time
	// LongPoll holds polls that ask to wait (Prefer: wait=N) until their
	// session ends; nil turns long polling off. Whoever runs the server
	// calls its Release when shutdown begins.
	LongPoll *longpoll.Holder
	// NoCallbackFlow: discovery advertises the poll flow only, not
	// OAuth2CodeGrant (the browser handler then refuses callback links:
	// browser.Config.NoCallbackFlow).
	NoCallbackFlow bool
	// RootRoutes are the routes of the kube-bind.io/v1alpha2 generation
	// (internal/httpapi/v1alpha2), mounted at the host root whatever
	// path the external URL has: the released CLIs call them there.
	RootRoutes []Route
	// V1alpha2Sessions serves POST /api/sessions at the host root: poll
	// sessions of the v1alpha2 generation (sessionkey.FlowPollV1alpha2),
	// which end with a kube-bind.io/v1alpha2 BindingResponse.
	V1alpha2Sessions bool
	// SessionCreateRate is how many requests that create something for
	// an anonymous caller one client may make per second, with a burst of
	// three seconds' worth, all from one bucket: POST /sessions and
	// /api/sessions, and the GETs that start a login or spend its state
	// (/authorize, /callback, and RootRoutes marked Creates). More are
	// answered 429 with Retry-After. 0: no limit. The client is the
	// connection's address (connlimit.ClientKey: an IPv6 /64 is one
	// client); proxy headers are not trusted, so behind a proxy that does
	// not keep client addresses every client shares the proxy's.
	SessionCreateRate float64
}

// Bounds of request bodies.
const (
	// maxSessionBody is the most a POST /sessions body may hold (§1).
	maxSessionBody = 4 << 10
	// maxPollBody bounds the (ignored, but signed) body of a poll.
	maxPollBody = 4 << 10
	// maxOtherBody bounds bodies of every other route, browser forms
	// included.
	maxOtherBody = 64 << 10
)

// New returns the backend's HTTP handler.
func New(cfg Config) (http.Handler, error) {
	if err := validateExternalURL(cfg.ExternalURL); err != nil {
		return nil, err
	}
	if cfg.Sessions == nil {
		return nil, errors.New("httpapi: Config.Sessions is required")
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if !(cfg.SessionCreateRate >= 0) || math.IsInf(cfg.SessionCreateRate, 0) {
		return nil, fmt.Errorf("httpapi: session create rate %v must be 0 (no limit) or positive", cfg.SessionCreateRate)
	}
	if cfg.PollInterval < 0 {
		return nil, fmt.Errorf("httpapi: poll interval %s is negative", cfg.PollInterval)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m, err := newMetrics(cfg.Metrics, cfg.LongPoll)
	if err != nil {
		return nil, err
	}

	prefix := strings.TrimSuffix(cfg.ExternalURL.EscapedPath(), "/")
	s := &server{
		cfg:          cfg,
		bind:         cfg.Sessions,
		log:          cfg.Logger,
		metrics:      m,
		scheme:       strings.ToLower(cfg.ExternalURL.Scheme),
		host:         cfg.ExternalURL.Host,
		minPollGap:   minPollGap(cfg.PollInterval),
		browserPaths: map[string]string{},
		createLimit:  newClientLimiter(cfg.SessionCreateRate, maxLimitedClients),
	}
	if s.export, err = exportDocument(cfg, prefix); err != nil {
		return nil, err
	}

	// Every route, in one router. No middleware answers a request itself
	// except to refuse a body over the limit or to report a panic.
	r := chi.NewRouter()
	r.NotFound(s.notFound)
	r.MethodNotAllowed(s.methodNotAllowed(r))

	r.Get("/healthz", named("/healthz", s.healthz))
	r.Get("/readyz", named("/readyz", s.readyz))

	api := func(r chi.Router) {
		r.Get(PathExport, named(PathExport, s.serveExport))
		r.Post(PathSessions, named(PathSessions, s.paceSessions(s.createSession)))
		r.Get(PathPoll, named(PathPoll, s.poll))
		if cfg.Browser != nil {
			for _, rt := range cfg.Browser.Routes() {
				h := rt.Handler
				if rt.Method == http.MethodGet && (rt.Path == PathAuthorize || rt.Path == PathCallback) {
					h = s.paceLogins(h)
				}
				r.Method(rt.Method, rt.Path, named(rt.Path, h))
				s.browserPaths[prefix+rt.Path] = rt.Path
			}
		} else {
			r.Get(PathAuthorize, named(PathAuthorize, s.browserMissing))
		}
	}
	if prefix == "" {
		api(r)
	} else {
		r.Route(prefix, api)
	}
	for _, rt := range cfg.RootRoutes {
		h := rt.Handler
		if rt.Creates {
			h = s.paceLogins(h)
		}
		r.Method(rt.Method, rt.Path, named(rt.Path, h))
	}
	if cfg.V1alpha2Sessions {
		r.Post(PathSessionsV1alpha2, named(PathSessionsV1alpha2, s.paceSessions(s.createSessionV1alpha2)))
	}
	return s.middleware(r), nil
}

func validateExternalURL(u *url.URL) error {
	if u == nil {
		return errors.New("httpapi: Config.ExternalURL is required")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("httpapi: external URL %q: scheme must be http or https", u)
	case u.Host == "":
		return fmt.Errorf("httpapi: external URL %q has no host", u)
	case u.User != nil:
		return fmt.Errorf("httpapi: external URL %q must not carry user information", u.Redacted())
	case u.RawQuery != "" || u.ForceQuery:
		return fmt.Errorf("httpapi: external URL %q must not have a query", u)
	case u.Fragment != "":
		return fmt.Errorf("httpapi: external URL %q must not have a fragment", u)
	}
	return nil
}

// server holds what the handlers share.
type server struct {
	cfg     Config
	bind    *lifecycle.Service
	log     *slog.Logger
	metrics *metrics
	export  []byte
	// scheme and host of the external URL, which every signature covers.
	scheme, host string
	// browserPaths maps the full paths of the browser routes, prefix
	// included, to their route labels: their 405 is the browser's page.
	browserPaths map[string]string
	// minPollGap is the poll interval less the jitter tolerance.
	minPollGap time.Duration
	// createLimit paces the routes that create something, per client
	// (nil: no limit).
	createLimit *pace.Limiter[netip.Addr]
}

// pollTolerance is how much earlier than pollInterval after the previous
// poll a poll is still accepted: a client that waits exactly pollInterval
// must not be told to slow down because one request of it was delayed in
// the network. It is 10% of the interval but at least 250ms, and never
// more than half the interval.
func pollTolerance(interval time.Duration) time.Duration {
	tol := max(interval/10, 250*time.Millisecond)
	return min(tol, interval/2)
}

func minPollGap(interval time.Duration) time.Duration {
	return interval - pollTolerance(interval)
}
