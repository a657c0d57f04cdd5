// Package ring is a sessions.Store decorator that places each session on
// one replica, its owner, by consistent hashing of the session ID over the
// peer URLs (groupcache's consistenthash, as its HTTPPool places keys).
//
// A replica decides a poll from what its inner store holds in memory
// (sessions.Peeker.Peek): pending, denied, completed, with no request to
// anyone. Only a completed outcome's response is read from the database,
// through a groupcache Group keyed by the session and its record: the
// owner reads it once however many replicas ask at once, and keeps it,
// since a record never changes; a replica asks only for a record its own
// memory holds and that is before its collection time, so a response
// left in a cache after its record was collected is never served. Polls
// are admitted by the owner, whose inner store keeps their pace and
// nonces in its memory. Everything else goes to the inner store, which
// every replica shares. An owner that cannot answer within the peer
// timeout is not waited for: the asking replica reads itself.
package ring

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang/groupcache"
	"github.com/golang/groupcache/consistenthash"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
)

// Options configure a Store.
type Options struct {
	// Self is this replica's peer base URL, https://host:port, spelled as
	// the other replicas list it.
	Self string
	// Keys are the peer keys every replica shares, the current one
	// first, each at least 32 bytes. The current key's CA signs this
	// replica's certificate; every key's CA is trusted. A rotation without
	// fallbacks rolls out [old, new] first, then [new, old].
	Keys [][]byte
	// Inner is the store every replica shares.
	Inner sessions.Peeker
	// PeerTimeout bounds each request to a peer (default 1s).
	PeerTimeout time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Now is this replica's clock (default time.Now). No decision
	// compares it with another replica's: the owner's inner store judges
	// pace and expiry on its own clock.
	Now func() time.Time
}

const (
	// wireGroup is the group name on the wire (groupcache's path).
	wireGroup = "kb-outcomes"
	// cacheBytes bounds the responses a replica caches (they hold live
	// credentials until evicted, also after their records are collected).
	cacheBytes = 16 << 20
	// virtualNodes per member on the hash ring (HTTPPool's default).
	virtualNodes = 50
	// maxKeyLen bounds session IDs and nonces sent to peers.
	maxKeyLen = 256
	// maxGroupKeyLen bounds a group key: a record name (a UID), keySep
	// and a session ID.
	maxGroupKeyLen = 64 + 1 + maxKeyLen
	keySep         = ":"
	// warnEvery spaces the warnings about answering locally.
	warnEvery = 10 * time.Second
)

// errPending is returned by the outcome getter for a record that is gone
// (or a pending session), so that groupcache caches nothing for it.
var errPending = errors.New("ring: session pending")

// Store is a sessions.Store placing sessions on replicas. Safe for
// concurrent use. What it does not override (Complete, Deny, Deliver,
// UseOnce) goes straight to the inner store.
type Store struct {
	inner
	self    string
	timeout time.Duration
	log     *slog.Logger
	now     func() time.Time

	group     *groupcache.Group
	place     atomic.Pointer[placement]
	serverTLS *tls.Config
	transport *http.Transport
	server    *http.Server

	fallbacks map[string]*atomic.Int64 // by reason, FallbackReasons
	lastWarn  atomic.Int64             // UnixNano
}

type placement struct {
	hash    *consistenthash.Map
	peers   map[string]*peer
	members []string
}

// inner names the embedded store without exporting it.
type inner = sessions.Peeker

var _ sessions.Store = (*Store)(nil)

// groupcache keeps one registry per process: a group name may be taken
// once, one peer picker is registered once, and an HTTPPool may be made
// once (with one self URL), so HTTPPool is not used: the peer requests
// and the handler are this package's. Every Store gets a group of its own
// under a process-unique name, so that its cache and in-flight loads are
// its own (with a shared group, a replica serving a peer's request would
// join the very load that sent it, in tests of several replicas in one
// process). The picker, registered once, finds the Store by its group's
// name. That name never goes on the wire: peers ask for wireGroup and
// each Store's Handler serves from its own group. A Store stays
// registered for the life of the process, and nothing else in the
// process may register a groupcache peer picker.
var (
	registerOnce sync.Once
	registryMu   sync.Mutex
	registry     = map[string]*Store{}
)

func pickerFor(name string) groupcache.PeerPicker {
	registryMu.Lock()
	defer registryMu.Unlock()
	if s := registry[name]; s != nil {
		return s
	}
	return groupcache.NoPeers{}
}

