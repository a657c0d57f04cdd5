package memory

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/storetest"
)

// A record moves to another store with its nonces: a nonce used before the
// move is refused after it, and the copy serves nothing until promoted.
func TestExportImportKeepsNonces(t *testing.T) {
	ctx := context.Background()
	st, clock := storesWithSession(t, 2)
	a, b := st[0], st[1]
	if _, err := a.RecordPoll(ctx, "s", "n1", 0); err != nil {
		t.Fatal(err)
	}
	if err := a.UseNonce(ctx, "s", "n2"); err != nil {
		t.Fatal(err)
	}
	rec, owned, ok := a.Export("s")
	if !ok || !owned || len(rec.Nonces) != 2 {
		t.Fatalf("Export = %d nonces, owned %v, ok %v", len(rec.Nonces), owned, ok)
	}
	if err := b.Import(rec, false); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, "s"); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("Get of a backup copy: %v, want ErrNotOwned", err)
	}
	if err := b.Delete(ctx, "s"); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("Delete of a backup copy: %v, want ErrNotOwned", err)
	}
	if err := b.Create(ctx, newSession("s", clock.Now(), time.Hour)); !errors.Is(err, sessions.ErrExists) {
		t.Fatalf("Create over a backup copy: %v, want ErrExists", err)
	}
	if !b.Promote("s") {
		t.Fatal("Promote of a held copy failed")
	}
	for _, n := range []string{"n1", "n2"} {
		if err := b.UseNonce(ctx, "s", n); !errors.Is(err, sessions.ErrNonceUsed) {
			t.Fatalf("nonce %s after the move: %v, want ErrNonceUsed", n, err)
		}
	}
	if err := b.UseNonce(ctx, "s", "n3"); err != nil {
		t.Fatal(err)
	}

	// Demote hands the session on: the old holder serves it no more.
	rec, wasOwned, ok := b.Demote("s")
	if !ok || !wasOwned || len(rec.Nonces) != 3 {
		t.Fatalf("Demote = %d nonces, owned %v, ok %v", len(rec.Nonces), wasOwned, ok)
	}
	if err := b.UseNonce(ctx, "s", "n4"); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("UseNonce after Demote: %v, want ErrNotOwned", err)
	}
	if err := a.Import(rec, true); err != nil { // a held it as owned already: merges
		t.Fatal(err)
	}
	if err := a.UseNonce(ctx, "s", "n3"); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("nonce used on b, then on a after the merge: %v", err)
	}
	if got := a.Owned(); !slices.Equal(got, []string{"s"}) {
		t.Fatalf("Owned = %v", got)
	}
	if got := b.Owned(); len(got) != 0 {
		t.Fatalf("Owned of the demoted store = %v", got)
	}
}

// A backup that owns the session refuses a pushed nonce it already holds:
// the overlap of two replicas acting as owner cannot accept a nonce twice.
func TestImportRefusesNonceOwnedHere(t *testing.T) {
	st, clock := storesWithSession(t, 1)
	s := st[0]
	ctx := context.Background()
	if err := s.UseNonce(ctx, "s", "n"); err != nil {
		t.Fatal(err)
	}
	sess, _ := s.Get(ctx, "s")
	delta := Record{Session: sess, Nonces: []uint64{NonceHash("n")}, Partial: true}
	if err := s.Import(delta, false); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("a pushed nonce the owner holds: %v, want ErrNonceUsed", err)
	}
	delta.Nonces = []uint64{NonceHash("m")}
	if err := s.Import(delta, false); err != nil {
		t.Fatal(err)
	}
	if err := s.UseNonce(ctx, "s", "m"); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("a nonce pushed by the other owner, then used here: %v", err)
	}
	other := delta
	other.Session.ID = "unheld"
	if err := s.Import(other, false); !errors.Is(err, sessions.ErrNotFound) {
		t.Fatalf("a partial record of an unheld session: %v, want ErrNotFound", err)
	}
	forged := Record{Session: sess}
	forged.Session.Secret = "another"
	if err := s.Import(forged, true); !errors.Is(err, ErrStaticMismatch) {
		t.Fatalf("another session under the same ID: %v", err)
	}

	// A change without the fixed fields merges its mutable part and keeps
	// the held fixed fields; of an unheld session it is refused.
	change := Record{Session: sessions.Session{ID: "s", ExpiresAt: sess.ExpiresAt, LastPollAt: clock.Now().Add(time.Minute)},
		Nonces: []uint64{NonceHash("k")}, Mutable: true}
	if err := s.Import(change, false); err != nil {
		t.Fatalf("a mutable-only change: %v", err)
	}
	got, _ := s.Get(ctx, "s")
	if got.Secret != sess.Secret || got.ClusterID != sess.ClusterID || !got.CreatedAt.Equal(sess.CreatedAt) ||
		!got.LastPollAt.Equal(change.Session.LastPollAt) {
		t.Fatalf("after a mutable-only change: %+v (before %+v)", got, sess)
	}
	if err := s.UseNonce(ctx, "s", "k"); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("a nonce of a mutable-only change, used here: %v", err)
	}
	change.Session.ID = "unheld"
	if err := s.Import(change, false); !errors.Is(err, sessions.ErrNotFound) {
		t.Fatalf("a mutable-only record of an unheld session: %v, want ErrNotFound", err)
	}
}

