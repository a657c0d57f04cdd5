package memory

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/storetest"
)

// Entries whose IDs share a hash are chained: every one is found, and
// removing any of them, first, middle or last of its chain, leaves the
// others found. Checked against a map, with every ID on one of three
// hashes, through random adds, removes and a compaction.
func TestTableChains(t *testing.T) {
	tb := newTable()
	tb.hash = func(id string) uint64 { return uint64(len(id) % 3) }
	want := map[string]string{} // ID → secret
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(when string) {
		t.Helper()
		if tb.len() != len(want) {
			t.Fatalf("%s: len %d, want %d", when, tb.len(), len(want))
		}
		for id, secret := range want {
			e := tb.get(id)
			if e == nil || e.session().Secret != secret {
				t.Fatalf("%s: %s not found or wrong", when, id)
			}
		}
		seen := 0
		tb.each(func(e *entry) {
			if _, ok := want[e.id()]; !ok {
				t.Fatalf("%s: each gave %s, which was removed", when, e.id())
			}
			seen++
		})
		if seen != len(want) {
			t.Fatalf("%s: each gave %d entries, want %d", when, seen, len(want))
		}
	}
	for i := 0; i < 5000; i++ {
		id := "s" + strconv.Itoa(rng.IntN(300))
		if _, held := want[id]; held {
			tb.remove(tb.get(id))
			delete(want, id)
		} else {
			secret := fmt.Sprint(i)
			tb.add(sessions.Session{ID: id, Secret: secret})
			want[id] = secret
		}
		if tb.get("absent") != nil {
			t.Fatal("found an ID never added")
		}
	}
	check("after adds and removes")
	if len(tb.chunks) != (len(want)+len(tb.free)+chunkSize-1)/chunkSize {
		t.Fatalf("%d chunks for %d entries and %d free positions", len(tb.chunks), len(want), len(tb.free))
	}
	tb = tb.compacted()
	check("after compaction")
	if len(tb.free) != 0 {
		t.Fatalf("%d free positions after compaction", len(tb.free))
	}
}

// Every field of a session comes back from its entry, times in UTC.
func TestEntryRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 24, 10, 0, 0, 123, time.FixedZone("x", 3600))
	in := sessions.Session{ID: "id", ClusterID: "cluster", Secret: "secret", CreatedAt: at,
		ExpiresAt: at.Add(time.Hour), CallbackURL: "http://127.0.0.1:1/cb", CallbackSessionID: "cs",
		State: sessions.StateDenied, Response: []byte("r"), DenyReason: "no",
		DeliveredAt: at.Add(time.Minute), LastPollAt: at.Add(time.Second)}
	tb := newTable()
	out := tb.add(in).session()
	if fmt.Sprint(out) != fmt.Sprint(withUTC(in)) {
		t.Fatalf("round trip:\n%+v\nwant\n%+v", out, withUTC(in))
	}
	if st := tb.get("id").static(); fmt.Sprint(st) != fmt.Sprint(withUTC(in).StaticPart()) {
		t.Fatalf("static part: %+v", st)
	}
	empty := tb.add(sessions.Session{ID: "e"}).session()
	if !empty.CreatedAt.IsZero() || !empty.LastPollAt.IsZero() || empty.CallbackURL != "" {
		t.Fatalf("zero fields: %+v", empty)
	}
}

func withUTC(s sessions.Session) sessions.Session {
	for _, p := range []*time.Time{&s.CreatedAt, &s.ExpiresAt, &s.DeliveredAt, &s.LastPollAt} {
		*p = p.UTC()
	}
	return s
}

// A Wait woken by its session's removal, when another session took the
// same position and ID before it ran again, answers ErrNotFound: a
// position is reused, the session is not the one waited for.
func TestWaitNotFooledByAReusedPosition(t *testing.T) {
	st, clock := storesWithSession(t, 1)
	s := st[0]
	ctx := context.Background()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Wait(ctx, "s")
		errc <- err
	}()
	for waiting := false; !waiting; {
		time.Sleep(time.Millisecond)
		s.mu.Lock()
		waiting = s.t.get("s").done != nil
		s.mu.Unlock()
	}
	s.mu.Lock()
	old := s.t.get("s")
	s.dropLocked(old)
	again := s.t.add(newSession("s", clock.Now(), time.Hour))
	s.mu.Unlock()
	if again != old {
		t.Fatal("test setup: the new session did not take the removed one's position")
	}
	if err := <-errc; !errors.Is(err, sessions.ErrNotFound) {
		t.Fatalf("Wait: %v, want ErrNotFound", err)
	}
}

