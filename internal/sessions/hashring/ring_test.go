package hashring

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/memory"
	"github.com/kbprovider/backend/internal/testutil/await"
)

var ctx = context.Background()

func testSession(id string, now time.Time) sessions.Session {
	return sessions.Session{ID: id, ClusterID: "cluster-" + id, Secret: "secret-of-" + id + "-0123456789abcdef",
		CreatedAt: now, ExpiresAt: now.Add(10 * time.Minute)}
}

// ownedBy returns an ID that the ring of rs gives to owner.
func ownedBy(t *testing.T, rs []*replica, owner *replica, prefix string) string {
	t.Helper()
	for i := 0; i < 10000; i++ {
		id := fmt.Sprintf("%s-%d", prefix, i)
		if rs[0].Owner(id) == owner.url {
			return id
		}
	}
	t.Fatalf("no ID owned by %s", owner.url)
	return ""
}

func TestReplicasAgreeAndShare(t *testing.T) {
	rs := startRing(t, 3, sessions.DefaultLimits, time.Now)
	owned := map[string]int{}
	for i := 0; i < 300; i++ {
		id := fmt.Sprintf("s%d", i)
		o := rs[0].Owner(id)
		for _, r := range rs[1:] {
			if r.Owner(id) != o {
				t.Fatalf("replicas disagree on the owner of %s", id)
			}
		}
		owned[o]++
	}
	for _, r := range rs {
		if owned[r.url] < 30 {
			t.Fatalf("ownership is lopsided: %v", owned)
		}
	}

	// A session owned by rs[0], driven through rs[1] and rs[2], is owned
	// by rs[0] and copied to its backup only.
	id := ownedBy(t, rs, rs[0], "shared")
	if err := rs[1].Create(ctx, testSession(id, time.Now())); err != nil {
		t.Fatal(err)
	}
	backup := byURL(rs, rs[0].view().backup(id))
	for _, r := range rs {
		owned, ok := r.Local().Holds(id)
		switch {
		case r == rs[0] && (!ok || !owned):
			t.Fatal("the owner does not own the session")
		case r == backup && (!ok || owned):
			t.Fatalf("the backup holds it: %v, owned %v; want a copy", ok, owned)
		case r != rs[0] && r != backup && ok:
			t.Fatal("a third replica holds the session")
		}
	}
	if _, err := rs[2].RecordPoll(ctx, id, "n1", time.Hour); err != nil {
		t.Fatal(err)
	}
	_, err := rs[1].RecordPoll(ctx, id, "n2", time.Hour)
	if !errors.Is(err, sessions.ErrTooSoon) {
		t.Fatalf("poll through another replica within the interval: %v, want ErrTooSoon", err)
	}
	if err := rs[2].UseNonce(ctx, id, "n1"); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("nonce reuse through a third replica: %v, want ErrNonceUsed", err)
	}
	if err := rs[1].Complete(ctx, id, []byte(`{"kind":"BindingResponse"}`)); err != nil {
		t.Fatal(err)
	}
	got, err := rs[2].Get(ctx, id)
	if err != nil || got.State != sessions.StateCompleted || got.Secret != testSession(id, time.Now()).Secret {
		t.Fatalf("Get through a non-owner after Complete: %v, state %v", err, got.State)
	}
	// The static part is cached where Get fetched it, unless that replica
	// is the backup (the ports decide): it has the copy.
	want := 1
	if rs[2] == backup {
		want = 0
	}
	if n := rs[2].statics.len(); n != want {
		t.Fatalf("the non-owner (backup: %v) caches %d static parts, want %d", rs[2] == backup, n, want)
	}
	// The backup's copy followed every change before the owner answered.
	rec, _, _ := backup.Local().Export(id)
	if rec.Session.State != sessions.StateCompleted || len(rec.Nonces) != 1 || rec.Session.LastPollAt.IsZero() {
		t.Fatalf("the backup's copy: state %v, %d nonces, last poll %v", rec.Session.State, len(rec.Nonces), rec.Session.LastPollAt)
	}
}

func byURL(rs []*replica, url string) *replica {
	for _, r := range rs {
		if r.url == url {
			return r
		}
	}
	return nil
}

