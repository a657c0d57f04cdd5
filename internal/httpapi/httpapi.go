// Package httpapi is the backend's HTTP surface: one router with the
// middleware every request passes (no-store, HSTS, body bounds, panic
// recovery, access log, metrics), the terse probes /healthz and /readyz
// (ok or not, no detail; /metrics and the detailed probes are
// internal/server/diagnostics', on a listener of their own), the polls of
// every generation's poll sessions (GET /poll, docs/protocol.md §4, with
// the long-poll wait), and the pacing of routes that create something.
// Every other route is a part's (internal/httpapi/mount): each protocol
// generation (internal/httpapi/v1alpha1, internal/httpapi/v1alpha2) and
// the browser login (internal/httpapi/browser) mounts its own.
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

	"github.com/kbprovider/backend/internal/httpapi/longpoll"
	"github.com/kbprovider/backend/internal/httpapi/mount"
	"github.com/kbprovider/backend/internal/httpapi/pollsession"
	"github.com/kbprovider/backend/internal/pace"
	"github.com/kbprovider/backend/internal/server/health"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
)

// PathPoll is the poll of every generation's poll sessions, relative to
// the external URL's path.
const PathPoll = "/poll"

// Config configures the handler returned by New.
type Config struct {
	// ExternalURL is the public URL of the backend (scheme, host and an
	// optional path prefix). Every advertised URL is built from it, and
	// signatures are checked against its scheme and host, never against
	// the request's Host header. Required.
	ExternalURL *url.URL
	// PollInterval is the advertised poll interval, which polls are held
	// to (default pollsession.DefaultPollInterval).
	PollInterval time.Duration
	// Sessions checks and admits polls, and delivers their outcomes; the
	// parts use the same one. Required.
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
	// Parts mount the routes of the protocol generations and of the
	// browser login.
	Parts []mount.Part
	// Now is the clock of Retry-After answers (default time.Now); use
	// the one Sessions has.
	Now func() time.Time
	// LongPoll holds polls that ask to wait (Prefer: wait=N) until their
	// session ends; nil turns long polling off. Whoever runs the server
	// calls its Release when shutdown begins.
	LongPoll *longpoll.Holder
	// SessionCreateRate is how many requests that create something for
	// an anonymous caller one client may make per second, with a burst of
	// three seconds' worth, all from one bucket: the routes the parts
	// mark (mount.Route.Creates): POST /sessions and /api/sessions, and
	// the GETs that start a login or spend its state (/authorize,
	// /callback, /api/authorize, /). More are answered 429 with
	// Retry-After. 0: no limit. The client is the
	// connection's address (connlimit.ClientKey: an IPv6 /64 is one
	// client); proxy headers are not trusted, so behind a proxy that does
	// not keep client addresses every client shares the proxy's.
	SessionCreateRate float64
}

// Bounds of request bodies.
const (
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
		cfg.PollInterval = pollsession.DefaultPollInterval
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

	s := &server{
		cfg:         cfg,
		bind:        cfg.Sessions,
		log:         cfg.Logger,
		metrics:     m,
		scheme:      strings.ToLower(cfg.ExternalURL.Scheme),
		host:        cfg.ExternalURL.Host,
		minPollGap:  minPollGap(cfg.PollInterval),
		refusers:    map[string]refuser{},
		createLimit: newClientLimiter(cfg.SessionCreateRate, maxLimitedClients),
	}

	// Every route, in one router. No middleware answers a request itself
	// except to refuse a body over the limit or to report a panic.
	r := chi.NewRouter()
	r.NotFound(s.notFound)
	r.MethodNotAllowed(s.methodNotAllowed(r))
	r.Get("/healthz", named("/healthz", s.healthz))
	r.Get("/readyz", named("/readyz", s.readyz))
	mr := &router{s: s, root: r, prefix: strings.TrimSuffix(cfg.ExternalURL.EscapedPath(), "/")}
	mr.Handle(mount.Route{Method: http.MethodGet, Path: PathPoll, Handler: s.poll})
	for _, p := range cfg.Parts {
		mr.refuser, _ = p.(mount.MethodRefuser)
		p.Mount(mr)
	}
	return s.middleware(r), nil
}

// router mounts the parts' routes: each below the external URL's path
// or at the host root, labelled with its path, paced when it creates
// something.
type router struct {
	s      *server
	root   chi.Router
	prefix string
	// refuser answers 405 on the routes of the part being mounted (nil:
	// the JSON 405).
	refuser mount.MethodRefuser
}

func (m *router) Handle(rt mount.Route) {
	path := rt.Path
	if !rt.AtHostRoot {
		path = m.prefix + rt.Path
	}
	m.root.Method(rt.Method, path, named(rt.Path, m.s.paced(rt.Handler, rt.Creates)))
	if m.refuser != nil {
		m.s.refusers[path] = refuser{route: rt.Path, answer: m.refuser}
	}
}

// refuser is the 405 answer of a part's route.
type refuser struct {
	route  string
	answer mount.MethodRefuser
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
	// scheme and host of the external URL, which every signature covers.
	scheme, host string
	// refusers are the 405 answers of the parts that have their own, by
	// full path (prefix included).
	refusers map[string]refuser
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
