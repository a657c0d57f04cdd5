package replicas

import (
	"fmt"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// TestSkewedClocks: three replica processes whose clocks are 0, +5 s and
// -5 s off the API server's (the backend's test-only clock offset). Each
// poll is admitted by its session's owner whatever the askers' clocks: a
// signed poll replayed on the other replicas is refused as used, a poll
// at once on another replica is too soon, no replica falls back to
// admitting locally, and each replica's clock offset metric says its skew.
func TestSkewedClocks(t *testing.T) {
	offsets := []time.Duration{0, 5 * time.Second, -5 * time.Second}
	c := newCluster(t, clusterOpts{replicas: len(offsets), noStart: true})
	for i, r := range c.reps {
		r.env = []string{fmt.Sprintf("KUBE_BIND_BACKEND_TEST_CLOCK_OFFSET=%s", offsets[i])}
		r.start(t)
	}
	for _, r := range c.reps {
		r.waitReady(t)
	}

	// Sessions created on every replica until each replica owns some.
	owned := map[string]int{}
	for i := 0; len(owned) < len(c.reps) || i < 2*len(c.reps); i++ {
		if i > 60 {
			t.Fatalf("no session owned by every replica after %d: %v", i, owned)
		}
		creator := c.reps[i%len(c.reps)]
		s := c.create(t, creator)
		owner := ownerOf(c.reps, s.SessionID)
		owned[owner.name]++
		first := c.reps[(i+1)%len(c.reps)]
		signed := s.signedPoll()
		expect(t, fmt.Sprintf("first poll on %s (owner %s)", first.name, owner.name), c.send(first, signed, nil),
			http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
		admitted := 1
		for _, r := range c.reps {
			if r == first {
				continue
			}
			a := c.send(r, signed, nil)
			if a.status != http.StatusUnauthorized || a.code != v1alpha1.ErrorInvalidSignature {
				t.Errorf("the poll of %s replayed on %s (owner %s, skews %s → %s): %s, want 401 %s",
					first.name, r.name, owner.name, offsets[i%len(offsets)], offsets[(i+1)%len(offsets)], a, v1alpha1.ErrorInvalidSignature)
			}
			if a.status != http.StatusUnauthorized {
				admitted++
			}
			expect(t, "a fresh poll at once on "+r.name, c.poll(r, s), http.StatusTooManyRequests, v1alpha1.ErrorSlowDown)
		}
		t.Logf("session created on %s, owned by %s, polled on %s: admitted %d times across %d replicas", creator.name, owner.name, first.name, admitted, len(c.reps))
	}

	for i, r := range c.reps {
		if n := r.metric(t, "ring_peer_fallbacks_total"); n != 0 {
			t.Errorf("%s fell back %v times with every owner reachable", r.name, n)
		}
		// The API server's clock minus the replica's is -offset, within
		// 1 s; the dependency check reads /version every 10 s.
		deadline := time.Now().Add(30 * time.Second)
		for {
			off := r.metric(t, "kube_bind_backend_clock_offset_seconds")
			if !math.IsNaN(off) && math.Abs(off+offsets[i].Seconds()) <= 1 {
				t.Logf("%s, clock offset %s: kube_bind_backend_clock_offset_seconds %.2f", r.name, offsets[i], off)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s, clock offset %s: kube_bind_backend_clock_offset_seconds %v", r.name, offsets[i], off)
			}
			time.Sleep(time.Second)
		}
	}
}