// TestTableKeepsTheHeapFlat measures what the collector has to trace per
// held session: a store of 20,000 sessions with used nonces is about two
// heap objects a session (its fixed strings, its nonce set), where a map
// of pointers to entries with their own strings made six or more.
func TestTableKeepsTheHeapFlat(t *testing.T) {
	const n = 20000
	clock := storetest.NewClock(storetest.Start)
	s := New(sessions.Limits{MaxSessions: n}, clock.Now)
	defer s.Close()
	ctx := context.Background()
	before := heapObjects()
	for i := 0; i < n; i++ {
		sess := newSession(fmt.Sprintf("session-%07d", i), clock.Now(), time.Hour)
		// Strings of their own, as sessions made by a request have.
		sess.ClusterID, sess.Secret = fmt.Sprint("cluster-", i), fmt.Sprint("secret-", i)
		if err := s.Create(ctx, sess); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 3; j++ {
			if err := s.UseNonce(ctx, sess.ID, fmt.Sprint(i, "-", j)); err != nil {
				t.Fatal(err)
			}
		}
	}
	perSession := float64(heapObjects()-before) / n
	t.Logf("%.2f heap objects per session", perSession)
	if perSession > 2.5 {
		t.Fatalf("%.2f heap objects per held session, want at most 2.5", perSession)
	}
	runtime.KeepAlive(s)
}

func heapObjects() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapObjects)
}

// TestStaticDigestKeepsItsForm: replicas of different versions compare
// digests (a poll's static check), so the form must not change.
func TestStaticDigestKeepsItsForm(t *testing.T) {
	s := sessions.Session{ID: "gIwYVk68a15BcN0GhjeAbWsFWbI", ClusterID: "c-1", Secret: "s3cr3t",
		CreatedAt: time.Unix(1764000000, 123456789), CallbackURL: "http://127.0.0.1:8080/callback", CallbackSessionID: "cb-7"}
	d := StaticDigest(s)
	if got, want := hex.EncodeToString(d[:]), "cc8d2463582e61ccd006de7f9c5091ff"; got != want {
		t.Fatalf("StaticDigest = %s, want %s", got, want)
	}
	changed := s
	changed.CallbackSessionID = "cb-8"
	if StaticDigest(changed) == d {
		t.Fatal("a changed callback session ID kept the digest")
	}
	st := New(sessions.DefaultLimits, nil)
	defer st.Close()
	s.ExpiresAt = time.Now().Add(time.Hour)
	if err := st.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if _, held, owned, ok := st.StaticOf(s.ID); !ok || !owned || held != d {
		t.Fatalf("StaticOf = %x owned %v ok %v, want %x owned", held, owned, ok, d)
	}
}

// A poll checked with another session's fixed fields changes nothing:
// its nonce stays fresh for the right one.
func TestRecordPollCheckedRefusesAnotherStatic(t *testing.T) {
	ctx := context.Background()
	st := New(sessions.DefaultLimits, nil)
	defer st.Close()
	s := sessions.Session{ID: "s", Secret: "new", CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}
	if err := st.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	old := s
	old.Secret = "old"
	stale := StaticDigest(old)
	for _, d := range [][]byte{stale[:], nil, {1, 2, 3}} {
		if _, err := st.RecordPollChecked(ctx, "s", "n", 0, 1, d); !errors.Is(err, sessions.ErrStaleStatic) {
			t.Fatalf("digest %x: err = %v, want ErrStaleStatic", d, err)
		}
	}
	d := StaticDigest(s)
	got, err := st.RecordPollChecked(ctx, "s", "n", 0, 1, d[:])
	if err != nil || got.LastPollAt.IsZero() {
		t.Fatalf("matching digest: %v, last poll %v", err, got.LastPollAt)
	}
	if _, err := st.RecordPollChecked(ctx, "s", "n", 0, 2, d[:]); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("the nonce again: err = %v, want ErrNonceUsed", err)
	}
}
