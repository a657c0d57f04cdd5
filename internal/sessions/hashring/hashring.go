// Package hashring is a sessions.Store shared by the replicas of the
// backend: any replica answers any request of any session, without sticky
// routing. docs/sessions-hashring.md explains the design.
//
// Each session has one owner replica, picked by groupcache's consistent
// hash of its ID over the current peers. The owner keeps the session's
// mutable state in a memory.Store (the only copy, so nonces, poll intervals
// and transitions are atomic cluster-wide); other replicas forward every
// operation to it over an authenticated, encrypted peer API, in batches
// (pipe.go). The part of a session that never changes (ID, cluster ID,
// secret, creation time) is cached by the other replicas (static.go), so a
// poll's signature is checked where it arrives and the poll costs one
// round trip to the owner.
package hashring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/golang/groupcache/consistenthash"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/memory"
)

// Options configure a Store.
type Options struct {
	// Self is this replica's peer base URL as the other replicas reach it
	// and as it appears in the peer list, e.g. "http://10.0.0.5:8091".
	Self string
	// Key is the shared peer key (at least 32 bytes), the same on every
	// replica.
	Key []byte
	// Limits bound the sessions this replica owns (zero fields: defaults).
	Limits sessions.Limits
	// Clock is the time for session decisions (nil: time.Now). Peer
	// message freshness always uses the wall clock.
	Clock func() time.Time
	// PeerTimeout bounds each call to another replica (default 2s), so a
	// dead owner means a quick answer, never a hang.
	PeerTimeout time.Duration
	// CacheBytes bounds the cache of the static parts of sessions other
	// replicas own (default: 1 KiB per session of Limits.MaxSessions,
	// room for the sessions of a few full replicas at their usual
	// size of about 350 bytes, and at least 4 MiB).
	CacheBytes int64
	// Transport carries peer requests (default: a transport with short
	// dial timeouts).
	Transport http.RoundTripper
	// Logger logs peer failures (default: slog.Default()). It never logs
	// secrets.
	Logger *slog.Logger
}

// PeerPath is where PeerHandler serves the peer API. v2: messages carry
// batches of requests. A v1 replica (before batching) and a v2 replica do
// not understand each other (404): during an upgrade from v1, each counts
// the other as unavailable for the sessions the other owns.
const PeerPath = "/sessions-peer/v2"

// Store is a sessions.Store spread over the replicas in the ring.
type Store struct {
	self    string
	local   *memory.Store
	limits  sessions.Limits
	sealer  *sealer
	replays *replayCache
	client  *http.Client
	log     *slog.Logger
	statics *staticCache
	pipes   *pipes

	// waitClient carries held wait requests (wait.go); peerTimeout bounds
	// the one follow-up call of a cancelled wait.
	waitClient  *http.Client
	peerTimeout time.Duration

	mu    sync.RWMutex
	ring  *consistenthash.Map
	peers []string
}

var _ sessions.Store = (*Store)(nil)

// virtualNodes is how many points each peer has on the hash ring; as in
// groupcache's HTTPPool, it spreads ownership evenly.
const virtualNodes = 50

// New returns the Store of this replica. Its peers are only itself until
// SetPeers is called. Close it to stop the local janitor.
func New(opts Options) (*Store, error) {
	if opts.Self == "" {
		return nil, errors.New("hashring: Self (this replica's peer URL) is required")
	}
	sealer, err := newSealer(opts.Key)
	if err != nil {
		return nil, err
	}
	if opts.PeerTimeout <= 0 {
		opts.PeerTimeout = 2 * time.Second
	}
	if opts.Transport == nil {
		opts.Transport = defaultTransport(opts.PeerTimeout)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Store{
		self:    opts.Self,
		local:   memory.New(opts.Limits, opts.Clock),
		sealer:  sealer,
		replays: newReplayCache(),
		client:  &http.Client{Transport: opts.Transport, Timeout: opts.PeerTimeout},
		log:     opts.Logger,

		waitClient:  newWaitClient(opts.Transport, opts.PeerTimeout),
		peerTimeout: opts.PeerTimeout,
	}
	s.limits = s.local.Limits()
	if opts.CacheBytes <= 0 {
		opts.CacheBytes = max(int64(s.limits.MaxSessions)<<10, 4<<20)
	}
	s.statics = newStaticCache(opts.CacheBytes)
	// The batch envelope and the seal add a few bytes to the requests.
	s.pipes = newPipes(s.maxPeerMessage() - 1024)
	s.SetPeers(nil)
	return s, nil
}

// Close stops the local store's janitor and waits for the peer calls in
// flight.
func (s *Store) Close() {
	s.local.Close()
	s.pipes.close()
}

// SetPeers replaces the ring's members: base URLs of every replica,
// this one included (it is added if missing). Sessions whose owner changes
// are not moved: their new owner does not know them, so they end as
// unknown (410), and their clients start over.
func (s *Store) SetPeers(peers []string) {
	ps := slices.Clone(peers)
	if !slices.Contains(ps, s.self) {
		ps = append(ps, s.self)
	}
	slices.Sort(ps)
	ps = slices.Compact(ps)
	ring := consistenthash.New(virtualNodes, nil)
	ring.Add(ps...)
	s.mu.Lock()
	changed := !slices.Equal(ps, s.peers)
	s.ring, s.peers = ring, ps
	s.mu.Unlock()
	if changed {
		s.log.Info("session hashring peers", "peers", ps)
	}
}

// Peers returns the ring's members.
func (s *Store) Peers() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.peers)
}

// Owner returns the peer URL of the replica that owns session id.
func (s *Store) Owner(id string) string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ring.Get(id)
}

// Local returns the memory store of the sessions this replica owns.
func (s *Store) Local() *memory.Store { return s.local }

