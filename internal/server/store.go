package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/health"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/hashring"
	"github.com/kbprovider/backend/internal/sessions/hashring/peerdiscovery"
	"github.com/kbprovider/backend/internal/sessions/memory"
)

// discoveryRetry is the pause after peer discovery failed to sync.
const discoveryRetry = 5 * time.Second

// newSessionStore builds the configured store. For the hashring it also
// listens on the peer address (so a port in use fails in New) and, with a
// peer Service, adds the discovery loop. It returns the store's readiness
// checks.
func (s *Server) newSessionStore() ([]health.Check, error) {
	limits := sessions.Limits{MaxSessions: s.cfg.MaxPendingSessions, Grace: s.cfg.GracePeriod}
	if s.cfg.Store.Kind != StoreHashring {
		m := memory.New(limits, nil)
		s.store, s.closeStore = m, m.Close
		return nil, nil
	}
	sc := s.cfg.Store
	log := s.log.With("component", "hashring")
	ring, err := hashring.New(hashring.Options{
		Self:      sc.PeerSelfURL,
		Key:       sc.PeerKey,
		Limits:    limits,
		Logger:    log,
		NoStreams: sc.NoPeerStreams,
	})
	if err != nil {
		return nil, err
	}
	s.store, s.closeStore, s.ring = ring, ring.Close, ring
	if s.peers, err = ring.ListenPeers(sc.PeerListenAddress, log); err != nil {
		return nil, err
	}
	// Not ready until this replica joined the ring (Run joins once the
	// peer API serves), nor once it leaves: a load balancer sends
	// requests only to members.
	member := health.CheckFunc("ring", func(context.Context) error { return ring.Ready() })

	if sc.PeerServiceName == "" {
		ring.SetPeers(sc.Peers)
		if len(sc.Peers) == 0 {
			log.Warn("hashring without --peers or --peer-service: this replica is alone in the ring")
		}
		s.join = func(ctx context.Context) { s.joinRing(ctx, ring, nil) }
		return []health.Check{member}, nil
	}

	// Discovery: the ring is not ready until the EndpointSlices were read
	// once; until then this replica would own every session alone.
	status := health.NewStatus("peers", fmt.Errorf("none known yet: waiting for the EndpointSlices of Service %s/%s", sc.PeerServiceNamespace, sc.PeerServiceName))
	rc, err := s.provider()
	if err != nil {
		return nil, fmt.Errorf("peer discovery: %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("peer discovery: %w", err)
	}
	opts := peerdiscovery.Options{Namespace: sc.PeerServiceNamespace, Service: sc.PeerServiceName, PortName: sc.PeerPortName}
	listed := make(chan struct{})
	var once sync.Once
	set := func(peers []string) {
		ring.SetPeers(peers)
		status.Set(nil)
		once.Do(func() { close(listed) })
	}
	s.loops = append(s.loops, loop{"peer discovery", func(ctx context.Context) {
		peerdiscovery.Run(ctx, client, opts, set, discoveryRetry, log)
	}})
	s.join = func(ctx context.Context) { s.joinRing(ctx, ring, listed) }
	return []health.Check{status, member}, nil
}

// joinRing joins the ring once the candidates are known (listed closed;
// nil: at once). The peer API must serve by then: the members answer the
// join by sending this replica requests.
func (s *Server) joinRing(ctx context.Context, ring *hashring.Store, listed <-chan struct{}) {
	if listed != nil {
		select {
		case <-listed:
		case <-ctx.Done():
			return
		}
	}
	if err := ring.Join(ctx); err != nil {
		s.log.Warn("did not join the session ring", "component", "hashring", "error", err)
		return
	}
	s.log.Info("joined the session ring", "component", "hashring", "members", ring.Members())
}
