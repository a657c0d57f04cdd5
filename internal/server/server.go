// Package server builds the whole backend from a Config and runs it: New
// builds every part once, in dependency order (one provider cluster
// client configuration; the session store with, for the ring, its
// peer API server and peer discovery; the provider side: catalog,
// provisioner, offers; the login: OIDC and CLI tokens; the session
// service over them; the provider-side controllers under leader
// election; the diagnostics listener and its dependency monitor; the
// parts of the HTTP API and its router; TLS reload, connection limits),
// and Run runs every loop until its context ends, then shuts down in a
// fixed order and waits for all of them (see Run).
//
// Options registers every flag (each component registers and checks its
// own) and completes them into a Config; cmd/backend only adds the
// environment and its own logging flags.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/apirequests"
	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers"
	"github.com/kbprovider/backend/internal/httpapi"
	"github.com/kbprovider/backend/internal/httpapi/longpoll"
	"github.com/kbprovider/backend/internal/oidc/clitoken"
	"github.com/kbprovider/backend/internal/oidc/clitoken/revocations"
	"github.com/kbprovider/backend/internal/server/clockskew"
	"github.com/kbprovider/backend/internal/server/connlimit"
	"github.com/kbprovider/backend/internal/server/health"
	"github.com/kbprovider/backend/internal/server/servingcert"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/clusterkey"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/ring"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/internal/version"
)

// Server is the built backend; Run runs it once.
type Server struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
	// skew measures this replica's clock against the provider cluster's.
	skew *clockskew.Monitor
	// apiRequests counts every request to the provider cluster's API
	// server, by verb and resource.
	apiRequests *apirequests.Counter
	ext         *url.URL

	ln  net.Listener
	srv *http.Server
	// diagLn and diagSrv serve probes, metrics and the status page
	// (newDiagnostics), apart from the public listener.
	diagLn  net.Listener
	diagSrv *http.Server

	store sessions.Store
	keys  *sessionkey.Keys
	// sessionKeyBytes are the keys keys was made from (the CLI token keys
	// are derived from them); sessionKeysRandom: made up for this process.
	sessionKeyBytes   [][]byte
	sessionKeysRandom bool
	// clusterKey derives cluster IDs and their secrets.
	clusterKey *clusterkey.Key
	// sessions is the one session service every handler shares.
	sessions *lifecycle.Service
	// ring serves the ring's peer API on peerLn (nil for memory).
	ring   *ring.Store
	peerLn net.Listener

	// loops run until the servers stopped (Run's step 5): TLS reload,
	// peer discovery, the login's discovery, the catalog, the offers.
	loops []loop
	// controllers run the provider-side controllers
	// (internal/binding/controllers, under leader election) until Run's
	// step 4; nil without the browser part.
	controllers func(ctx context.Context)

	// shuttingDown fails readiness as soon as shutdown begins.
	shuttingDown *health.Status
	// longPoll holds long polls; released when shutdown begins (nil: off).
	longPoll *longpoll.Holder

	restConfig *rest.Config
}

// loop is a background part that runs until its context ends.
type loop struct {
	name string
	run  func(ctx context.Context)
}

