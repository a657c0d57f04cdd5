// Package hashring is a sessions.Store shared by the replicas of the
// backend: any replica answers any request of any session, without sticky
// routing. docs/sessions-hashring.md explains the design.
//
// Each session has one owner replica, picked by groupcache's consistent
// hash of its ID over the ring's members. The owner keeps the session's
// mutable state in a memory.Store (so nonces, poll intervals and
// transitions are atomic cluster-wide) and sends every change to one
// backup replica, the one that would own the session if the owner were
// gone, before it answers. Replicas join the ring when they start and
// leave it, handing their sessions over, when they stop (membership.go);
// a session moves with its nonces (owner.go). Other replicas forward
// every operation to the owner over an authenticated, encrypted peer API.
// The part of a session that never changes (ID, cluster ID, secret,
// creation time) is also served through a groupcache Group, so replicas
// hot-cache it.
package hashring

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang/groupcache"
	pb "github.com/golang/groupcache/groupcachepb"
	"github.com/golang/groupcache/singleflight"

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
	// CacheBytes bounds the groupcache cache of static session parts
	// (default 4 MiB).
	CacheBytes int64
	// Transport carries peer requests (default: a transport with short
	// dial timeouts).
	Transport http.RoundTripper
	// Logger logs peer failures (default: slog.Default()). It never logs
	// secrets.
	Logger *slog.Logger
}

// PeerPath is where PeerHandler serves the peer API.
const PeerPath = "/sessions-peer/v1"

// Store is a sessions.Store spread over the replicas in the ring.
type Store struct {
	self    string
	local   *memory.Store
	limits  sessions.Limits
	sealer  *sealer
	replays *replayCache
	client  *http.Client
	log     *slog.Logger
	group   *groupcache.Group
	name    string

	// dialer probes whether a peer whose connection broke is gone.
	dialer *net.Dialer
	// inc is this process's incarnation, sent in every peer message.
	inc uint64

	mu sync.RWMutex
	m  membership

	// ringChanged wakes the resync loop; bg runs it and the announcements,
	// until Close cancels bgCtx.
	ringChanged chan struct{}
	bg          sync.WaitGroup
	bgCtx       context.Context
	stopBg      context.CancelFunc

	// resyncMu serializes resyncs; synced is the ring of the last one.
	resyncMu sync.Mutex
	synced   *ringView

	takes        singleflight.Group
	replFailures atomic.Uint64

	// waitClient carries held wait requests (wait.go); peerTimeout bounds
	// the one follow-up call of a cancelled wait.
	waitClient  *http.Client
	peerTimeout time.Duration
}

var _ sessions.Store = (*Store)(nil)

// virtualNodes is how many points each peer has on the hash ring; as in
// groupcache's HTTPPool, it spreads ownership evenly.
const virtualNodes = 50

// groupcache has one process-wide peer picker registry and group
// namespace. The package registers a per-group picker once, and each Store
// names its group uniquely, so several Stores (the replicas of a test) can
// live in one process; group names never cross the wire.
var (
	registerOnce sync.Once
	registerErr  error
	storesMu     sync.RWMutex
	stores       = map[string]*Store{}
)

func registerPicker() error {
	registerOnce.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				registerErr = fmt.Errorf("hashring: another groupcache peer picker is registered in this process: %v", r)
			}
		}()
		groupcache.RegisterPerGroupPeerPicker(func(name string) groupcache.PeerPicker {
			storesMu.RLock()
			defer storesMu.RUnlock()
			if s := stores[name]; s != nil {
				return s
			}
			return groupcache.NoPeers{}
		})
	})
	return registerErr
}

