package kube

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/conformance"
	"github.com/kbprovider/backend/internal/sessions/ring"
	"github.com/kbprovider/backend/internal/testutil"
)

// outcomeGets counts a client's GETs of outcome records.
type outcomeGets struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c outcomeGets) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/kb-session-"+kindOutcome+"-") {
		c.n.Add(1)
	}
	return c.next.RoundTrip(r)
}

// startRing runs a ring replica over inner on a loopback listener, and
// returns it and its peer URL.
func startRing(t *testing.T, inner sessions.Peeker, key []byte) (*ring.Store, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	// A long peer timeout: the test counts reads, and a busy machine's
	// fallback would read twice.
	self := "https://" + ln.Addr().String()
	r, err := ring.New(ring.Options{Self: self, Keys: [][]byte{key}, Inner: inner,
		PeerTimeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	must(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return r, self
}

// TestRingReadsResponseOnce: two replicas, each a ring over a kube store.
// Many polls of a completed session on both read its response with one
// GET in all; denied and pending sessions make none; once the record is
// past its collection time, no replica serves the response, although the
// group's caches still hold it.
func TestRingReadsResponseOnce(t *testing.T) {
	e := newEnv(t)
	clock := testutil.ClockAt(conformance.Start)
	var gets atomic.Int64
	cfg := rest.CopyConfig(e.user)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return outcomeGets{rt, &gets} }
	ka := e.startStore(t, storeOpts{cfg: cfg, now: clock.Now})
	kb := e.startStore(t, storeOpts{cfg: rest.CopyConfig(cfg), now: clock.Now})
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	a, urlA := startRing(t, ka, key)
	b, urlB := startRing(t, kb, key)
	peers := []string{urlA, urlB}
	a.SetPeers(peers)
	b.SetPeers(peers)

	ctx := context.Background()
	exp := conformance.Start.Add(10 * time.Minute)
	resp := `{"kubeconfig":"credential"}`
	var ids []string
	for i := range 4 {
		id := "done-" + string(rune('a'+i))
		ids = append(ids, id)
		must(t, ka.Complete(ctx, id, exp, "kb-ns", []byte(resp)))
	}
	must(t, kb.Deny(ctx, "denied", exp, "no"))
	for _, id := range ids {
		shows(t, ka, id, sessions.StateCompleted)
		shows(t, kb, id, sessions.StateCompleted)
	}
	shows(t, ka, "denied", sessions.StateDenied)
	shows(t, kb, "denied", sessions.StateDenied)
	gets.Store(0)

	var wg sync.WaitGroup
	for range 8 {
		for _, r := range []*ring.Store{a, b} {
			wg.Go(func() {
				for _, id := range ids {
					if o, err := r.Outcome(ctx, id); err != nil || string(o.Response) != resp {
						t.Errorf("Outcome(%s): %+v, %v", id, o, err)
					}
				}
				if o, err := r.Outcome(ctx, "denied"); err != nil || o.State != sessions.StateDenied || o.DenyReason != "no" {
					t.Errorf("Outcome of a denial: %+v, %v", o, err)
				}
				if o, err := r.Outcome(ctx, "pending"); err != nil || o.State != sessions.StatePending {
					t.Errorf("Outcome of a pending session: %+v, %v", o, err)
				}
			})
		}
	}
	wg.Wait()
	if n := gets.Load(); n != int64(len(ids)) {
		t.Fatalf("%d GETs of outcome records for %d responses polled 16 times each, want one each", n, len(ids))
	}
	if a.PeerFallbacks()+b.PeerFallbacks() != 0 {
		t.Fatalf("%d fallbacks", a.PeerFallbacks()+b.PeerFallbacks())
	}

	// Past the collection time, before and after collection.
	clock.Advance(10*time.Minute + sessions.DefaultLimits.Grace + time.Second)
	notServed := func(when string) {
		t.Helper()
		for _, r := range []*ring.Store{a, b} {
			for _, id := range ids {
				if o, err := r.Outcome(ctx, id); err != nil || o.State != sessions.StatePending || o.Response != nil {
					t.Fatalf("%s: Outcome(%s) = %+v, %v; want pending", when, id, o, err)
				}
			}
		}
	}
	notServed("past the collection time")
	clock.Advance(time.Minute)
	ka.collect(ctx)
	testutil.Await(t, "both caches drop the collected records", func() bool {
		return len(ka.informer.GetStore().List()) == 0 && len(kb.informer.GetStore().List()) == 0
	})
	notServed("after collection")
	if n := gets.Load(); n != int64(len(ids)) {
		t.Fatalf("collected records were read: %d GETs", n-int64(len(ids)))
	}
}