// New returns a Store alone in its ring until SetPeers.
func New(opts Options) (*Store, error) {
	if err := checkPeerURL(opts.Self); err != nil {
		return nil, fmt.Errorf("ring: Self: %w", err)
	}
	if len(opts.Keys) == 0 || slices.ContainsFunc(opts.Keys, func(k []byte) bool { return len(k) < sessionkey.MinKeyLen }) {
		return nil, fmt.Errorf("ring: want peer keys of at least %d bytes", sessionkey.MinKeyLen)
	}
	if opts.Inner == nil || opts.PeerTimeout < 0 {
		return nil, errors.New("ring: no inner store, or a negative peer timeout")
	}
	s := &Store{inner: opts.Inner, self: opts.Self, timeout: cmp.Or(opts.PeerTimeout, time.Second), log: cmp.Or(opts.Logger, slog.Default()),
		now: opts.Now, fallbacks: map[string]*atomic.Int64{}}
	if s.now == nil {
		s.now = time.Now
	}
	for _, r := range FallbackReasons {
		s.fallbacks[r] = new(atomic.Int64)
	}
	if err := s.setupTLS(opts.Keys, s.now()); err != nil {
		return nil, err
	}
	s.place.Store(&placement{hash: consistenthash.New(virtualNodes, nil)})

	registerOnce.Do(func() { groupcache.RegisterPerGroupPeerPicker(pickerFor) })
	registryMu.Lock()
	name := fmt.Sprintf("%s-%d", wireGroup, len(registry))
	registry[name] = s
	registryMu.Unlock()
	s.group = groupcache.NewGroup(name, cacheBytes, groupcache.GetterFunc(s.load))
	return s, nil
}

func checkPeerURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.Port() == "" || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q is not https://host:port", raw)
	}
	return nil
}

// SetPeers makes urls (every replica's peer base URL, Self included) the
// members of the ring. Invalid URLs are left out.
func (s *Store) SetPeers(urls []string) {
	p := &placement{hash: consistenthash.New(virtualNodes, nil), peers: map[string]*peer{}}
	for _, u := range urls {
		if err := checkPeerURL(u); err != nil {
			s.log.Warn("ignoring an invalid peer URL", "error", err)
			continue
		}
		if _, dup := p.peers[u]; !dup {
			p.peers[u] = &peer{s: s, base: u}
			p.members = append(p.members, u)
		}
	}
	slices.Sort(p.members)
	p.hash.Add(p.members...)
	s.place.Store(p)
}

// Members returns the ring's members, sorted.
func (s *Store) Members() []string { return slices.Clone(s.place.Load().members) }

// PickPeer implements groupcache.PeerPicker: the owner of key's session
// unless it is this replica (or the ring is empty).
func (s *Store) PickPeer(key string) (groupcache.ProtoGetter, bool) {
	_, id, _ := strings.Cut(key, keySep)
	if p := s.owner(id); p != nil {
		return p, true
	}
	return nil, false
}

// owner returns the peer owning id, nil when that is this replica.
func (s *Store) owner(id string) *peer {
	p := s.place.Load()
	if len(p.members) == 0 {
		return nil
	}
	if o := p.hash.Get(id); o != s.self {
		return p.peers[o]
	}
	return nil
}

// PeerFallbacks returns how many peer requests failed and were answered
// from the inner store by this replica.
func (s *Store) PeerFallbacks() int64 {
	var n int64
	for _, c := range s.fallbacks {
		n += c.Load()
	}
	return n
}

// PeerFallbacksByReason returns PeerFallbacks for one of FallbackReasons.
func (s *Store) PeerFallbacksByReason(reason string) int64 {
	if c := s.fallbacks[reason]; c != nil {
		return c.Load()
	}
	return 0
}

// fellBack counts a peer request answered locally, and warns, naming
// what happened, at most every warnEvery.
func (s *Store) fellBack(ctx context.Context, peer string, err error) {
	if ctx.Err() != nil {
		return // the caller gave up: no fault of the peer
	}
	reason := reasonAnswer
	var u *unreachableError
	if errors.As(err, &u) {
		reason = u.reason
	}
	n := s.fallbacks[reason].Add(1)
	msg := fallbackMessages[reason]
	now, last := s.now().UnixNano(), s.lastWarn.Load()
	if now-last >= int64(warnEvery) && s.lastWarn.CompareAndSwap(last, now) {
		s.log.Warn(msg, "peer", peer, "reason", reason, "error", err, "fallbacks", n)
		return
	}
	s.log.Debug(msg, "peer", peer, "reason", reason, "error", err)
}