// A session deleted and created again under its ID with another secret
// must not be combined with the old, cached static part.
func TestStaleStaticPartNotUsed(t *testing.T) {
	// Three replicas: rs[1] neither owns nor backs up the session, so it
	// only caches its static part.
	rs := startRing(t, 3, sessions.DefaultLimits, time.Now)
	var id string
	for i := 0; id == ""; i++ {
		if c := ownedBy(t, rs, rs[0], fmt.Sprintf("again%d", i)); rs[0].view().backup(c) != rs[1].url {
			id = c
		}
	}
	old := testSession(id, time.Now())
	if err := rs[1].Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := rs[1].Get(ctx, id); err != nil {
		t.Fatal(err)
	}
	// Deleted and created again on the owner itself, so the non-owner's
	// cache keeps the old static part.
	if err := rs[0].Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, ok := rs[1].Local().Holds(id); ok {
		t.Fatal("the backup kept its copy of a deleted session")
	}
	fresh := old
	fresh.Secret = "another-secret-0123456789abcdef"
	if err := rs[0].Create(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if st, err := rs[1].Static(ctx, id); err != nil || st.Secret != old.Secret {
		t.Fatalf("Static from the cache: %v (want the old secret, still cached)", err)
	}
	// A poll checked with the old secret changes nothing on the owner...
	if _, err := rs[1].RecordPoll(ctx, id, "n1", time.Hour); !errors.Is(err, sessions.ErrStaleStatic) {
		t.Fatalf("poll with a stale static part: %v, want ErrStaleStatic", err)
	}
	if got, _ := rs[0].Local().Get(ctx, id); !got.LastPollAt.IsZero() {
		t.Fatal("a poll with a stale static part was recorded")
	}
	// ... and the next Static is the owner's.
	if st, err := rs[1].Static(ctx, id); err != nil || st.Secret != fresh.Secret {
		t.Fatalf("Static after stale_static: %v, secret fresh %v", err, st.Secret == fresh.Secret)
	}
	if _, err := rs[1].RecordPoll(ctx, id, "n1", time.Hour); err != nil {
		t.Fatalf("poll with the fresh static part (same nonce): %v", err)
	}
	if err := rs[0].Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := rs[0].Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		got, err := rs[1].Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.Secret != old.Secret {
			t.Fatal("Get combined the new session with the old session's cached secret")
		}
	}
}