// Copies do not take the owner's share of MaxSessions, but are bounded.
func TestCopiesBounded(t *testing.T) {
	clock := storetest.NewClock(storetest.Start)
	s := New(sessions.Limits{MaxSessions: 2}, clock.Now)
	defer s.Close()
	ctx := context.Background()
	for i := 0; i < (copyBound+1)*2-1; i++ { // and one owned: the bound of all held
		if err := s.Import(Record{Session: newSession(fmt.Sprint("c", i), clock.Now(), time.Hour)}, false); err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
		if i == 3 {
			if err := s.Create(ctx, newSession("own", clock.Now(), time.Hour)); err != nil {
				t.Fatalf("Create with copies held: %v", err)
			}
		}
	}
	if err := s.Import(Record{Session: newSession("more", clock.Now(), time.Hour)}, false); !errors.Is(err, sessions.ErrFull) {
		t.Fatalf("a copy beyond the bound: %v, want ErrFull", err)
	}
}

// TestMergeOrderFree: whatever order records of one session arrive in,
// twice or not, the held record is the same (the merge is a semilattice).
func TestMergeOrderFree(t *testing.T) {
	for seed := uint64(0); seed < 300; seed++ {
		checkMergeOrderFree(t, seed, 2+int(seed%5), 4+int(seed%7))
	}
}

func FuzzMergeOrderFree(f *testing.F) {
	f.Add(uint64(1), uint8(3), uint8(8))
	f.Fuzz(func(t *testing.T, seed uint64, n, limit uint8) {
		checkMergeOrderFree(t, seed, 1+int(n%8), 1+int(limit%16))
	})
}

func checkMergeOrderFree(t *testing.T, seed uint64, n, limit int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	start := storetest.Start
	base := newSession("s", start, time.Hour)
	grace := time.Minute
	recs := make([]Record, n)
	for i := range recs {
		r := Record{Session: base}
		at := func() time.Time {
			if rng.IntN(3) == 0 {
				return time.Time{}
			}
			return start.Add(time.Duration(rng.IntN(100)) * time.Second)
		}
		switch rng.IntN(4) {
		case 1:
			r.Session.State = sessions.StateCompleted
			r.Session.Response = []byte(fmt.Sprint("resp", rng.IntN(3)))
			r.Session.DeliveredAt = at()
		case 2:
			r.Session.State = sessions.StateDenied
			r.Session.DenyReason = fmt.Sprint("why", rng.IntN(3))
		}
		r.Session.LastPollAt = at()
		r.Session.ExpiresAt = start.Add(time.Hour + time.Duration(rng.IntN(100))*time.Second)
		if !r.Session.DeliveredAt.IsZero() {
			r.Session.ExpiresAt = r.Session.DeliveredAt.Add(grace)
		}
		if rng.IntN(2) == 0 { // a change sent without the fixed fields
			r.Mutable = true
			r.Session.ClusterID, r.Session.Secret, r.Session.CreatedAt = "", "", time.Time{}
			r.Session.CallbackURL, r.Session.CallbackSessionID = "", ""
		}
		for j := rng.IntN(2 * limit); j > 0; j-- {
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], uint64(rng.IntN(3*limit)))
			r.Nonces = append(r.Nonces, NonceHash(string(b[:])))
		}
		recs[i] = r
	}
	var want Record
	for round := 0; round < 6; round++ {
		order := rng.Perm(n)
		if round%2 == 1 { // some pushed twice
			order = append(order, order[:n/2+1]...)
		}
		s := newStore(sessions.Limits{MaxNoncesPerSession: limit, Grace: grace}, func() time.Time { return start }, time.Hour)
		// The backup holds the session (as created) before any change.
		if err := s.Import(Record{Session: base}, false); err != nil {
			t.Fatal(err)
		}
		for _, i := range order {
			if err := s.Import(recs[i], false); err != nil {
				t.Fatalf("Import: %v", err)
			}
		}
		got, _, _ := s.Export("s")
		s.Close()
		slices.Sort(got.Nonces)
		if len(got.Nonces) > limit {
			t.Fatalf("merged nonce set holds %d > limit %d", len(got.Nonces), limit)
		}
		if round == 0 {
			want = got
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("seed %d: order %v gave\n%+v\nwant\n%+v", seed, order, got, want)
		}
	}
	// Every nonce of every record is refused after the merge (used, or the
	// set is full): none is accepted again.
	s := newStore(sessions.Limits{MaxNoncesPerSession: limit, Grace: grace}, func() time.Time { return start }, time.Hour)
	defer s.Close()
	if err := s.Import(Record{Session: base}, true); err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := s.Import(r, true); err != nil {
			t.Fatal(err)
		}
	}
	_, _, _ = s.Export("s")
	e := s.t.get("s")
	for _, r := range recs {
		for _, h := range r.Nonces {
			if !e.nonces.has(h) && e.nonces.len() < limit {
				t.Fatalf("seed %d: a merged nonce is neither held nor refused by a full set", seed)
			}
		}
	}
}

