package hashring

import (
	"hash/crc32"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/golang/groupcache/consistenthash"
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
