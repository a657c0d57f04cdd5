package server

import (
	"context"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/server/health"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/kube"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/sessions/ring"
	"github.com/kbprovider/backend/internal/sessions/ring/peerdiscovery"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
)

// discoveryRetry is the pause after peer discovery failed to sync.
const discoveryRetry = 5 * time.Second

// newSessionStore builds the configured store and the keys sessions are
// derived with. For the ring it also listens on the peer address (so a
// port in use fails in New), and adds the record informer and, with a peer
// Service, the discovery loop. It returns the store's readiness checks
// (its own cache) and the dependency it shares with every replica (the
// provider cluster).
func (s *Server) newSessionStore() (readiness, dependencies []health.Check, err error) {
	limits := sessions.Limits{MaxPolledSessions: s.cfg.MaxPolledSessions, Grace: s.cfg.GracePeriod,
		WriteRate: s.cfg.Store.WriteRate, WriteBurst: s.cfg.Store.WriteBurst(), MaxRecords: s.cfg.Store.MaxRecords}
	keys, err := s.sessionKeys()
	if err != nil {
		return nil, nil, err
	}
	s.keys = keys
	if s.cfg.Store.Kind != StoreRing {
		s.store = memory.New(limits, s.now)
		return nil, nil, nil
	}
	sc := s.cfg.Store
	rc, err := s.provider()
	if err != nil {
		return nil, nil, err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("session records: %w", err)
	}
	records, err := kube.New(kube.Options{Config: rc, Namespace: sc.Namespace, Limits: limits, Now: s.now,
		Logger: s.log.With("component", "session-records")})
	if err != nil {
		return nil, nil, err
	}
	s.loops = append(s.loops, loop{"session records", records.Run})
	synced := health.CheckFunc("session-records", func(context.Context) error {
		if !records.HasSynced() {
			return errors.New("the session records are not read yet")
		}
		return nil
	})

	log := s.log.With("component", "ring")
	r, err := ring.New(ring.Options{Self: sc.PeerSelfURL, Keys: sc.PeerKeys, Inner: records, Logger: log, Now: s.now})
	if err != nil {
		return nil, nil, err
	}
	s.store, s.ring = r, r
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", sc.PeerListenAddress)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot listen on the peer address %s: %w", sc.PeerListenAddress, err)
	}
	s.peerLn = ln

	if sc.PeerServiceName == "" {
		r.SetPeers(sc.Peers)
		if len(sc.Peers) == 0 {
			log.Warn("ring without --peers or --peer-service: this replica answers every session alone")
		}
		return []health.Check{synced}, []health.Check{clusterCheck(client)}, nil
	}
	// Discovery: until the EndpointSlices were read once, this replica
	// places every session on itself, which is safe (every replica reads
	// the same records) and only costs the nonce check its owner.
	r.SetPeers([]string{sc.PeerSelfURL})
	opts := peerdiscovery.Options{Namespace: sc.PeerServiceNamespace, Service: sc.PeerServiceName, PortName: sc.PeerPortName}
	var once sync.Once
	set := func(peers []string) {
		r.SetPeers(peers)
		once.Do(func() { log.Info("peers discovered", "peers", peers) })
	}
	s.loops = append(s.loops, loop{"peer discovery", func(ctx context.Context) {
		peerdiscovery.Run(ctx, client, opts, set, discoveryRetry, log)
	}})
	return []health.Check{synced}, []health.Check{clusterCheck(client)}, nil
}

// sessionKeys returns the keys sessions are derived with: the configured
// ones; for the ring without them, keys derived from the peer keys
// (every replica shares those, and rotating them rotates both); for one
// replica with memory, a random key (sessions end with the process anyway).
func (s *Server) sessionKeys() (*sessionkey.Keys, error) {
	keys := s.cfg.SessionKeys
	if len(keys) == 0 && s.cfg.Store.Kind == StoreRing {
		for _, pk := range s.cfg.Store.PeerKeys {
			k, err := hkdf.Key(sha256.New, pk, nil, "kube-bind session key", 32)
			if err != nil {
				return nil, err
			}
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		k := make([]byte, 32)
		rand.Read(k)
		keys = [][]byte{k}
		s.sessionKeysRandom = true
	}
	s.sessionKeyBytes = keys
	return sessionkey.New(currentKey(keys), previousKeys(keys)...)
}
