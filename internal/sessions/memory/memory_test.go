package memory

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, limits sessions.Limits, clock *storetest.Clock) sessions.Store {
		s := New(limits, clock.Now)
		t.Cleanup(s.Close)
		return s
	})
}

func newSession(id string, now time.Time, ttl time.Duration) sessions.Session {
	return sessions.Session{ID: id, ClusterID: "c", Secret: "s", CreatedAt: now, ExpiresAt: now.Add(ttl)}
}

// The suite allows a store of several parts to take more than MaxSessions;
// one memory store takes exactly MaxSessions.
func TestExactlyMaxSessions(t *testing.T) {
	clock := storetest.NewClock(storetest.Start)
	s := New(sessions.Limits{MaxSessions: 5}, clock.Now)
	defer s.Close()
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		if err := s.Create(ctx, newSession(strconv.Itoa(i), clock.Now(), time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	// One short-lived session among live ones: once it expires, exactly
	// its slot is free again.
	if err := s.Create(ctx, newSession("short", clock.Now(), time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, newSession("x", clock.Now(), time.Hour)); !errors.Is(err, sessions.ErrFull) {
		t.Fatalf("sixth Create: %v, want ErrFull", err)
	}
	clock.Advance(2 * time.Minute)
	if err := s.Create(ctx, newSession("x", clock.Now(), time.Hour)); err != nil {
		t.Fatalf("Create after one expired: %v", err)
	}
	if err := s.Create(ctx, newSession("y", clock.Now(), time.Hour)); !errors.Is(err, sessions.ErrFull) {
		t.Fatalf("Create when full again: %v, want ErrFull", err)
	}
}

func TestZeroLimitsTakeDefaults(t *testing.T) {
	s := New(sessions.Limits{}, nil)
	defer s.Close()
	if s.Limits() != sessions.DefaultLimits {
		t.Fatalf("limits = %+v, want %+v", s.Limits(), sessions.DefaultLimits)
	}
}

// TestJanitorReclaims shows that expired sessions leave the map without
// anybody touching them.
func TestJanitorReclaims(t *testing.T) {
	clock := storetest.NewClock(storetest.Start)
	s := newStore(sessions.Limits{}, clock.Now, 5*time.Millisecond)
	defer s.Close()
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		if err := s.Create(ctx, newSession(strconv.Itoa(i), clock.Now(), time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Create(ctx, newSession("long", clock.Now(), time.Hour)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if n := s.Len(); n != 101 {
		t.Fatalf("janitor dropped live sessions: %d left, want 101", n)
	}
	clock.Advance(time.Minute)
	deadline := time.Now().Add(5 * time.Second)
	for s.Len() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("janitor left %d sessions after they expired, want 1", s.Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMemoryReclaimed fills the store to its limit with sessions that used
// many nonces and carry responses, lets them expire, and checks that the
// heap goes back to near where it started.
func TestMemoryReclaimed(t *testing.T) {
	const (
		n      = 2000
		nonces = 64
		resp   = 2048
	)
	clock := storetest.NewClock(storetest.Start)
	s := New(sessions.Limits{MaxSessions: n, MaxNoncesPerSession: nonces, MaxResponseBytes: resp}, clock.Now)
	defer s.Close()
	ctx := context.Background()
	before := heapInUse()
	body := make([]byte, resp)
	for i := 0; i < n; i++ {
		id := "session-" + strconv.Itoa(i)
		if err := s.Create(ctx, newSession(id, clock.Now(), time.Minute)); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < nonces; j++ {
			if err := s.UseNonce(ctx, id, fmt.Sprintf("nonce-%d-%d", i, j)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Complete(ctx, id, body); err != nil {
			t.Fatal(err)
		}
	}
	full := heapInUse()
	grown := full - before
	if grown < n*resp {
		t.Fatalf("test setup: heap grew only %d bytes for %d sessions", grown, n)
	}
	clock.Advance(2 * time.Minute)
	s.Sweep()
	after := heapInUse()
	if s.Len() != 0 {
		t.Fatalf("%d sessions left after expiry", s.Len())
	}
	// Everything but a little noise must be given back.
	if kept := after - before; kept > grown/10 {
		t.Fatalf("heap: %d before, %d full, %d after expiry: kept %d of %d bytes", before, full, after, kept, grown)
	}
	t.Logf("heap: %d before, %d full (+%d), %d after expiry", before, full, grown, after)
	runtime.KeepAlive(s)
}

func heapInUse() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func TestCloseTwice(t *testing.T) {
	s := New(sessions.Limits{}, nil)
	s.Close()
	s.Close()
	// Still usable, with lazy expiry.
	if err := s.Create(context.Background(), newSession("a", time.Now(), time.Minute)); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkCreate(b *testing.B) {
	s := New(sessions.Limits{MaxSessions: 1 << 30}, nil)
	defer s.Close()
	ctx := context.Background()
	now := time.Now()
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = "session-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.Create(ctx, newSession(ids[i], now, time.Hour)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRecordPoll polls sessions up to the default nonce bound each,
// as a client polling every 2s through a 10-minute session would.
func BenchmarkRecordPoll(b *testing.B) {
	const perSession = 300
	s := New(sessions.Limits{MaxSessions: 1 << 30}, nil)
	defer s.Close()
	ctx := context.Background()
	ids := make([]string, b.N/perSession+1)
	for i := range ids {
		ids[i] = "session-" + strconv.Itoa(i)
		if err := s.Create(ctx, newSession(ids[i], time.Now(), time.Hour)); err != nil {
			b.Fatal(err)
		}
	}
	nonces := make([]string, b.N)
	for i := range nonces {
		nonces[i] = "nonce-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.RecordPoll(ctx, ids[i/perSession], nonces[i], 0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRecordPollParallel polls many sessions from all CPUs: the
// contention a busy replica sees.
func BenchmarkRecordPollParallel(b *testing.B) {
	s := New(sessions.Limits{MaxNoncesPerSession: 1 << 30}, nil)
	defer s.Close()
	ctx := context.Background()
	const n = 1024
	for i := 0; i < n; i++ {
		if err := s.Create(ctx, newSession("session-"+strconv.Itoa(i), time.Now(), time.Hour)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	var worker atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		w := worker.Add(1)
		id := "session-" + strconv.Itoa(int(w)%n)
		// The nonce's string conversion is the one allocation per op here.
		nonce := make([]byte, 0, 32)
		for i := 0; pb.Next(); i++ {
			nonce = strconv.AppendInt(append(nonce[:0], 'n'), int64(i), 10)
			if _, err := s.RecordPoll(ctx, id, string(nonce), 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestNonceSetHeap measures the worst case the docs promise: a session
// whose set of used nonces is full (the default 1024) holds 8 bytes of
// live heap per nonce, 8 KiB, and the whole session well under 9 KiB.
func TestNonceSetHeap(t *testing.T) {
	const n = 500
	limit := sessions.DefaultLimits.MaxNoncesPerSession
	clock := storetest.NewClock(storetest.Start)
	s := New(sessions.Limits{MaxSessions: n}, clock.Now)
	defer s.Close()
	ctx := context.Background()
	ids := make([]string, n)
	empty := heapInUse()
	for i := range ids {
		// IDs and secrets of the real sizes.
		ids[i] = fmt.Sprintf("%027d", i)
		sess := newSession(ids[i], clock.Now(), time.Hour)
		sess.ClusterID, sess.Secret = fmt.Sprintf("%026d", i), fmt.Sprintf("%043d", i)
		if err := s.Create(ctx, sess); err != nil {
			t.Fatal(err)
		}
	}
	created := heapInUse()
	nonce := make([]byte, 0, 32)
	for i, id := range ids {
		for j := 0; j < limit; j++ {
			// 22 characters, as a 128-bit base64url nonce.
			nonce = strconv.AppendInt(append(nonce[:0], "nonce-"...), int64(i*limit+j), 10)
			for len(nonce) < 22 {
				nonce = append(nonce, 'x')
			}
			if err := s.UseNonce(ctx, id, string(nonce)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.UseNonce(ctx, id, "one-more-nonce-than-the-limit"); !errors.Is(err, sessions.ErrTooManyNonces) {
			t.Fatalf("nonce %d: %v, want ErrTooManyNonces", limit+1, err)
		}
	}
	full := heapInUse()
	perNonceSet := float64(full-created) / n
	perSession := float64(full-empty) / n
	t.Logf("live heap per session: %.0f bytes for a full set of %d nonces, %.0f bytes in all", perNonceSet, limit, perSession)
	if want := float64(8 * limit); perNonceSet > want*1.02 {
		t.Errorf("a full nonce set costs %.0f bytes of heap, want at most %.0f (8 bytes per nonce)", perNonceSet, want)
	}
	if perSession > 9<<10 {
		t.Errorf("a session with a full nonce set costs %.0f bytes of heap, want under 9 KiB", perSession)
	}
	runtime.KeepAlive(s)
}