// New builds the backend from cfg. Nothing runs until Run; what New opened
// (listeners, stores) is released again when it fails. Components that
// talk to dependencies (identity provider, provider cluster) start in the
// background in Run, retrying, and report through readiness checks: the
// backend serves discovery and polls while they are down, and never exits
// because of them.
func New(ctx context.Context, cfg Config) (_ *Server, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, now: cfg.Now}
	if s.now == nil {
		s.now = time.Now
	}
	s.skew = clockskew.New(s.now, s.log.With("component", "clock-skew"))
	s.apiRequests = apirequests.New("kube_bind_backend",
		"Requests this replica sent to the provider cluster's API server (every client: session store, provisioning, controllers, "+
			"leader election, dependency checks), by Kubernetes verb and resource (resource/subresource; empty for discovery and /version).")
	defer func() {
		if err != nil {
			s.close()
		}
	}()

	if cfg.DiagnosticsAddress == "" {
		return nil, errors.New("no diagnostics address: probes and metrics need a listener of their own")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.ListenAddress)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s: %w", cfg.ListenAddress, err)
	}
	// One client must not hold every connection (or file descriptor).
	limited := connlimit.New(ln, cfg.MaxConnections, cfg.MaxConnsPerClient)
	s.ln = limited
	ext, derived := cfg.ExternalURLFor(s.ln.Addr())
	if derived {
		s.log.Warn("--external-url not set: advertising "+ext.String()+", which only works for clients on this machine; "+
			"set --external-url to the public URL clients use", "external_url", ext.String())
	}
	s.ext = ext

	if cfg.Store.Deprecated != "" {
		s.log.Warn(cfg.Store.Deprecated, "component", "ring")
	}
	storeReadiness, storeDependencies, err := s.newSessionStore()
	if err != nil {
		return nil, fmt.Errorf("cannot set up the session store %q: %w", cfg.Store.Kind, err)
	}
	tlsConfig, err := s.servingTLS()
	if err != nil {
		return nil, fmt.Errorf("cannot load the TLS serving certificate: %w", err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), s.apiRequests)
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "kube_bind_backend", Name: "connections_refused_total",
		Help: "Connections closed at once because their client held --max-connections-per-client.",
	}, func() float64 { return float64(limited.Refused()) }), prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "kube_bind_backend", Name: "idle_connections_closed_total",
		Help: "Connections without a request in flight (idle keep-alive, or silent since accepted) closed to make room for new ones at --max-connections.",
	}, func() float64 { return float64(limited.Evicted()) }))
	if r := s.ring; r != nil {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ring_peer_fallbacks_total",
			Help: "Requests to a session's owner that could not be asked, answered by this replica instead (by reason: ring_peer_fallback_reasons_total).",
		}, func() float64 { return float64(r.PeerFallbacks()) }))
		for _, reason := range ring.FallbackReasons {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "ring_peer_fallback_reasons_total",
				Help: "Requests to a session's owner answered by this replica instead, by why the owner could not be asked: " +
					"timeout, unreachable, tls (handshake refused: another peer key), version (a peer of another version), " +
					"answer (an outcome read the owner answered with an error).",
				ConstLabels: prometheus.Labels{"reason": reason},
			}, func() float64 { return float64(r.PeerFallbacksByReason(reason)) }))
		}
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "kube_bind_backend", Name: "clock_offset_seconds",
		Help: "The provider cluster's API server's clock minus this replica's, from the Date header of its answers (within 1 s; " +
			"NaN until one was measured). Past 5 s either way the replica warns (docs/sessions.md).",
	}, func() float64 {
		if off, ok := s.skew.Offset(); ok {
			return off.Seconds()
		}
		return math.NaN()
	}))
	key, err := clusterkey.New(currentKey(cfg.ClusterKey.Keys), previousKeys(cfg.ClusterKey.Keys)...)
	if err != nil {
		return nil, err
	}
	s.clusterKey = key
	// Readiness fails as soon as shutdown begins, so load balancers stop
	// sending new requests while in-flight ones finish. It follows only
	// this replica's own state, never a dependency every replica shares.
	s.shuttingDown = health.NewStatus("shutdown", nil)
	readiness := append([]health.Check{s.shuttingDown}, storeReadiness...)

	// In dependency order, each built once: the provider side, the
	// login, the session service over both, the parts of the HTTP API
	// that read through it.
	p, err := s.newProviderSide(ctx)
	if err != nil {
		return nil, err
	}
	l, err := s.newLogin(p)
	if err != nil {
		return nil, err
	}
	if s.sessions, err = s.newSessionService(p); err != nil {
		return nil, err
	}
	if p.bound() {
		prov := p.provisioner
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "kube_bind_backend", Name: "cluster_cap_refusals_total",
			Help: "Binds of a new consumer cluster refused because its user had --max-clusters-per-user bound.",
		}, func() float64 { return float64(prov.CapRefusals()) }))
		if err := s.newControllers(p, reg); err != nil {
			return nil, err
		}
	}
	readiness = append(readiness, l.readiness...)
	// The catalog's check covers the provider cluster where it runs.
	dependencies := l.dependencies
	if len(dependencies) == 0 {
		dependencies = storeDependencies
	}
	if err := s.newDiagnostics(ctx, reg, readiness, dependencies); err != nil {
		return nil, err
	}
	s.longPoll = longpoll.New(cfg.LongPoll)
	parts, err := s.newParts(l, reg)
	if err != nil {
		return nil, err
	}
	handler, err := httpapi.New(httpapi.Config{
		ExternalURL:       ext,
		PollInterval:      cfg.PollInterval,
		Now:               s.now,
		Sessions:          s.sessions,
		Logger:            s.log,
		Metrics:           reg,
		Readiness:         readiness,
		Parts:             parts,
		LongPoll:          s.longPoll,
		SessionCreateRate: cfg.SessionCreateRate,
	})
	if err != nil {
		return nil, fmt.Errorf("cannot build the HTTP handler: %w", err)
	}
	s.srv = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		// Requests keep their context through the shutdown: they are
		// drained, not cancelled.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		TLSConfig:   tlsConfig,
		// At --max-connections, an idle keep-alive connection is closed
		// for a new one: the listener learns which are idle here.
		ConnState: limited.ConnState,
	}
	return s, nil
}

