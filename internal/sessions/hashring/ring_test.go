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
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
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

	// A session owned by rs[0], driven through rs[1] and rs[2], lives only
	// on rs[0].
	id := ownedBy(t, rs, rs[0], "shared")
	if err := rs[1].Create(ctx, testSession(id, time.Now())); err != nil {
		t.Fatal(err)
	}
	if rs[0].Local().Len() != 1 || rs[1].Local().Len() != 0 || rs[2].Local().Len() != 0 {
		t.Fatalf("session held by %d/%d/%d replicas, want only the owner", rs[0].Local().Len(), rs[1].Local().Len(), rs[2].Local().Len())
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
	// The static part is cached where Get fetched it.
	if rs[2].statics.len() != 1 {
		t.Fatalf("the non-owner caches %d static parts, want 1", rs[2].statics.len())
	}
}

// A session deleted and created again under its ID with another secret
// must not be combined with the old, cached static part.
func TestStaleStaticPartNotUsed(t *testing.T) {
	rs := startRing(t, 2, sessions.DefaultLimits, time.Now)
	id := ownedBy(t, rs, rs[0], "again")
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

// TestOwnerDies: the sessions of a replica that died end as unknown (410
// at the API) on every other replica, fast; the others carry on; Create
// of a session whose owner is gone says try again (503).
func TestOwnerDies(t *testing.T) {
	rs := startRing(t, 3, sessions.DefaultLimits, time.Now)
	dead, live := rs[0], rs[1]
	lost := ownedBy(t, rs, dead, "lost")
	kept := ownedBy(t, rs, live, "kept")
	for _, id := range []string{lost, kept} {
		if err := rs[2].Create(ctx, testSession(id, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	dead.stop()

	var gone *OwnerUnavailableError
	_, err := rs[2].RecordPoll(ctx, lost, "n1", time.Second)
	if !errors.Is(err, sessions.ErrNotFound) || !errors.As(err, &gone) || gone.Owner != dead.url {
		t.Fatalf("poll of a session whose owner died: %v, want an OwnerUnavailableError that is ErrNotFound", err)
	}
	if _, err := rs[1].Get(ctx, lost); !errors.Is(err, sessions.ErrNotFound) {
		t.Fatalf("Get: %v, want ErrNotFound", err)
	}
	if err := rs[1].Complete(ctx, lost, []byte(`{}`)); !errors.Is(err, sessions.ErrNotFound) {
		t.Fatalf("Complete: %v, want ErrNotFound", err)
	}
	if err := rs[1].Delete(ctx, lost); err != nil {
		t.Fatalf("Delete of a session lost with its owner: %v", err)
	}
	if err := rs[2].Create(ctx, testSession(ownedBy(t, rs, dead, "new"), time.Now())); !errors.Is(err, sessions.ErrFull) {
		t.Fatalf("Create on a dead owner: %v, want an error that is ErrFull (503, try again)", err)
	}
	if _, err := rs[2].RecordPoll(ctx, kept, "n1", time.Second); err != nil {
		t.Fatalf("a session on a live replica: %v", err)
	}

	// Discovery drops the dead replica: its sessions stay unknown (their
	// new owner never saw them), new sessions work everywhere.
	setPeers(rs[1:])
	if _, err := rs[2].RecordPoll(ctx, lost, "n2", time.Second); !errors.Is(err, sessions.ErrNotFound) {
		t.Fatalf("poll after the ring dropped the dead owner: %v, want ErrNotFound", err)
	}
	for i := 0; i < 20; i++ {
		if err := rs[1+i%2].Create(ctx, testSession(fmt.Sprintf("after-%d", i), time.Now())); err != nil {
			t.Fatalf("Create after the ring shrank: %v", err)
		}
	}
}

// TestOwnerHangs: an owner that accepts connections but never answers
// costs a caller at most the peer timeout, then the session counts as lost.
func TestOwnerHangs(t *testing.T) {
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
	defer func() { ln.Close(); close(stuck); conns.Wait() }()
	hung := "http://" + ln.Addr().String()

	r := startReplica(t, sessions.DefaultLimits, time.Now, Options{PeerTimeout: 200 * time.Millisecond})
	r.SetPeers([]string{r.url, hung})
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
		if !errors.Is(err, sessions.ErrNotFound) {
			t.Fatalf("poll of a session on a hung owner: %v, want ErrNotFound", err)
		}
	case <-time.After(10 * time.Second): // far above the 200ms timeout: a hang
		t.Fatal("poll of a session on a hung owner did not return")
	}
}

// TestReplicaJoins: a new replica takes over part of the ring. Sessions
// whose owner moved end as unknown; the rest carry on; new sessions land
// on the new replica too.
func TestReplicaJoins(t *testing.T) {
	rs := startRing(t, 2, sessions.DefaultLimits, time.Now)
	var ids []string
	for i := 0; i < 60; i++ {
		id := fmt.Sprintf("before-%d", i)
		if err := rs[i%2].Create(ctx, testSession(id, time.Now())); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	joined := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	rs = append(rs, joined)
	setPeers(rs)
	moved, stayed := 0, 0
	for i, id := range ids {
		_, err := rs[i%3].RecordPoll(ctx, id, "n1", time.Second)
		switch {
		case joined.Owner(id) == joined.url:
			if !errors.Is(err, sessions.ErrNotFound) {
				t.Fatalf("session %s moved to the new replica: %v, want ErrNotFound", id, err)
			}
			moved++
		case err != nil:
			t.Fatalf("session %s kept its owner but: %v", id, err)
		default:
			stayed++
		}
	}
	if moved == 0 || stayed == 0 {
		t.Fatalf("%d sessions moved, %d stayed: want some of each", moved, stayed)
	}
	for i := 0; i < 60; i++ {
		if err := rs[i%3].Create(ctx, testSession(fmt.Sprintf("after-%d", i), time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	if joined.Local().Len() == 0 {
		t.Fatal("the new replica owns no new session")
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
	a := startReplica(t, sessions.DefaultLimits, time.Now, Options{Transport: rt})
	b := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	rs := []*replica{a, b}
	setPeers(rs)
	trips := func() int {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		return len(rt.bodies) / 2
	}
	var ids []string
	for i := 0; len(ids) < 200; i++ {
		if id := fmt.Sprintf("onehop-%d", i); a.Owner(id) == b.url {
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

// TestPeerTrafficSealed: nothing of a session is readable on the wire.
func TestPeerTrafficSealed(t *testing.T) {
	rt := &recordingTransport{}
	a := startReplica(t, sessions.DefaultLimits, time.Now, Options{Transport: rt})
	b := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	rs := []*replica{a, b}
	setPeers(rs)
	id := ownedBy(t, rs, b, "sealed")
	s := testSession(id, time.Now())
	if err := a.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	resp := []byte(`{"kubeconfig":"c2VydmljZS1hY2NvdW50LXRva2Vu"}`)
	if err := a.Complete(ctx, id, resp); err != nil {
		t.Fatal(err)
	}
	if _, err := a.RecordPoll(ctx, id, "nonce-visible?", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get(ctx, id); err != nil {
		t.Fatal(err)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.bodies) < 8 {
		t.Fatalf("only %d bodies recorded", len(rt.bodies))
	}
	for _, body := range rt.bodies {
		for _, secret := range []string{s.Secret, id, s.ClusterID, "c2VydmljZS1hY2NvdW50LXRva2Vu", "nonce-visible?"} {
			if bytes.Contains(body, []byte(secret)) {
				t.Fatalf("peer traffic shows %q in clear", secret)
			}
		}
	}
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
		return encodeBatch(sent.UnixNano(), reqs)
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