// A poll whose answer was lost after its nonce was spent and copied (its
// owner died) is sent again with the same request ID to the promoted copy:
// it gets its answer. The same nonce with another request ID (a client
// replaying the signed request) and an older poll's request are refused.
func TestPollSentAgainAfterMove(t *testing.T) {
	ctx := context.Background()
	st, clock := storesWithSession(t, 2)
	owner, backup := st[0], st[1]
	if _, err := owner.RecordPollRequest(ctx, "s", "n1", 0, 11); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if _, err := owner.RecordPollRequest(ctx, "s", "n2", 0, 22); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.RecordPollRequest(ctx, "s", "n2", 0, 33); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("replay with another request ID on the owner: %v, want ErrNonceUsed", err)
	}
	rec, _, _ := owner.Export("s")
	if err := backup.Import(rec, false); err != nil {
		t.Fatal(err)
	}
	if !backup.Promote("s") {
		t.Fatal("Promote failed")
	}
	got, err := backup.RecordPollRequest(ctx, "s", "n2", 0, 22)
	if err != nil {
		t.Fatalf("the last poll sent again: %v, want its answer", err)
	}
	if !got.LastPollAt.Equal(clock.Now()) {
		t.Fatalf("LastPollAt = %v, want the first attempt's %v", got.LastPollAt, clock.Now())
	}
	for _, c := range []struct {
		nonce string
		req   uint64
	}{{"n2", 33}, {"n2", 0}, {"n1", 11}} {
		if _, err := backup.RecordPollRequest(ctx, "s", c.nonce, 0, c.req); !errors.Is(err, sessions.ErrNonceUsed) {
			t.Fatalf("nonce %s with request %d: %v, want ErrNonceUsed", c.nonce, c.req, err)
		}
	}
}

// The copy of a poll can reach a store that already owns the session with
// that poll in it: the replica that served the poll handed the session
// over (it was stopping) before the copy arrived. That is the same
// acceptance twice, not a used nonce (test/replicas' rolling restart once
// answered such a fresh poll "nonce used"); a copy of another poll with
// the same nonce is still refused.
func TestImportTakesTheSamePollTwice(t *testing.T) {
	ctx := context.Background()
	st, clock := storesWithSession(t, 2)
	served, next := st[0], st[1]
	sess, err := served.RecordPollRequest(ctx, "s", "n", 0, 7)
	if err != nil {
		t.Fatal(err)
	}
	handed, _, _ := served.Demote("s")
	if err := next.Import(handed, true); err != nil {
		t.Fatal(err)
	}
	h := NonceHash("n")
	copyOf := func(req uint64) Record {
		return Record{Session: sess, Nonces: []uint64{h}, Partial: true, Mutable: true, LastPoll: PollMark{Nonce: h, Request: req}}
	}
	if err := next.Import(copyOf(7), false); err != nil {
		t.Fatalf("the copy of the poll the handover brought: %v, want nil", err)
	}
	for _, req := range []uint64{8, 0} {
		if err := next.Import(copyOf(req), false); !errors.Is(err, sessions.ErrNonceUsed) {
			t.Fatalf("a copy of another poll (request %d) with the same nonce: %v, want ErrNonceUsed", req, err)
		}
	}
	if _, err := next.RecordPollRequest(ctx, "s", "n", 0, 9); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("the nonce on the new owner: %v, want ErrNonceUsed", err)
	}

	// The new owner took a poll of its own with a nonce; a copy of a
	// poll elsewhere with that nonce is refused, whatever its mark.
	clock.Advance(time.Second)
	if _, err := next.RecordPollRequest(ctx, "s", "m", 0, 21); err != nil {
		t.Fatal(err)
	}
	hm := NonceHash("m")
	if err := next.Import(Record{Session: sess, Nonces: []uint64{hm}, Partial: true, Mutable: true,
		LastPoll: PollMark{Nonce: hm, Request: 22}}, false); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("a copy of another poll with the new owner's nonce: %v, want ErrNonceUsed", err)
	}
	// An earlier poll's mark is no excuse once a later poll replaced it.
	if err := next.Import(copyOf(7), false); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("the first poll's copy after a later poll: %v, want ErrNonceUsed", err)
	}
}

// storesWithSession returns n stores on one test clock, closed when the
// test ends, the first holding session "s" (an hour to live).
func storesWithSession(t *testing.T, n int) ([]*Store, *storetest.Clock) {
	t.Helper()
	clock := storetest.NewClock(storetest.Start)
	st := make([]*Store, n)
	for i := range st {
		st[i] = New(sessions.Limits{}, clock.Now)
		t.Cleanup(st[i].Close)
	}
	if err := st[0].Create(context.Background(), newSession("s", clock.Now(), time.Hour)); err != nil {
		t.Fatal(err)
	}
	return st, clock
}
