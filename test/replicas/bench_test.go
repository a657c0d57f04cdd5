package replicas

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/hmac"
	"github.com/kbprovider/backend/internal/httpapi"
	"github.com/kbprovider/backend/internal/ids"
	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/hashring"
)

// benchReplica is one replica in this process: the real router over a
// hashring Store, its public API and its peer API each on a loopback HTTP
// server.
type benchReplica struct {
	store  *hashring.Store
	self   string // peer URL
	public *httptest.Server
}

// benchClock is a clock the benchmark advances, so every session is polled
// exactly once per poll interval however fast the loop runs.
type benchClock struct{ ns atomic.Int64 }

func (c *benchClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *benchClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func startBenchRing(b *testing.B, clock *benchClock, ext *url.URL) []*benchReplica {
	b.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	discard := slog.New(slog.DiscardHandler)
	var reps []*benchReplica
	var peers []string
	for i := 0; i < 2; i++ {
		peer := httptest.NewUnstartedServer(nil)
		self := "http://" + peer.Listener.Addr().String()
		store, err := hashring.New(hashring.Options{Self: self, Key: key, Clock: clock.now, Logger: discard,
			Limits: sessions.Limits{MaxSessions: 1 << 20}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(store.Close)
		peer.Config.Handler = store.PeerHandler()
		peer.Start()
		b.Cleanup(peer.Close)
		router, err := httpapi.New(httpapi.Config{
			ExternalURL: ext, PollInterval: 2 * time.Second, SessionTTL: 100000 * time.Hour,
			Store: store, Logger: discard, Metrics: prometheus.NewRegistry(), Now: clock.now,
		})
		if err != nil {
			b.Fatal(err)
		}
		public := httptest.NewServer(router)
		b.Cleanup(public.Close)
		reps = append(reps, &benchReplica{store: store, self: self, public: public})
		peers = append(peers, self)
	}
	for _, r := range reps {
		r.store.SetPeers(peers)
	}
	for _, r := range reps {
		if err := r.store.Join(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	return reps
}

// benchmarkPollOverHTTP: signed polls of pending sessions owned by replica
// 0, sent over loopback HTTP to the router of replica 0 (the owner) or 1
// (a non-owner, which forwards to the owner over the sealed peer API),
// answered 403 authorization_pending. Requests are signed outside the
// timer, in batches. Allocations count everything in this process: the
// client, the public server, and on the non-owner path the peer client and
// the owner's peer server.
func benchmarkPollOverHTTP(b *testing.B, viaOwner bool) {
	clock := &benchClock{}
	clock.ns.Store(time.Now().UnixNano())
	ext, _ := url.Parse("https://bind.example.com")
	reps := startBenchRing(b, clock, ext)
	via := reps[1]
	if viaOwner {
		via = reps[0]
	}
	owner, self := reps[0].store, reps[0].self
	// Polls go round-robin over k sessions, each polled once per interval
	// and at most perSession times (the store bounds nonces per session).
	const k, perSession, batch = 200, 1000, 2000
	type sess struct{ id, secret string }
	var all []sess
	newSession := func() sess {
		for {
			now := clock.now()
			s := sessions.Session{ID: ids.NewSessionID(), ClusterID: ids.NewClusterID(), Secret: ids.NewSessionSecret(),
				CreatedAt: now, ExpiresAt: now.Add(100000 * time.Hour)}
			if owner.Owner(s.ID) != self {
				continue
			}
			if err := owner.Create(context.Background(), s); err != nil {
				b.Fatal(err)
			}
			return sess{s.ID, s.Secret}
		}
	}
	pollURL, _ := url.Parse(ext.String() + "/poll")
	target, _ := url.Parse(via.public.URL)
	urls := make([]string, 0, batch)
	prepare := func(from, n int) {
		urls = urls[:0]
		for i := from; i < from+n; i++ {
			idx := i/(k*perSession)*k + i%k
			for idx >= len(all) {
				all = append(all, newSession())
			}
			u, err := hmac.SignURL(all[idx].secret, all[idx].id, http.MethodGet, pollURL, nil)
			if err != nil {
				b.Fatal(err)
			}
			u.Scheme, u.Host = target.Scheme, target.Host
			urls = append(urls, u.String())
		}
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	b.Cleanup(client.CloseIdleConnections)
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(batch, b.N-done)
		b.StopTimer()
		prepare(done, n)
		b.StartTimer()
		for _, u := range urls {
			clock.advance(2 * time.Second / k)
			resp, err := client.Get(u)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				b.Fatalf("poll answered %d, want 403 authorization_pending", resp.StatusCode)
			}
		}
		done += n
	}
}

func BenchmarkPollOverHTTPOnOwner(b *testing.B)    { benchmarkPollOverHTTP(b, true) }
func BenchmarkPollOverHTTPOnNonOwner(b *testing.B) { benchmarkPollOverHTTP(b, false) }