// newControllers builds the provider-side controllers
// (internal/binding/controllers) on the provider side the session
// service binds with; Run runs them.
func (s *Server) newControllers(p providerSide, reg prometheus.Registerer) error {
	rc, err := s.provider()
	if err != nil {
		return err
	}
	c, err := controllers.New(rc, controllers.Config{
		Options:         s.cfg.Controllers,
		NamespacePrefix: s.cfg.Provider.NamespacePrefix,
		Catalog:         p.catalog,
		Provisioner:     p.provisioner,
		Offers:          p.offers,
		Allowed:         stillAllowed(s.cfg.OIDC.AllowList()),
		Scope:           s.scopeOptions(),
		Metrics:         reg,
		Logger:          s.log,
	})
	if err != nil {
		return err
	}
	s.controllers = c.Run
	return nil
}

// newCLITokens builds the CLI token keys (docs/v1alpha2.md §2.3), derived
// from the session keys, for the configured identity provider.
func (s *Server) newCLITokens(rc *rest.Config) (*clitoken.Tokens, *revocations.Watcher, error) {
	if s.sessionKeysRandom {
		s.log.Warn("no session keys configured: the tokens of kubectl bind login are signed with a key made for this process, so they stop working when it ends; use --session-store=ring with --peer-key, whose session keys every replica shares across restarts")
	}
	cfg := clitoken.Config{SessionKeys: s.sessionKeyBytes, Issuer: s.cfg.OIDC.IssuerURL,
		TTL: s.cfg.CLITokens.TTL, NotBefore: s.cfg.CLITokens.NotBefore}
	var w *revocations.Watcher
	if o := s.cfg.CLITokens; o.RevocationsName != "" {
		client, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, nil, fmt.Errorf("provider cluster: %w", err)
		}
		w = revocations.New(client, o.RevocationsNamespace, o.RevocationsName, s.log.With("component", "cli-token-revocations"))
		s.loops = append(s.loops, loop{"cli token revocations", w.Run})
		cfg.Revocations = w
	}
	tokens, err := clitoken.New(cfg)
	return tokens, w, err
}

// Addr is the address the public API listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// DiagnosticsAddr is the address the diagnostics listener listens on.
func (s *Server) DiagnosticsAddr() net.Addr { return s.diagLn.Addr() }

// ExternalURL is the URL the backend advertises.
func (s *Server) ExternalURL() *url.URL { return s.ext }

// provider returns the provider cluster's client configuration, built
// once for every part that needs it.
func (s *Server) provider() (*rest.Config, error) {
	if s.restConfig == nil {
		rc, err := binding.RESTConfig(s.cfg.Provider.Kubeconfig, s.cfg.Provider.Context)
		if err != nil {
			return nil, fmt.Errorf("provider cluster: %w", err)
		}
		rc.Wrap(s.skew.Wrap)
		rc.Wrap(s.apiRequests.Wrap)
		s.restConfig = rc
	}
	return s.restConfig, nil
}

// servingTLS returns the TLS configuration of the public listener, nil
// without a certificate. The certificate is re-read when the files change
// (cert-manager and the kubelet rotate mounted Secrets) while the servers
// run: new handshakes get the new pair, open connections stay.
func (s *Server) servingTLS() (*tls.Config, error) {
	if s.cfg.TLSCertFile == "" {
		return nil, nil
	}
	r, err := servingcert.New(s.cfg.TLSCertFile, s.cfg.TLSKeyFile, s.log.With("component", "servingcert"))
	if err != nil {
		return nil, err
	}
	s.loops = append(s.loops, loop{"TLS reload", r.Run})
	return r.TLSConfig(), nil
}