// New returns the Store of this replica. It owns every session until
// SetPeers names candidates and Join makes it a member of their ring.
// Close it to stop the local janitor and the resync loop.
func New(opts Options) (*Store, error) {
	if opts.Self == "" {
		return nil, errors.New("hashring: Self (this replica's peer URL) is required")
	}
	sealer, err := newSealer(opts.Key)
	if err != nil {
		return nil, err
	}
	if err := registerPicker(); err != nil {
		return nil, err
	}
	if opts.PeerTimeout <= 0 {
		opts.PeerTimeout = 2 * time.Second
	}
	if opts.CacheBytes <= 0 {
		opts.CacheBytes = 4 << 20
	}
	if opts.Transport == nil {
		opts.Transport = defaultTransport(opts.PeerTimeout)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	var suffix, inc [8]byte
	rand.Read(suffix[:])
	rand.Read(inc[:])
	s := &Store{
		self:    opts.Self,
		local:   memory.New(opts.Limits, opts.Clock),
		sealer:  sealer,
		replays: newReplayCache(),
		client:  &http.Client{Transport: opts.Transport, Timeout: opts.PeerTimeout},
		log:     opts.Logger,
		name:    "kube-bind-sessions-" + hex.EncodeToString(suffix[:]),
		inc:     binary.BigEndian.Uint64(inc[:]) | 1,
		dialer:  &net.Dialer{Timeout: opts.PeerTimeout / 2},
		m:       membership{members: map[string]uint64{}, down: map[string]uint64{}, left: map[string]uint64{}},

		ringChanged: make(chan struct{}, 1),

		waitClient:  newWaitClient(opts.Transport, opts.PeerTimeout),
		peerTimeout: opts.PeerTimeout,
	}
	s.limits = s.local.Limits()
	s.bgCtx, s.stopBg = context.WithCancel(context.Background())
	s.mu.Lock()
	s.rebuildLocked()
	s.mu.Unlock()
	<-s.ringChanged // the first ring needs no resync
	s.bg.Go(s.resyncLoop)
	s.bg.Go(s.heartbeat)
	storesMu.Lock()
	stores[s.name] = s
	storesMu.Unlock()
	s.group = groupcache.NewGroup(s.name, opts.CacheBytes, groupcache.GetterFunc(s.loadStatic))
	return s, nil
}

// Close stops the resync loop and the local store's janitor. Groupcache
// groups cannot be removed; the small cache of a closed Store stays until
// the process ends.
func (s *Store) Close() {
	s.stopBg()
	s.bg.Wait()
	s.local.Close()
	storesMu.Lock()
	delete(stores, s.name)
	storesMu.Unlock()
}

// Owner returns the peer URL of the replica that owns session id in this
// replica's ring.
func (s *Store) Owner(id string) string {
	if o := s.view().owner(id); o != "" {
		return o
	}
	return s.self
}

// PickPeer implements groupcache.PeerPicker for this Store's group.
func (s *Store) PickPeer(key string) (groupcache.ProtoGetter, bool) {
	owner := s.Owner(key)
	if owner == s.self {
		return nil, false
	}
	return peerGetter{s: s, peer: owner}, true
}

// Local returns the memory store of the sessions this replica owns.
func (s *Store) Local() *memory.Store { return s.local }

// OwnerUnavailableError says a replica did not answer a call. It counts
// as sessions.ErrUnavailable (503, try again shortly): a replica that
// refuses connections is taken out of the ring and its sessions served by
// their backups instead (route), so what is left is a replica that is
// slow or restarting, which may still hold the session.
type OwnerUnavailableError struct {
	Owner string
	Op    string
	Err   error
}

func (e *OwnerUnavailableError) Error() string {
	return fmt.Sprintf("the replica %s holding this session did not answer (%s): %v", e.Owner, e.Op, e.Err)
}

func (e *OwnerUnavailableError) Unwrap() error { return e.Err }

func (e *OwnerUnavailableError) Is(target error) bool { return target == sessions.ErrUnavailable }

func (s *Store) Create(ctx context.Context, sess sessions.Session) error {
	_, err := s.route(ctx, &peerRequest{Op: opCreate, ID: sess.ID, Session: toWire(sess)})
	return err
}

// Get returns the session. Held here as owner, from the local store;
// else, on a non-owner, it asks the owner for the mutable state while it
// looks up the static part through groupcache, and combines them when
// they belong to the same session.
func (s *Store) Get(ctx context.Context, id string) (sessions.Session, error) {
	if sess, err := s.local.Get(ctx, id); err == nil {
		return sess, nil
	}
	if s.Owner(id) == s.self {
		resp, err := s.route(ctx, &peerRequest{Op: opGet, ID: id})
		if err != nil {
			return sessions.Session{}, err
		}
		return fromWire(resp.Session), nil
	}
	type static struct {
		p   staticPart
		err error
	}
	ch := make(chan static, 1)
	go func() {
		var b []byte
		var st static
		st.err = s.group.Get(ctx, id, groupcache.AllocatingByteSliceSink(&b))
		if st.err == nil {
			st.err = json.Unmarshal(b, &st.p)
		}
		ch <- st
	}()
	resp, err := s.route(ctx, &peerRequest{Op: opState, ID: id})
	st := <-ch
	if err != nil {
		return sessions.Session{}, err
	}
	w := resp.Session
	if st.err == nil && string(st.p.digest()) == string(w.StaticDigest) {
		w.ID, w.ClusterID, w.Secret, w.CreatedAt = st.p.ID, st.p.ClusterID, st.p.Secret, st.p.CreatedAt
		w.CallbackURL, w.CallbackSessionID = st.p.CallbackURL, st.p.CallbackSessionID
		return fromWire(w), nil
	}
	// The cached static part is missing or stale (the ID was used again):
	// ask the owner for everything.
	resp, err = s.route(ctx, &peerRequest{Op: opGet, ID: id})
	if err != nil {
		return sessions.Session{}, err
	}
	return fromWire(resp.Session), nil
}

func (s *Store) UseNonce(ctx context.Context, id, nonce string) error {
	_, err := s.route(ctx, &peerRequest{Op: opUseNonce, ID: id, Nonce: nonce})
	return err
}

// RecordPoll gives the poll a request ID of its own, so that a poll sent
// again after its answer was lost on the way (its owner died after spending
// the nonce) is not refused as a replay of itself (memory.PollMark).
func (s *Store) RecordPoll(ctx context.Context, id, nonce string, minInterval time.Duration) (sessions.Session, error) {
	req := mrand.Uint64() | 1 // never 0, which means "no request ID"
	resp, err := s.route(ctx, &peerRequest{Op: opPoll, ID: id, Nonce: nonce, Interval: int64(minInterval), Req: req})
	if err != nil {
		return sessions.Session{}, err
	}
	return fromWire(resp.Session), nil
}

func (s *Store) Complete(ctx context.Context, id string, response []byte) error {
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
	_, err := s.route(ctx, &peerRequest{Op: opComplete, ID: id, Response: response})
	return err
}

func (s *Store) Deny(ctx context.Context, id, reason string) error {
	_, err := s.route(ctx, &peerRequest{Op: opDeny, ID: id, Reason: reason})
	return err
}

// Delete removes the session on its owner and its copy on the backup. A
// session nobody holds any more is deleted already.
func (s *Store) Delete(ctx context.Context, id string) error {
	_, err := s.route(ctx, &peerRequest{Op: opDelete, ID: id})
	if errors.Is(err, sessions.ErrNotFound) {
		return nil
	}
	return err
}

// loadStatic is the group's Getter: it runs on the owner (or on a replica
// whose ring says it is the owner) and reads the local store. Errors are
// not cached by groupcache, so an unknown session stays unknown only until
// it exists.
func (s *Store) loadStatic(ctx context.Context, id string, dest groupcache.Sink) error {
	sess, ok := s.local.Peek(id) // a copy's static part is the owner's
	if !ok {
		return sessions.ErrNotFound
	}
	return dest.SetBytes(mustJSON(staticOf(sess)))
}

// peerGetter fetches a static part from its owner for groupcache, over the
// authenticated peer API.
type peerGetter struct {
	s    *Store
	peer string
}

func (g peerGetter) Get(ctx context.Context, in *pb.GetRequest, out *pb.GetResponse) error {
	resp, err := g.s.call(ctx, g.peer, &peerRequest{Op: opStatic, ID: in.GetKey()})
	if err != nil {
		return err
	}
	out.Value = resp.Static
	return nil
}
