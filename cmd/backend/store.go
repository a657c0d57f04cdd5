package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/health"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/hashring"
	"github.com/kbprovider/backend/internal/sessions/hashring/peerdiscovery"
	"github.com/kbprovider/backend/internal/sessions/memory"
)

// sessionStore is the session store of this process and, for the
// hashring, the peer API server and peer discovery that run beside it.
type sessionStore struct {
	sessions.Store
	// checks are readiness checks of the store (the ring's peers).
	checks []health.Check

	close    func()
	peerSrv  *http.Server
	peerLn   net.Listener
	discover func(ctx context.Context)
	logger   *slog.Logger
	self     string
}

// newSessionStore builds the configured store. For the hashring it also
// listens on the peer address (so a port in use fails at start-up), but
// serves nothing until start.
func newSessionStore(cfg *config, logger *slog.Logger) (*sessionStore, error) {
	limits := sessions.Limits{MaxSessions: cfg.MaxPendingSessions, Grace: cfg.GracePeriod}
	if cfg.Store.Kind != storeHashring {
		m := memory.New(limits, nil)
		return &sessionStore{Store: m, close: m.Close, logger: logger}, nil
	}
	sc := cfg.Store
	log := logger.With("component", "hashring")
	ring, err := hashring.New(hashring.Options{
		Self:   sc.PeerSelfURL,
		Key:    sc.PeerKey,
		Limits: limits,
		Logger: log,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", sc.PeerListenAddress)
	if err != nil {
		ring.Close()
		return nil, fmt.Errorf("peer API: %w", err)
	}
	s := &sessionStore{
		Store:  ring,
		close:  ring.Close,
		peerLn: ln,
		logger: log,
		self:   sc.PeerSelfURL,
		peerSrv: &http.Server{
			// Only the peer API: the public routes are never served here,
			// and the peer API never on the public listener.
			Handler:           ring.PeerHandler(),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      10 * time.Second,
			IdleTimeout:       120 * time.Second,
			MaxHeaderBytes:    16 << 10,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
	}

	if sc.PeerServiceName == "" {
		ring.SetPeers(sc.Peers)
		if len(sc.Peers) == 0 {
			log.Warn("hashring without --peers or --peer-service: this replica is alone in the ring")
		}
		return s, nil
	}

	// Discovery: the ring is not ready until the EndpointSlices were read
	// once; until then this replica would own every session alone.
	status := health.NewStatus("peers", fmt.Errorf("none known yet: waiting for the EndpointSlices of Service %s/%s", sc.PeerServiceNamespace, sc.PeerServiceName))
	s.checks = append(s.checks, status)
	rc, err := binding.RESTConfig(cfg.Kubeconfig, cfg.Context)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("peer discovery: %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("peer discovery: %w", err)
	}
	opts := peerdiscovery.Options{Namespace: sc.PeerServiceNamespace, Service: sc.PeerServiceName, PortName: sc.PeerPortName}
	s.discover = func(ctx context.Context) {
		// Watch returns once the informer synced (it retries the API
		// server in the meantime) or with an error to retry after a pause.
		for ctx.Err() == nil {
			err := peerdiscovery.Watch(ctx, client, opts, func(peers []string) {
				ring.SetPeers(peers)
				status.Set(nil)
			})
			if err == nil || ctx.Err() != nil {
				return
			}
			log.Warn("peer discovery failed; retrying", "error", err)
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
	}
	return s, nil
}

// start serves the peer API and starts discovery; a failure of the peer
// server is sent to errc. ctx ends discovery.
func (s *sessionStore) start(ctx context.Context, errc chan<- error) {
	if s.peerSrv == nil {
		return
	}
	go func() {
		if err := s.peerSrv.Serve(s.peerLn); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("peer API: %w", err)
		}
	}()
	if s.discover != nil {
		go s.discover(ctx)
	}
	s.logger.Info("serving the peer API", "address", s.peerLn.Addr().String(), "self", s.self,
		"peers", s.Store.(*hashring.Store).Peers(), "discovery", s.discover != nil)
}

// shutdown stops the peer API after its in-flight requests. Call it after
// the public server stopped: until then, other replicas may still forward
// requests for the sessions this one owns.
func (s *sessionStore) shutdown(ctx context.Context) error {
	if s.peerSrv == nil {
		return nil
	}
	return s.peerSrv.Shutdown(ctx)
}

// Close releases everything, at once.
func (s *sessionStore) Close() {
	if s.peerSrv != nil {
		s.peerSrv.Close()
		s.peerLn.Close()
	}
	s.close()
}