// A backup's copy of an earlier session under the same ID (its drop was
// lost) is not combined with the owner's session either: the poll checked
// with it changes nothing, and the copy is dropped.
func TestStaleCopyNotUsed(t *testing.T) {
	rs := startRing(t, 2, sessions.DefaultLimits, time.Now)
	id := ownedBy(t, rs, rs[0], "stalecopy")
	old := testSession(id, time.Now())
	if err := rs[0].Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	// Deleted and created again on the owner's store alone: the backup
	// hears of neither.
	if err := rs[0].Local().Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	fresh := old
	fresh.Secret = "another-secret-0123456789abcdef"
	if err := rs[0].Local().Create(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if st, err := rs[1].Static(ctx, id); err != nil || st.Secret != old.Secret {
		t.Fatalf("Static from the backup's copy: %v (want the old secret)", err)
	}
	if _, err := rs[1].RecordPoll(ctx, id, "n1", time.Hour); !errors.Is(err, sessions.ErrStaleStatic) {
		t.Fatalf("poll checked with a stale copy: %v, want ErrStaleStatic", err)
	}
	if got, _ := rs[0].Local().Get(ctx, id); !got.LastPollAt.IsZero() {
		t.Fatal("a poll checked with a stale copy was recorded")
	}
	if _, held := rs[1].Local().Holds(id); held {
		t.Fatal("the stale copy is still held")
	}
	if st, err := rs[1].Static(ctx, id); err != nil || st.Secret != fresh.Secret {
		t.Fatalf("Static after stale_static: %v, secret fresh %v", err, st.Secret == fresh.Secret)
	}
	if _, err := rs[1].RecordPoll(ctx, id, "n1", time.Hour); err != nil {
		t.Fatalf("poll with the owner's static part: %v", err)
	}
}

// TestOwnerCrashBackupServes: when an owner dies (connection refused), its
// backup serves its sessions: pending ones go on, a completed response is
// delivered, used nonces stay used; new sessions work everywhere.
func TestOwnerCrashBackupServes(t *testing.T) {
	rs := startRing(t, 3, sessions.DefaultLimits, time.Now)
	dead := rs[0]
	pending := ownedBy(t, rs, dead, "pending")
	done := ownedBy(t, rs, dead, "done")
	for _, id := range []string{pending, done} {
		if err := rs[1].Create(ctx, testSession(id, time.Now())); err != nil {
			t.Fatal(err)
		}
		if _, err := rs[2].RecordPoll(ctx, id, "used", 0); err != nil {
			t.Fatal(err)
		}
		// On the owner itself (its own store, then the copy to the
		// backup before the answer).
		got, err := dead.RecordPoll(ctx, id, "used-at-owner", 0)
		if err != nil || got.Secret == "" || got.LastPollAt.IsZero() {
			t.Fatalf("a poll on the owner: %v, secret %q, last poll %v", err, got.Secret, got.LastPollAt)
		}
	}
	resp := []byte(`{"kind":"BindingResponse","n":1}`)
	if err := rs[1].Complete(ctx, done, resp); err != nil {
		t.Fatal(err)
	}
	dead.stop()

	for _, r := range rs[1:] {
		for _, id := range []string{pending, done} {
			for _, nonce := range []string{"used", "used-at-owner"} {
				if _, err := r.RecordPoll(ctx, id, nonce, 0); !errors.Is(err, sessions.ErrNonceUsed) {
					t.Fatalf("nonce %s used before the crash, on %s after it: %v, want ErrNonceUsed", nonce, id, err)
				}
			}
		}
	}
	got, err := rs[2].RecordPoll(ctx, done, "fresh", 0)
	if err != nil || got.State != sessions.StateCompleted || string(got.Response) != string(resp) {
		t.Fatalf("completed session after its owner died: %v, state %v", err, got.State)
	}
	got, err = rs[1].RecordPoll(ctx, pending, "fresh", 0)
	if err != nil || got.State != sessions.StatePending {
		t.Fatalf("pending session after its owner died: %v", err)
	}
	if err := rs[2].Complete(ctx, pending, resp); err != nil {
		t.Fatalf("Complete after the owner died: %v", err)
	}
	if err := rs[1].Create(ctx, testSession(ownedBy(t, rs, dead, "new"), time.Now())); err != nil {
		t.Fatalf("Create of a session the dead replica would have owned: %v", err)
	}
	for _, r := range rs[1:] {
		if slices.Contains(r.Members(), dead.url) {
			t.Fatalf("%s still has the dead replica in its ring", r.url)
		}
	}
}

// TestOwnerAndBackupDie: a session whose owner and backup both died is
// gone: ErrNotFound (410), fast; the others carry on.
func TestOwnerAndBackupDie(t *testing.T) {
	rs := startRing(t, 3, sessions.DefaultLimits, time.Now)
	id := ownedBy(t, rs, rs[0], "lost")
	if err := rs[2].Create(ctx, testSession(id, time.Now())); err != nil {
		t.Fatal(err)
	}
	backup := byURL(rs, rs[0].view().backup(id))
	survivor := rs[1]
	if backup == survivor {
		survivor = rs[2]
	}
	kept := ownedBy(t, rs, survivor, "kept")
	if err := survivor.Create(ctx, testSession(kept, time.Now())); err != nil {
		t.Fatal(err)
	}
	rs[0].stop()
	backup.stop()
	if _, err := survivor.RecordPoll(ctx, id, "n", 0); !errors.Is(err, sessions.ErrNotFound) {
		t.Fatalf("a session whose owner and backup died: %v, want ErrNotFound", err)
	}
	if err := survivor.Delete(ctx, id); err != nil {
		t.Fatalf("Delete of a lost session: %v", err)
	}
	if _, err := survivor.RecordPoll(ctx, kept, "n", 0); err != nil {
		t.Fatalf("a session on the survivor: %v", err)
	}
}

// hungPeer accepts connections and never answers.
func hungPeer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	stuck := make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() { defer conns.Done(); <-stuck; c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); close(stuck); conns.Wait() })
	return "http://" + ln.Addr().String()
}

// TestOwnerHangs: an owner that accepts connections but never answers
// costs a caller at most the peer timeout; the session is unavailable
// (503, try again), not lost (410): the owner may still hold it.
func TestOwnerHangs(t *testing.T) {
	hung := hungPeer(t)
	r := startReplica(t, sessions.DefaultLimits, time.Now, Options{PeerTimeout: 200 * time.Millisecond})
	r.SetPeers([]string{hung})
	r.noteSender(hung, 1, true, false) // as if it had joined, then hung
	id := ""
	for i := 0; ; i++ {
		if id = fmt.Sprintf("h%d", i); r.Owner(id) == hung {
			break
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.RecordPoll(ctx, id, "n", time.Second)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, sessions.ErrUnavailable) || errors.Is(err, sessions.ErrNotFound) {
			t.Fatalf("poll of a session on a hung owner: %v, want ErrUnavailable", err)
		}
	case <-time.After(10 * time.Second): // far above the 200ms timeout: a hang
		t.Fatal("poll of a session on a hung owner did not return")
	}
	if !slices.Contains(r.Members(), hung) {
		t.Fatal("a slow member was taken out of the ring")
	}
}