// OwnerUnavailableError says the replica owning a session did not answer.
// For session operations it counts as sessions.ErrNotFound (the session
// is lost with its owner; the client starts over, 410), for Create as
// sessions.ErrFull (try again shortly, 503).
type OwnerUnavailableError struct {
	Owner string
	Op    string
	Err   error
}

func (e *OwnerUnavailableError) Error() string {
	return fmt.Sprintf("the replica %s holding this session did not answer (%s): %v", e.Owner, e.Op, e.Err)
}

func (e *OwnerUnavailableError) Unwrap() error { return e.Err }

func (e *OwnerUnavailableError) Is(target error) bool {
	if e.Op == opCreate {
		return target == sessions.ErrFull
	}
	return target == sessions.ErrNotFound
}

func (s *Store) Create(ctx context.Context, sess sessions.Session) error {
	owner := s.Owner(sess.ID)
	if owner == s.self {
		return s.local.Create(ctx, sess)
	}
	_, err := s.call(ctx, owner, &peerRequest{Op: opCreate, Session: toWire(sess)})
	if err == nil {
		// This replica knows the static part already; a poll that lands
		// here needs no static request.
		s.statics.add(newStaticEntry(sess))
	}
	return err
}

// Get returns the session. On a non-owner that has the static part
// cached, it asks the owner for the mutable part and the digest of its
// static part, and combines them when they belong to the same session;
// otherwise it asks for everything and caches the static part.
func (s *Store) Get(ctx context.Context, id string) (sessions.Session, error) {
	owner := s.Owner(id)
	if owner == s.self {
		return s.local.Get(ctx, id)
	}
	if e, ok := s.statics.get(id); ok {
		resp, err := s.call(ctx, owner, &peerRequest{Op: opState, ID: id})
		if err != nil {
			if errors.Is(err, sessions.ErrNotFound) {
				s.statics.remove(id)
			}
			return sessions.Session{}, err
		}
		if w := resp.Session; string(w.StaticDigest) == string(e.digest) {
			return withStatic(fromWire(w), e.sess), nil
		}
		// The ID was used again: ask for everything.
	}
	resp, err := s.call(ctx, owner, &peerRequest{Op: opGet, ID: id})
	if err != nil {
		if errors.Is(err, sessions.ErrNotFound) {
			s.statics.remove(id)
		}
		return sessions.Session{}, err
	}
	sess := fromWire(resp.Session)
	s.statics.add(newStaticEntry(sess))
	return sess, nil
}

// withStatic returns sess with the static fields of st.
func withStatic(sess, st sessions.Session) sessions.Session {
	sess.ID, sess.ClusterID, sess.Secret, sess.CreatedAt = st.ID, st.ClusterID, st.Secret, st.CreatedAt
	sess.CallbackURL, sess.CallbackSessionID = st.CallbackURL, st.CallbackSessionID
	return sess
}

func (s *Store) UseNonce(ctx context.Context, id, nonce string) error {
	owner := s.Owner(id)
	if owner == s.self {
		return s.local.UseNonce(ctx, id, nonce)
	}
	_, err := s.call(ctx, owner, &peerRequest{Op: opUseNonce, ID: id, Nonce: nonce})
	return err
}

func (s *Store) RecordPoll(ctx context.Context, id, nonce string, minInterval time.Duration) (sessions.Session, error) {
	owner := s.Owner(id)
	if owner == s.self {
		return s.local.RecordPoll(ctx, id, nonce, minInterval)
	}
	// The digest of the cached static part (the one Static returned, which
	// the caller checked the signature with) goes along; the owner then
	// answers only the mutable part, or stale_static.
	req := &peerRequest{Op: opPoll, ID: id, Nonce: nonce, Interval: int64(minInterval)}
	e, cached := s.statics.get(id)
	if cached {
		req.StaticDigest = e.digest
	}
	resp, err := s.call(ctx, owner, req)
	switch {
	case errors.Is(err, sessions.ErrStaleStatic), errors.Is(err, sessions.ErrNotFound):
		s.statics.remove(id)
		return sessions.Session{}, err
	case err != nil:
		return sessions.Session{}, err
	case cached:
		return withStatic(fromWire(resp.Session), e.sess), nil
	}
	return fromWire(resp.Session), nil
}

func (s *Store) Complete(ctx context.Context, id string, response []byte) error {
	owner := s.Owner(id)
	if owner == s.self {
		return s.local.Complete(ctx, id, response)
	}
	// Refuse here what the owner would refuse, before sending it.
	if len(response) > s.limits.MaxResponseBytes {
		sess, err := s.Get(ctx, id)
		switch {
		case err != nil:
			return err
		case sess.State != sessions.StatePending:
			return sessions.ErrNotPending
		}
		return sessions.ErrTooLarge
	}
	_, err := s.call(ctx, owner, &peerRequest{Op: opComplete, ID: id, Response: response})
	return err
}

func (s *Store) Deny(ctx context.Context, id, reason string) error {
	owner := s.Owner(id)
	if owner == s.self {
		return s.local.Deny(ctx, id, reason)
	}
	_, err := s.call(ctx, owner, &peerRequest{Op: opDeny, ID: id, Reason: reason})
	return err
}

// Delete removes the session on its owner. If the owner is gone, so is the
// session, and Delete succeeds.
func (s *Store) Delete(ctx context.Context, id string) error {
	owner := s.Owner(id)
	if owner == s.self {
		return s.local.Delete(ctx, id)
	}
	s.statics.remove(id)
	_, err := s.call(ctx, owner, &peerRequest{Op: opDelete, ID: id})
	var gone *OwnerUnavailableError
	if errors.As(err, &gone) {
		return nil
	}
	return err
}