var fallbackMessages = map[string]string{
	reasonTimeout:     "session owner did not answer within the peer timeout; answering locally",
	reasonUnreachable: "session owner unreachable; answering locally",
	reasonRefusedTLS:  "session owner's TLS handshake failed (another peer key?); answering locally",
	reasonVersion:     "session owner runs another version; answering locally",
	reasonAnswer:      "session owner answered with an error; reading locally",
}

// loadState travels with a load through groupcache, which hands the
// caller's context to both the peer request and the local getter.
type loadState struct {
	fromPeer     bool // a peer asked: load here, never forward
	ownerPending bool // the owner said pending: do not read again
}

type loadStateKey struct{}

func stateOf(ctx context.Context) *loadState {
	if st, ok := ctx.Value(loadStateKey{}).(*loadState); ok {
		return st
	}
	return &loadState{}
}

// Outcome implements sessions.Store: pending and denied from this
// replica's memory, a completed outcome's response through the group.
func (s *Store) Outcome(ctx context.Context, id string) (sessions.Outcome, error) {
	o, rec, err := s.inner.Peek(ctx, id)
	if err != nil || rec == "" {
		return o, err
	}
	return s.read(ctx, id, rec, o)
}

// Wait implements sessions.Store as Outcome does.
func (s *Store) Wait(ctx context.Context, id string) (sessions.Outcome, error) {
	o, rec, err := s.inner.WaitPeek(ctx, id)
	if err != nil || rec == "" {
		return o, err
	}
	return s.read(ctx, id, rec, o)
}

// read reads the outcome in record rec of session id through the group:
// its owner reads it from the inner store once (or this replica, when the
// owner cannot answer) and caches it. peeked is what Peek returned with
// rec: its namespace stands in for one the owner did not send (an owner
// of a version that sends none, during a rolling update).
func (s *Store) read(ctx context.Context, id, rec string, peeked sessions.Outcome) (sessions.Outcome, error) {
	var b []byte
	ctx = context.WithValue(ctx, loadStateKey{}, &loadState{})
	switch err := s.group.Get(ctx, rec+keySep+id, groupcache.AllocatingByteSliceSink(&b)); {
	case errors.Is(err, errPending):
		return sessions.Outcome{}, nil // collected meanwhile
	case err != nil:
		return sessions.Outcome{}, err
	}
	o, err := decodeOutcome(b)
	if err == nil && o.State == sessions.StateCompleted && o.Namespace == "" {
		o.Namespace = peeked.Namespace
	}
	return o, err
}

// load is the group's getter: it reads the inner store.
func (s *Store) load(ctx context.Context, key string, dest groupcache.Sink) error {
	if stateOf(ctx).ownerPending {
		return errPending
	}
	rec, id, ok := strings.Cut(key, keySep)
	if !ok || rec == "" {
		return errors.New("ring: malformed outcome key")
	}
	o, err := s.inner.ReadOutcome(ctx, id, rec)
	if err != nil {
		return err
	}
	if o.State == sessions.StatePending {
		return errPending
	}
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	return dest.SetBytes(b)
}

// decodeOutcome decodes an outcome as load encodes it (json.Marshal of a
// sessions.Outcome), strictly: also what a peer sends.
func decodeOutcome(b []byte) (sessions.Outcome, error) {
	var o sessions.Outcome
	if err := decodeStrict(b, &o); err != nil {
		return o, fmt.Errorf("ring: decoding an outcome: %w", err)
	}
	if o.State != sessions.StateCompleted && o.State != sessions.StateDenied {
		return sessions.Outcome{}, fmt.Errorf("ring: cached outcome in state %v", o.State)
	}
	return o, nil
}

// AdmitPoll implements sessions.Store: the owner admits, or this replica
// when the owner cannot be asked (unreachable, silent past the peer
// timeout, refusing the handshake, of another version). An owner that
// answers without a decision is not decided for: ErrUnavailable.
func (s *Store) AdmitPoll(ctx context.Context, id, nonce string, expires time.Time, minInterval time.Duration) error {
	if p := s.owner(id); p != nil {
		answer, err := p.admit(ctx, admitRequest{ID: id, Nonce: nonce, Expires: expires.UnixNano(), MinInterval: int64(minInterval)})
		var u *unreachableError
		switch {
		case err == nil:
			return answer
		case ctx.Err() != nil:
			return ctx.Err()
		case !errors.As(err, &u):
			s.log.Warn("session owner could not admit a poll", "peer", p.base, "error", err)
			return fmt.Errorf("%w: the session's owner could not admit the poll: %v", sessions.ErrUnavailable, err)
		}
		s.fellBack(ctx, p.base, err)
	}
	return s.inner.AdmitPoll(ctx, id, nonce, expires, minInterval)
}
