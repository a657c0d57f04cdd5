package hashring

import (
	"hash/crc32"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/golang/groupcache/consistenthash"

	"github.com/kbprovider/backend/internal/sessions"
)

// TestRingPlacesAsConsistentHash: the ring names the owner groupcache's
// consistenthash names, for random member sets (sizes 0 to 6, members in
// any order) and IDs, and a backup ring (one member less) agrees too.
// Replicas of earlier versions place with consistenthash.
func TestRingPlacesAsConsistentHash(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 60; round++ {
		var members []string
		for n := round % 7; len(members) < n; {
			members = append(members, "http://10.0."+strconv.Itoa(r.IntN(256))+"."+strconv.Itoa(r.IntN(256))+":8090")
		}
		want := consistenthash.New(virtualNodes, nil)
		want.Add(members...)
		got := newRing(members, virtualNodes)
		for i := 0; i < 2000; i++ {
			id := randomID(r)
			if g, w := got.get(id), want.Get(id); g != w {
				t.Fatalf("members %v, id %q: ring says %q, consistenthash %q", members, id, g, w)
			}
		}
	}
}

// Two members whose virtual nodes share a point: the later one holds it,
// as in consistenthash.
func TestRingSharedPointGoesToTheLaterMember(t *testing.T) {
	members := []string{"a", "b"}
	want := consistenthash.New(1, nil)
	want.Add(members...)
	got := newRing(members, 1)
	for i := 0; i < 1000; i++ {
		id := strconv.Itoa(i)
		if g, w := got.get(id), want.Get(id); g != w {
			t.Fatalf("id %q: %q, want %q", id, g, w)
		}
	}
	// Same name twice: one point, held once.
	if r := newRing([]string{"x", "x"}, 3); len(r.points) != 3 || r.get("q") != "x" {
		t.Fatalf("duplicate member: %d points, owner %q", len(r.points), r.get("q"))
	}
}

func TestCRC32String(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 5000; i++ {
		b := make([]byte, r.IntN(80))
		for k := range b {
			b[k] = byte(r.Uint32())
		}
		if got, want := crc32String(string(b)), crc32.ChecksumIEEE(b); got != want {
			t.Fatalf("%x: %08x, want %08x", b, got, want)
		}
	}
}

func TestRingLookupAllocatesNothing(t *testing.T) {
	v := newRingView([]string{"http://a:1", "http://b:2", "http://c:3"})
	id := "gIwYVk68a15BcN0GhjeAbWsFWbI"
	if n := testing.AllocsPerRun(100, func() { v.owner(id); v.backup(id) }); n != 0 {
		t.Fatalf("owner and backup allocate %v objects", n)
	}
}

func randomID(r *rand.Rand) string {
	const chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	b := make([]byte, 1+r.IntN(40))
	for i := range b {
		b[i] = chars[r.IntN(len(chars))]
	}
	return string(b)
}

// TestAnswersAtOnce: what a batch's receiver serves on its own goroutine
// (nothing to wait for) and what on a worker.
func TestAnswersAtOnce(t *testing.T) {
	rs := startRing(t, 3, sessions.DefaultLimits, time.Now)
	owner := rs[0]
	id := ownedBy(t, rs, owner, "at-once")
	if err := rs[1].Create(ctx, testSession(id, time.Now())); err != nil {
		t.Fatal(err)
	}
	backup := owner.view().backup(id)
	other := rs[1].url
	if other == backup {
		other = rs[2].url
	}
	for _, c := range []struct {
		at   *replica
		req  peerRequest
		want bool
	}{
		{owner, peerRequest{Op: opPoll, ID: id, From: backup}, true},     // the copy goes back in the answer
		{owner, peerRequest{Op: opPoll, ID: id, From: other}, false},     // the copy goes to the backup first
		{owner, peerRequest{Op: opComplete, ID: id, From: other}, false}, // likewise
		{owner, peerRequest{Op: opGet, ID: id, From: other}, true},
		{owner, peerRequest{Op: opWait, ID: id, From: backup}, false},
		{owner, peerRequest{Op: opCreate, ID: id, From: backup}, false},
		{owner, peerRequest{Op: opReplicate, From: other}, true},
		{owner, peerRequest{Op: opJoin, From: other}, true},
		{rs[1], peerRequest{Op: opPoll, ID: id, From: rs[2].url}, false}, // not owned there: forwarded
		{owner, peerRequest{Op: opPoll, ID: "nobody", From: backup}, false},
	} {
		if got := c.at.answersAtOnce(&c.req); got != c.want {
			t.Errorf("%s of %s from %s at %s: %v, want %v", c.req.Op, c.req.ID, c.req.From, c.at.url, got, c.want)
		}
	}
}
