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
// every operation to the owner over an authenticated, encrypted peer API,
// in batches (pipe.go), on long-lived streams where the peer serves them
// (stream.go). The part of a session that never changes (ID,
// cluster ID, secret, creation time) is cached by the other replicas
// (static.go), so a poll's signature is checked where it arrives and the
// poll costs one round trip to the owner.
package hashring

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

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
	// NoStreams sends every batch to a peer as an HTTP message through
	// Transport, as replicas before streams did (stream.go), and refuses
	// the streams of other replicas: for tests that watch the messages,
	// and a way back should streams misbehave.
	NoStreams bool
	// Dial opens the connections of streams to peers (default: a
	// net.Dialer).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
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
	workers *workers
	// senders are the streams this replica sends on (nil: NoStreams);
	// receivers those it serves.
	senders   *senders
	receivers *receivers

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
	if opts.PeerTimeout <= 0 {
		opts.PeerTimeout = 2 * time.Second
	}
	if opts.Transport == nil {
		opts.Transport = defaultTransport(opts.PeerTimeout)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	var inc [8]byte
	rand.Read(inc[:])
	s := &Store{
		self:    opts.Self,
		local:   memory.New(opts.Limits, opts.Clock),
		sealer:  sealer,
		replays: newReplayCache(),
		client:  &http.Client{Transport: opts.Transport, Timeout: opts.PeerTimeout},
		log:     opts.Logger,
		inc:     binary.BigEndian.Uint64(inc[:]) | 1,
		dialer:  &net.Dialer{Timeout: opts.PeerTimeout / 2},
		m:       membership{members: map[string]uint64{}, down: map[string]uint64{}, left: map[string]uint64{}},

		ringChanged: make(chan struct{}, 1),

		waitClient:  newWaitClient(opts.Transport, opts.PeerTimeout),
		peerTimeout: opts.PeerTimeout,
	}
	s.limits = s.local.Limits()
	if opts.CacheBytes <= 0 {
		opts.CacheBytes = max(int64(s.limits.MaxSessions)<<10, 4<<20)
	}
	s.statics = newStaticCache(opts.CacheBytes)
	// The batch envelope and the seal add a few bytes to the requests.
	s.workers = newWorkers()
	s.pipes = newPipes(s.maxPeerMessage()-1024, s.sendBatch, s.workers.Go)
	s.receivers = newReceivers()
	if opts.NoStreams {
		s.receivers.closed = true
	} else {
		if opts.Dial == nil {
			opts.Dial = (&net.Dialer{Timeout: opts.PeerTimeout / 2, KeepAlive: 30 * time.Second}).DialContext
		}
		s.senders = newSenders(sealer, opts.Dial, opts.PeerTimeout, s.maxPeerMessage(), opts.Logger)
	}
	s.bgCtx, s.stopBg = context.WithCancel(context.Background())
	s.mu.Lock()
	s.rebuildLocked()
	s.mu.Unlock()
	<-s.ringChanged // the first ring needs no resync
	s.bg.Go(s.resyncLoop)
	s.bg.Go(s.heartbeat)
	return s, nil
}

// Close stops the resync loop and the local store's janitor, waits for
// the peer calls in flight, and closes the streams to and from peers.
func (s *Store) Close() {
	s.stopBg()
	s.bg.Wait()
	s.local.Close()
	s.pipes.close()
	s.senders.close()
	s.receivers.close()
	s.workers.close()
}

// Owner returns the peer URL of the replica that owns session id in this
// replica's ring.
func (s *Store) Owner(id string) string {
	if o := s.view().owner(id); o != "" {
		return o
	}
	return s.self
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
	if err == nil {
		// This replica knows the static part already; a poll that lands
		// here needs no static request.
		s.cacheStatic(newStaticEntry(sess))
	}
	return err
}

// Get returns the session. Held here as owner, from the local store.
// Else, on a non-owner that has the static part cached, it asks the owner
// for the mutable part and the digest of its static part, and combines
// them when they belong to the same session; otherwise it asks for
// everything and caches the static part.
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
	if e, ok := s.statics.get(id); ok {
		resp, err := s.route(ctx, &peerRequest{Op: opState, ID: id})
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
	resp, err := s.route(ctx, &peerRequest{Op: opGet, ID: id})
	if err != nil {
		if errors.Is(err, sessions.ErrNotFound) {
			s.statics.remove(id)
		}
		return sessions.Session{}, err
	}
	sess := fromWire(resp.Session)
	s.cacheStatic(newStaticEntry(sess))
	return sess, nil
}

// withStatic returns sess with the static fields of st.
func withStatic(sess, st sessions.Session) sessions.Session {
	sess.ID, sess.ClusterID, sess.Secret, sess.CreatedAt = st.ID, st.ClusterID, st.Secret, st.CreatedAt
	sess.CallbackURL, sess.CallbackSessionID = st.CallbackURL, st.CallbackSessionID
	return sess
}

func (s *Store) UseNonce(ctx context.Context, id, nonce string) error {
	_, err := s.route(ctx, &peerRequest{Op: opUseNonce, ID: id, Nonce: nonce})
	return err
}

// RecordPoll gives the poll a request ID of its own, so that a poll sent
// again after its answer was lost on the way (its owner died after spending
// the nonce) is not refused as a replay of itself (memory.PollMark).
//
// The digest of the static part Static returned (which the caller checked
// the signature with: the backup's copy held here, or the cached one) goes
// along; the owner then answers only the mutable part, or stale_static if
// its session under this ID has another static part (the caller checks
// the signature again).
func (s *Store) RecordPoll(ctx context.Context, id, nonce string, minInterval time.Duration) (sessions.Session, error) {
	req := &peerRequest{Op: opPoll, ID: id, Nonce: nonce, Interval: int64(minInterval),
		Req: mrand.Uint64() | 1} // never 0, which means "no request ID"
	var static sessions.Session
	fromCopy := false
	st, digest, owned, held := s.local.StaticOf(id)
	switch {
	case owned:
		// Served here, as route would, without the wire form of the
		// answer that route's callers on other replicas need.
		sess, err := s.recordPollHere(ctx, req)
		if err == nil {
			return sess, s.replicate(ctx, pollCopy(sess, req))
		}
		if !errors.Is(err, sessions.ErrNotFound) && !errors.Is(err, memory.ErrNotOwned) {
			return sessions.Session{}, err
		}
		// Moved or ended meanwhile: route finds where.
	case held:
		static, fromCopy, req.StaticDigest = st, true, digest[:]
	default:
		if e, ok := s.statics.get(id); ok {
			static, req.StaticDigest = e.sess, e.digest
		}
	}
	resp, err := s.route(ctx, req)
	switch {
	case errors.Is(err, sessions.ErrStaleStatic), errors.Is(err, sessions.ErrNotFound):
		s.statics.remove(id)
		if fromCopy && errors.Is(err, sessions.ErrStaleStatic) {
			s.local.RemoveCopy(id) // of an earlier session under this ID
		}
		return sessions.Session{}, err
	case err != nil:
		return sessions.Session{}, err
	case req.StaticDigest != nil:
		return withStatic(fromWire(resp.Session), static), nil
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
	s.statics.remove(id)
	_, err := s.route(ctx, &peerRequest{Op: opDelete, ID: id})
	if errors.Is(err, sessions.ErrNotFound) {
		return nil
	}
	return err
}