// Run serves until ctx ends or a server fails, then shuts down in this order, each
// step after the one before finished:
//
//  1. stop accepting: readiness fails; held long polls are answered
//     (pending) and no new ones are held, and the public listener closes;
//  2. drain: in-flight requests finish, for up to ShutdownTimeout (which
//     also bounds the handover);
//  3. stop the peer API (after its in-flight requests, within the same
//     deadline): until the public server stopped, other replicas may still
//     ask this one about the sessions it owns; then the diagnostics
//     listener, which kept answering probes (not ready) and scrapes
//     through the drain;
//  4. stop the provider-side controllers and release the leader Lease, so
//     another replica takes over at once;
//  5. stop the background loops (TLS reload, discovery, the session
//     records' informer).
//
// Every goroutine Run starts has ended when it returns. The error says
// why a server failed or the drain did not finish in time.
func (s *Server) Run(ctx context.Context) error {
	var loops, controllers sync.WaitGroup
	loopCtx, stopLoops := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLoops()
	ctrlCtx, stopControllers := context.WithCancel(context.WithoutCancel(ctx))
	defer stopControllers()
	for _, l := range s.loops {
		loops.Go(func() { l.run(loopCtx) })
	}
	if s.controllers != nil {
		controllers.Go(func() { s.controllers(ctrlCtx) })
	}

	// The servers: a failure of any ends Run.
	failed := make(chan error, 3)
	var servers sync.WaitGroup
	// Read before serving: Serve changes the TLS configuration (HTTP/2).
	withTLS := s.srv.TLSConfig != nil
	servers.Go(func() {
		var err error
		if withTLS {
			err = s.srv.ServeTLS(s.ln, "", "")
		} else {
			err = s.srv.Serve(s.ln)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			failed <- err
		}
	})
	servers.Go(func() {
		if err := s.diagSrv.Serve(s.diagLn); !errors.Is(err, http.ErrServerClosed) {
			failed <- err
		}
	})
	if s.ring != nil {
		servers.Go(func() {
			if err := s.ring.Serve(s.peerLn); err != nil {
				failed <- err
			}
		})
		s.log.Info("serving the peer API", "component", "ring", "address", s.peerLn.Addr().String(),
			"self", s.cfg.Store.PeerSelfURL, "discovery", s.cfg.Store.PeerServiceName != "")
	}
	s.log.Info("serving", "version", version.Version, "address", s.ln.Addr().String(),
		"external_url", s.ext.String(), "tls", withTLS, "diagnostics_address", s.diagLn.Addr().String())

	var errs []error
	select {
	case err := <-failed:
		s.log.Error("server failed", "error", err)
		errs = append(errs, err)
	case <-ctx.Done():
	}

	// 1 and 2.
	s.shuttingDown.Set(errors.New("shutting down"))
	s.longPoll.Release()
	s.log.Info("shutting down: finishing in-flight requests", "timeout", s.cfg.ShutdownTimeout.String())
	drain, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := s.srv.Shutdown(drain); err != nil {
		s.log.Error("in-flight requests did not finish in time", "error", err)
		s.srv.Close()
		errs = append(errs, fmt.Errorf("draining requests: %w", err))
	}
	// 3.
	if s.ring != nil {
		if err := s.ring.Shutdown(drain); err != nil {
			s.log.Error("in-flight peer requests did not finish in time", "error", err)
			s.peerLn.Close()
			errs = append(errs, fmt.Errorf("draining peer requests: %w", err))
		}
	}
	if err := s.diagSrv.Shutdown(drain); err != nil {
		s.diagSrv.Close()
	}
	servers.Wait()
	// 4.
	stopControllers()
	controllers.Wait()
	// 5.
	stopLoops()
	loops.Wait()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	s.log.Info("stopped")
	return nil
}

// close releases what New opened, when New fails.
func (s *Server) close() {
	if s.ln != nil {
		s.ln.Close()
	}
	if s.peerLn != nil {
		s.peerLn.Close()
	}
	if s.diagLn != nil {
		s.diagLn.Close()
	}
}
