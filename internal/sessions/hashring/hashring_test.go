package hashring

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/storetest"
)

var testKey = bytes.Repeat([]byte("k"), 32)

// replica is one Store with its peer server on a real loopback listener.
type replica struct {
	*Store
	url string
	srv *http.Server
}

// stop closes the replica's peer server and its store, as a crash
// (SIGKILL) would: the replica is gone for the others, and sends nothing
// any more.
func (r *replica) stop() {
	r.srv.Close()
	r.Store.Close()
}

func startReplica(t testing.TB, limits sessions.Limits, clock func() time.Time, opts Options) *replica {
	t.Helper()
	return startReplicaServing(t, limits, clock, opts, nil)
}

// startReplicaServing is startReplica with the peer handler wrapped by
// wrap (nil: as it is).
func startReplicaServing(t testing.TB, limits sessions.Limits, clock func() time.Time, opts Options, wrap func(http.Handler) http.Handler) *replica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	opts.Self = url
	if opts.Key == nil {
		opts.Key = testKey
	}
	opts.Limits, opts.Clock = limits, clock
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.PeerTimeout == 0 {
		// Well above a loopback round trip even on a loaded machine
		// under the race detector: a timeout here is a "slow" replica.
		opts.PeerTimeout = 3 * time.Second
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	h := s.PeerHandler()
	if wrap != nil {
		h = wrap(h)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() {
		srv.Close()
		s.Close()
	})
	return &replica{Store: s, url: url, srv: srv}
}

// startRing starts n replicas that know each other and joined the ring.
func startRing(t testing.TB, n int, limits sessions.Limits, clock func() time.Time) []*replica {
	t.Helper()
	rs := make([]*replica, n)
	for i := range rs {
		rs[i] = startReplica(t, limits, clock, Options{})
	}
	joinRing(t, rs)
	return rs
}

// joinRing gives every replica of rs the others as candidates and joins
// those that have not joined yet, one after the other, as replicas
// starting with static --peers do; then every replica's ring is the same.
func joinRing(t testing.TB, rs []*replica) {
	t.Helper()
	var urls []string
	for _, r := range rs {
		urls = append(urls, r.url)
	}
	for _, r := range rs {
		r.SetPeers(urls)
	}
	for _, r := range rs {
		if r.Ready() != nil {
			if err := r.Join(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, r := range rs {
		if got := r.Members(); !slices.Equal(got, rs[0].Members()) || len(got) != len(rs) {
			t.Fatalf("rings differ after the join: %v and %v", got, rs[0].Members())
		}
	}
}

// spread sends each call to the next replica in turn, as a load balancer
// without sticky routing would: any replica answers any request. Only a
// RecordPoll that follows a Static of the same session goes to the
// replica that answered the Static, as the poll handler makes both calls
// on the replica the poll reached.
type spread struct {
	rs   []*replica
	next atomic.Uint32

	mu         sync.Mutex
	lastStatic map[string]*Store
}

func (s *spread) pick() *Store { return s.rs[int(s.next.Add(1))%len(s.rs)].Store }

func (s *spread) Create(ctx context.Context, sess sessions.Session) error {
	return s.pick().Create(ctx, sess)
}
func (s *spread) Get(ctx context.Context, id string) (sessions.Session, error) {
	return s.pick().Get(ctx, id)
}
func (s *spread) UseNonce(ctx context.Context, id, nonce string) error {
	return s.pick().UseNonce(ctx, id, nonce)
}
func (s *spread) Static(ctx context.Context, id string) (sessions.Session, error) {
	r := s.pick()
	s.mu.Lock()
	if s.lastStatic == nil {
		s.lastStatic = map[string]*Store{}
	}
	s.lastStatic[id] = r
	s.mu.Unlock()
	return r.Static(ctx, id)
}
func (s *spread) RecordPoll(ctx context.Context, id, nonce string, d time.Duration) (sessions.Session, error) {
	s.mu.Lock()
	r := s.lastStatic[id]
	delete(s.lastStatic, id)
	s.mu.Unlock()
	if r == nil {
		r = s.pick()
	}
	return r.RecordPoll(ctx, id, nonce, d)
}
func (s *spread) Complete(ctx context.Context, id string, response []byte) error {
	return s.pick().Complete(ctx, id, response)
}
func (s *spread) Deny(ctx context.Context, id, reason string) error {
	return s.pick().Deny(ctx, id, reason)
}
func (s *spread) Delete(ctx context.Context, id string) error { return s.pick().Delete(ctx, id) }
func (s *spread) Wait(ctx context.Context, id string) (sessions.Session, error) {
	return s.pick().Wait(ctx, id)
}

// TestConformance runs the shared suite against a ring of three replicas
// on loopback, each call going to another replica.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, limits sessions.Limits, clock *storetest.Clock) sessions.Store {
		return &spread{rs: startRing(t, 3, limits, clock.Now)}
	})
}

// TestConformanceOneReplica runs the suite against each replica of the
// ring directly, so that owner and non-owner paths both meet every rule.
func TestConformanceEachReplica(t *testing.T) {
	for i := 0; i < 3; i++ {
		storetest.Run(t, func(t *testing.T, limits sessions.Limits, clock *storetest.Clock) sessions.Store {
			return startRing(t, 3, limits, clock.Now)[i].Store
		})
	}
}