// TestSlowPreviousOwner: a new owner whose previous owner is slow answers
// ErrUnavailable, never ErrNotFound, and never serves a stale copy.
func TestSlowPreviousOwner(t *testing.T) {
	hung := hungPeer(t)
	b := startReplica(t, sessions.DefaultLimits, time.Now, Options{PeerTimeout: 200 * time.Millisecond})
	// b's ring history: the hung replica was a member and left (or was
	// dropped by discovery), so b is the owner now; b holds a copy, the
	// hung previous owner may hold the token.
	b.mu.Lock()
	b.m.rings = []*ringView{newRingView([]string{b.url}), newRingView([]string{b.url, hung})}
	b.mu.Unlock()
	id := ""
	for i := 0; ; i++ {
		if id = fmt.Sprint("slow-", i); b.m.rings[1].owner(id) == hung {
			break
		}
	}
	if err := b.Local().Import(memory.Record{Session: testSession(id, time.Now())}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := b.RecordPoll(ctx, id, "n", 0); !errors.Is(err, sessions.ErrUnavailable) {
		t.Fatalf("poll while the previous owner is slow: %v, want ErrUnavailable", err)
	}
	if owned, _ := b.Local().Holds(id); owned {
		t.Fatal("the copy was promoted while the previous owner may hold the session")
	}
}

// TestReplicaJoins: a new replica takes over part of the ring. Sessions
// whose owner moved follow it (pushed by the old owner, or taken on
// demand), with their nonces; none is lost.
func TestReplicaJoins(t *testing.T) {
	rs := startRing(t, 2, sessions.DefaultLimits, time.Now)
	var ids []string
	for i := 0; i < 60; i++ {
		id := fmt.Sprintf("before-%d", i)
		if err := rs[i%2].Create(ctx, testSession(id, time.Now())); err != nil {
			t.Fatal(err)
		}
		if err := rs[(i+1)%2].UseNonce(ctx, id, "used"); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	joined := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	rs = append(rs, joined)
	joinRing(t, rs)
	moved := 0
	for i, id := range ids {
		if joined.Owner(id) == joined.url {
			moved++
		}
		if err := rs[i%3].UseNonce(ctx, id, "used"); !errors.Is(err, sessions.ErrNonceUsed) {
			t.Fatalf("session %s after the join: nonce used before: %v, want ErrNonceUsed", id, err)
		}
		if _, err := rs[(i+1)%3].RecordPoll(ctx, id, "n1", time.Second); err != nil {
			t.Fatalf("session %s after the join: %v", id, err)
		}
	}
	if moved == 0 {
		t.Fatal("no session moved to the new replica")
	}
	if got := len(joined.Local().Owned()); got != moved {
		t.Fatalf("the new replica owns %d sessions, want the %d that moved", got, moved)
	}
	for i := 0; i < 60; i++ {
		if err := rs[i%3].Create(ctx, testSession(fmt.Sprintf("after-%d", i), time.Now())); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLeaveHandsOver: a replica that leaves hands every session it owns,
// with nonces, state and response, to the new owners before its peer API
// stops; then nothing is lost.
func TestLeaveHandsOver(t *testing.T) {
	rs := startRing(t, 3, sessions.DefaultLimits, time.Now)
	leaver := rs[0]
	var ids []string
	resp := []byte(`{"kind":"BindingResponse"}`)
	for i := 0; len(ids) < 20; i++ {
		id := fmt.Sprintf("leave-%d", i)
		if leaver.Owner(id) != leaver.url {
			continue
		}
		if err := rs[1].Create(ctx, testSession(id, time.Now())); err != nil {
			t.Fatal(err)
		}
		if _, err := rs[2].RecordPoll(ctx, id, "used", 0); err != nil {
			t.Fatal(err)
		}
		if len(ids)%2 == 0 {
			if err := rs[1].Complete(ctx, id, resp); err != nil {
				t.Fatal(err)
			}
		}
		ids = append(ids, id)
	}
	if err := leaver.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if leaver.Ready() == nil {
		t.Fatal("a leaving replica says it is ready")
	}
	if n := len(leaver.Local().Owned()); n != 0 {
		t.Fatalf("the leaver still owns %d sessions", n)
	}
	// In transit: requests that reach the leaver are forwarded.
	if _, err := leaver.Get(ctx, ids[0]); err != nil {
		t.Fatalf("Get through the leaver after Leave: %v", err)
	}
	leaver.stop()
	for i, id := range ids {
		r := rs[1+i%2]
		if err := r.UseNonce(ctx, id, "used"); !errors.Is(err, sessions.ErrNonceUsed) {
			t.Fatalf("a nonce used before the handover: %v", err)
		}
		got, err := r.RecordPoll(ctx, id, "fresh", 0)
		if err != nil {
			t.Fatalf("session %s after its owner left: %v", id, err)
		}
		if wantDone := i%2 == 0; wantDone != (got.State == sessions.StateCompleted && string(got.Response) == string(resp)) {
			t.Fatalf("session %s after the handover: state %v", id, got.State)
		}
	}
	for _, r := range rs[1:] {
		if slices.Contains(r.Members(), leaver.url) {
			t.Fatal("the leaver is still in a ring")
		}
	}
}

// TestNonceOnceAcrossJoinAndLeave: while replicas join and leave, a nonce
// presented at every replica at once is accepted at most once.
func TestNonceOnceAcrossJoinAndLeave(t *testing.T) {
	rs := startRing(t, 2, sessions.DefaultLimits, time.Now)
	var ids []string
	for i := 0; i < 40; i++ {
		id := fmt.Sprintf("race-%d", i)
		if err := rs[0].Create(ctx, testSession(id, time.Now())); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	joiner := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	all := append(slices.Clone(rs), joiner)
	for _, r := range all {
		r.SetPeers([]string{rs[0].url, rs[1].url, joiner.url})
	}
	var accepted [40]atomic.Int32
	var wg sync.WaitGroup
	for round, change := range []func(){
		func() { _ = joiner.Join(ctx) },
		func() { _ = rs[1].Leave(ctx) },
	} {
		nonce := fmt.Sprint("n", round)
		wg.Go(change)
		for i, id := range ids {
			for _, r := range all {
				wg.Go(func() {
					if err := r.UseNonce(ctx, id, nonce); err == nil {
						accepted[i].Add(1)
					} else if !errors.Is(err, sessions.ErrNonceUsed) && !errors.Is(err, sessions.ErrUnavailable) {
						t.Errorf("UseNonce during a ring change: %v", err)
					}
				})
			}
		}
		wg.Wait()
		once := 0
		for i := range accepted {
			switch n := accepted[i].Swap(0); {
			case n > 1:
				t.Fatalf("round %d: nonce of %s accepted %d times", round, ids[i], n)
			case n == 1:
				once++
			}
		}
		// The rest were refused everywhere: unavailable (the joiner
		// before it joined), or used (two replicas acting as owner for a
		// moment each refuse what the other already holds).
		t.Logf("round %d: %d of %d nonces accepted once while the ring changed, none twice", round, once, len(ids))
	}
	// Once the ring settled, each session has one owner.
	await.True(t, "every session is owned by exactly one replica", func() bool {
		for _, id := range ids {
			n := 0
			for _, r := range all {
				if o, _ := r.Local().Holds(id); o {
					n++
				}
			}
			if n != 1 {
				return false
			}
		}
		return true
	})
	// Nothing was lost: every session still answers, and both nonces are
	// used (whoever accepted them).
	for _, id := range ids {
		for _, n := range []string{"n0", "n1"} {
			if err := joiner.UseNonce(ctx, id, n); err == nil {
				t.Logf("nonce %s of %s was accepted only now (all attempts were unavailable)", n, id)
			} else if !errors.Is(err, sessions.ErrNonceUsed) {
				t.Fatalf("session %s after the join and leave: %v", id, err)
			}
		}
	}
}

// recordingTransport keeps every peer request and response body.
type recordingTransport struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (rt *recordingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	b, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(b))
	res, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	rb, _ := io.ReadAll(res.Body)
	res.Body.Close()
	res.Body = io.NopCloser(bytes.NewReader(rb))
	rt.mu.Lock()
	rt.bodies = append(rt.bodies, b, rb)
	rt.mu.Unlock()
	return res, nil
}

// TestOneRoundTripPerPoll: a non-owner fetches a session's static part
// once; after that a poll (Static, then RecordPoll) costs one peer round
// trip, and many concurrent polls share round trips (group commit).
func TestOneRoundTripPerPoll(t *testing.T) {
	rt := &recordingTransport{}
	a := startReplica(t, sessions.DefaultLimits, time.Now, Options{Transport: rt, NoStreams: true})
	b := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	c := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	joinRing(t, []*replica{a, b, c})
	rt.mu.Lock()
	rt.bodies = nil // the joins
	rt.mu.Unlock()
	trips := func() int {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		return len(rt.bodies) / 2
	}
	// Sessions a neither owns nor backs up (a backup answers Static from
	// its copy, without a round trip).
	var ids []string
	for i := 0; len(ids) < 200; i++ {
		if id := fmt.Sprintf("onehop-%d", i); a.Owner(id) == b.url && a.view().backup(id) == c.url {
			if err := b.Create(ctx, testSession(id, time.Now())); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
	}
	st, err := a.Static(ctx, ids[0])
	if err != nil || st.Secret != testSession(ids[0], time.Now()).Secret || !st.ExpiresAt.IsZero() {
		t.Fatalf("Static on a non-owner: %v", err)
	}
	if n := trips(); n != 1 {
		t.Fatalf("the first Static took %d round trips, want 1", n)
	}
	for i := 0; i < 3; i++ {
		if _, err := a.Static(ctx, ids[0]); err != nil {
			t.Fatal(err)
		}
		got, err := a.RecordPoll(ctx, ids[0], fmt.Sprintf("n%d", i), 0)
		if err != nil || got.Secret != st.Secret || got.State != sessions.StatePending {
			t.Fatalf("RecordPoll: %v", err)
		}
	}
	if n := trips(); n != 4 {
		t.Fatalf("three polls took %d round trips after the first Static, want 3", n-1)
	}
	// Concurrent polls of many sessions.
	var wg sync.WaitGroup
	before := trips()
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := a.Static(ctx, id); err != nil {
				t.Error(err)
			}
			if _, err := a.RecordPoll(ctx, id, fmt.Sprintf("c%d", i), 0); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := trips() - before; n >= 2*len(ids) {
		t.Fatalf("%d concurrent polls (with a Static each) took %d round trips", len(ids), n)
	} else {
		t.Logf("%d concurrent polls with a first Static each: %d round trips", len(ids), n)
	}
}

// TestCopyComesBackToTheForwarder: with two replicas the forwarder of a
// request is the session's backup, so the owner sends the copy back in
// its answer: a forwarded poll costs one round trip in all (none from the
// owner to its backup), and the forwarder holds the nonce before it
// answers, so the owner's crash right after it neither loses the session
// nor lets the nonce be used again. A forwarder that held no copy yet
// fetches the owner's whole record (with the nonces used before).
func TestCopyComesBackToTheForwarder(t *testing.T) {
	rtA, rtB := &recordingTransport{}, &recordingTransport{}
	a := startReplica(t, sessions.DefaultLimits, time.Now, Options{Transport: rtA, NoStreams: true})
	b := startReplica(t, sessions.DefaultLimits, time.Now, Options{Transport: rtB, NoStreams: true})
	joinRing(t, []*replica{a, b})
	id := ownedBy(t, []*replica{a, b}, b, "piggyback")
	if err := a.Create(ctx, testSession(id, time.Now())); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Static(ctx, id); err != nil {
		t.Fatal(err)
	}
	// The forwarder is the backup: it checks signatures with its copy, and
	// caches nothing of what it holds (Create, Static, Get).
	if _, err := a.Get(ctx, id); err != nil {
		t.Fatal(err)
	}
	if n := a.statics.len(); n != 0 {
		t.Fatalf("the backup cached %d static parts of sessions it holds copies of", n)
	}
	trips := func() int {
		rtA.mu.Lock()
		rtB.mu.Lock()
		defer rtA.mu.Unlock()
		defer rtB.mu.Unlock()
		return (len(rtA.bodies) + len(rtB.bodies)) / 2
	}
	heldAt := func(r *replica, nonce string) bool {
		rec, owned, ok := r.Local().Export(id)
		return ok && !owned && slices.Contains(rec.Nonces, memory.NonceHash(nonce))
	}
	// Five polls, one at a time: five round trips (one more if a
	// heartbeat falls in between), where a copy of its own from the owner
	// made ten.
	before := trips()
	for i := 0; i < 5; i++ {
		if _, err := a.RecordPoll(ctx, id, fmt.Sprint("warm", i), 0); err != nil {
			t.Fatal(err)
		}
		if !heldAt(a, fmt.Sprint("warm", i)) {
			t.Fatal("the forwarder holds no copy with the poll's nonce when RecordPoll returns")
		}
	}
	if n := trips() - before; n > 6 {
		t.Fatalf("five forwarded polls took %d round trips between the two replicas, want 5", n)
	}
	if _, err := a.RecordPoll(ctx, id, "first", 0); err != nil {
		t.Fatal(err)
	}

	// A forwarder without a copy gets the whole record.
	a.Local().Remove(id)
	if _, err := a.RecordPoll(ctx, id, "second", 0); err != nil {
		t.Fatal(err)
	}
	if !heldAt(a, "first") || !heldAt(a, "second") {
		t.Fatal("the forwarder's copy, fetched whole, lacks a nonce used before")
	}

	b.stop()
	for _, n := range []string{"first", "second"} {
		if _, err := a.RecordPoll(ctx, id, n, 0); !errors.Is(err, sessions.ErrNonceUsed) {
			t.Fatalf("nonce %q after the owner died: %v, want ErrNonceUsed", n, err)
		}
	}
	if got, err := a.RecordPoll(ctx, id, "third", 0); err != nil || got.State != sessions.StatePending {
		t.Fatalf("the session after its owner died: %v", err)
	}
}

// TestPeerTrafficSealed: nothing of a session is readable on the wire.
func TestPeerTrafficSealed(t *testing.T) {
	rt := &recordingTransport{}
	a := startReplica(t, sessions.DefaultLimits, time.Now, Options{Transport: rt, NoStreams: true})
	b := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	rs := []*replica{a, b}
	joinRing(t, rs)
	id, secrets := sendSecrets(t, rs, a, b, "sealed")
	if _, err := a.Get(ctx, id); err != nil {
		t.Fatal(err)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.bodies) < 8 {
		t.Fatalf("only %d bodies recorded", len(rt.bodies))
	}
	for _, body := range rt.bodies {
		for _, secret := range secrets {
			if bytes.Contains(body, []byte(secret)) {
				t.Fatalf("peer traffic shows %q in clear", secret)
			}
		}
	}
}

// sendSecrets makes a send b what nobody may read on the wire: a session
// b owns, created, completed with a kubeconfig and polled through a. It
// returns the session's ID and the strings that must not show in clear.
func sendSecrets(t *testing.T, rs []*replica, a, b *replica, prefix string) (string, []string) {
	t.Helper()
	id := ownedBy(t, rs, b, prefix)
	s := testSession(id, time.Now())
	if err := a.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := a.Complete(ctx, id, []byte(`{"kubeconfig":"c2VydmljZS1hY2NvdW50LXRva2Vu"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.RecordPoll(ctx, id, "nonce-visible?", 0); err != nil {
		t.Fatal(err)
	}
	return id, []string{s.Secret, id, s.ClusterID, "c2VydmljZS1hY2NvdW50LXRva2Vu", "nonce-visible?"}
}

// TestPeerAPIRefuses: without the key, replayed, tampered, stale, wrong
// method, oversized: refused with the right status, never served.
func TestPeerAPIRefuses(t *testing.T) {
	r := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	if err := r.Create(ctx, testSession("target", time.Now())); err != nil {
		t.Fatal(err)
	}
	post := func(body []byte) int {
		t.Helper()
		res, err := http.Post(r.url+PeerPath, "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	batchOf := func(sent time.Time, ops ...string) []byte {
		var reqs [][]byte
		for _, op := range ops {
			reqs = append(reqs, mustJSON(&peerRequest{Op: op, ID: "target"}))
		}
		return encodeBatch(sent.UnixNano(), Sender{}, reqs)
	}
	valid := func(op string, sent time.Time) []byte {
		return r.sealer.seal(batchOf(sent, op), aadRequest)
	}
	other, err := newSealer(bytes.Repeat([]byte("x"), 32))
	if err != nil {
		t.Fatal(err)
	}

	replayed := valid(opDelete, time.Now())
	if got := post(replayed); got != http.StatusOK {
		t.Fatalf("valid request: %d", got)
	}
	tampered := valid(opGet, time.Now())
	tampered[len(tampered)-1] ^= 1
	for name, c := range map[string]struct {
		body []byte
		want int
	}{
		"other key":                     {other.seal(batchOf(time.Now(), opGet), aadRequest), http.StatusUnauthorized},
		"replayed":                      {replayed, http.StatusUnauthorized},
		"tampered":                      {tampered, http.StatusUnauthorized},
		"stale":                         {valid(opGet, time.Now().Add(-time.Minute)), http.StatusUnauthorized},
		"future":                        {valid(opGet, time.Now().Add(time.Minute)), http.StatusUnauthorized},
		"garbage":                       {[]byte("hello"), http.StatusUnauthorized},
		"empty":                         {nil, http.StatusUnauthorized},
		"empty batch":                   {r.sealer.seal(batchOf(time.Now()), aadRequest), http.StatusBadRequest},
		"batch too long":                {r.sealer.seal(batchOf(time.Now(), slices.Repeat([]string{opGet}, maxBatch+1)...), aadRequest), http.StatusBadRequest},
		"not a batch":                   {r.sealer.seal(mustJSON(&peerRequest{Sent: time.Now().UnixNano(), Op: opGet, ID: "target"}), aadRequest), http.StatusBadRequest},
		"too large":                     {make([]byte, r.maxPeerMessage()+1), http.StatusRequestEntityTooLarge},
		"response sealing as a request": {r.sealer.seal(batchOf(time.Now(), opGet), responseAAD(make([]byte, 12))), http.StatusUnauthorized},
	} {
		if got := post(c.body); got != c.want {
			t.Errorf("%s: status %d, want %d", name, got, c.want)
		}
	}
	// An op the owner does not know (a newer replica's) fails alone; the
	// rest of its batch is served.
	if err := r.Create(ctx, testSession("target", time.Now())); err != nil {
		t.Fatal(err)
	}
	mixed := r.sealer.seal(batchOf(time.Now(), "explode", opGet), aadRequest)
	res, err := http.Post(r.url+PeerPath, "application/octet-stream", bytes.NewReader(mixed))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("batch with an unknown op: %d", res.StatusCode)
	}
	_, plain, err := r.sealer.open(body, responseAAD(mixed[:gcmNonceSize]))
	if err != nil {
		t.Fatal(err)
	}
	answers, err := decodeBatchResponse(plain, 2)
	if err != nil || answers[0].Err != codeMalformed || answers[1].Err != "" || answers[1].Session == nil || answers[1].Session.ID != "target" {
		t.Fatalf("answers to an unknown op and a get: %s (%v)", plain, err)
	}

	// Without a Content-Length (chunked), the limit holds as well, and a
	// valid batch is served.
	for name, c := range map[string]struct {
		body []byte
		want int
	}{
		"chunked too large": {make([]byte, r.maxPeerMessage()+1), http.StatusRequestEntityTooLarge},
		"chunked":           {valid(opGet, time.Now()), http.StatusOK},
	} {
		res, err := http.Post(r.url+PeerPath, "application/octet-stream", io.MultiReader(bytes.NewReader(c.body)))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != c.want {
			t.Errorf("%s: status %d, want %d", name, res.StatusCode, c.want)
		}
	}

	res, err = http.Get(r.url + PeerPath)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: status %d, want 405", res.StatusCode)
	}
	// A replica with another key cannot reach this one's sessions.
	intruder := startReplica(t, sessions.DefaultLimits, time.Now, Options{Key: bytes.Repeat([]byte("x"), 32)})
	intruder.SetPeers([]string{r.url})
	intruder.noteSender(r.url, 1, true, false)
	planted := ownedBy(t, []*replica{intruder}, r, "planted")
	if err := intruder.Create(ctx, testSession(planted, time.Now())); err == nil {
		t.Fatal("a replica with another key planted a session")
	}
	if _, err := r.Get(ctx, planted); !errors.Is(err, sessions.ErrNotFound) {
		t.Fatalf("planted session: %v", err)
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	for name, o := range map[string]Options{
		"no self":   {Key: testKey},
		"short key": {Self: "http://127.0.0.1:1", Key: []byte("short")},
	} {
		if _, err := New(o); err == nil || strings.Contains(err.Error(), "panic") {
			t.Errorf("%s: New = %v, want a clear error", name, err)
		}
	}
}

// TestRecoversBackupAfterCrash: after an owner dies, with no request
// touching its sessions, the heartbeat finds it dead and the backups take
// the sessions and copy them to a new backup; so a second crash, of that
// backup, loses nothing either.
func TestRecoversBackupAfterCrash(t *testing.T) {
	rs := startRing(t, 3, sessions.DefaultLimits, time.Now)
	var ids []string
	for i := 0; len(ids) < 10; i++ {
		id := fmt.Sprint("quiet-", i)
		if rs[0].Owner(id) != rs[0].url {
			continue
		}
		if err := rs[1].Create(ctx, testSession(id, time.Now())); err != nil {
			t.Fatal(err)
		}
		if err := rs[2].UseNonce(ctx, id, "used"); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	rs[0].stop()
	await.True(t, "the survivors own the dead replica's sessions, each with a copy on the other", func() bool {
		for _, id := range ids {
			o1, ok1 := rs[1].Local().Holds(id)
			o2, ok2 := rs[2].Local().Holds(id)
			if !ok1 || !ok2 || o1 == o2 {
				return false
			}
		}
		return true
	})
	// Kill whichever survivor owns the first session: the other goes on.
	owner, other := rs[1], rs[2]
	if o, _ := rs[2].Local().Holds(ids[0]); o {
		owner, other = rs[2], rs[1]
	}
	owner.stop()
	if err := other.UseNonce(ctx, ids[0], "used"); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("after two crashes, a nonce used before both: %v, want ErrNonceUsed", err)
	}
	if _, err := other.RecordPoll(ctx, ids[0], "fresh", 0); err != nil {
		t.Fatalf("after two crashes one after the other: %v", err)
	}
}

// TestLeaveHandsOverLargeResponses: completed sessions with responses near
// the size limit are handed over too: batches are cut to fit a peer
// message.
func TestLeaveHandsOverLargeResponses(t *testing.T) {
	rs := startRing(t, 2, sessions.DefaultLimits, time.Now)
	big := bytes.Repeat([]byte("x"), sessions.DefaultLimits.MaxResponseBytes-10)
	var ids []string
	for i := 0; len(ids) < 6; i++ {
		id := fmt.Sprint("big-", i)
		if rs[0].Owner(id) != rs[0].url {
			continue
		}
		if err := rs[1].Create(ctx, testSession(id, time.Now())); err != nil {
			t.Fatal(err)
		}
		if err := rs[1].Complete(ctx, id, big); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rs[0].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	rs[0].stop()
	for _, id := range ids {
		got, err := rs[1].RecordPoll(ctx, id, "n", 0)
		if err != nil || !bytes.Equal(got.Response, big) {
			t.Fatalf("large response after the handover: %v, %d bytes", err, len(got.Response))
		}
	}
}
