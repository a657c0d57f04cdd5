package replicas

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// TestAnyReplicaAnswers: a session created on A, its link opened and the
// user logged in through B, Bind pressed through C, the response polled
// on A; a nonce and the poll pace hold across replicas (the owner admits
// every poll), and a link completes one sign-in, whichever replica it reaches.
func TestAnyReplicaAnswers(t *testing.T) {
	c := newCluster(t, clusterOpts{replicas: 3})
	a, b, cc := c.reps[0], c.reps[1], c.reps[2]

	s := c.create(t, a)
	t.Logf("session %s created on %s, owned by %s", s.SessionID, a.name, ownerOf(c.reps, s.SessionID).name)

	// Poll admission happens at the owner: a nonce used on B is refused
	// on C and A, and a poll on C right after B's is too soon.
	first := s.signedPoll()
	expect(t, "first poll on B", c.send(b, first, nil), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
	soon := c.poll(cc, s)
	expect(t, "a poll on C at once", soon, http.StatusTooManyRequests, v1alpha1.ErrorSlowDown)
	if soon.retryAfter != "1" {
		t.Errorf("Retry-After %q, want 1", soon.retryAfter)
	}
	expect(t, "B's poll replayed on C", c.send(cc, first, nil), http.StatusUnauthorized, v1alpha1.ErrorInvalidSignature)
	expect(t, "B's poll replayed on A", c.send(a, first, nil), http.StatusUnauthorized, v1alpha1.ErrorInvalidSignature)

	// The browser part: link, login and selection page through B, Bind
	// through C.
	c.f.takeHits()
	c.f.pin(b)
	sel := c.openSelection(t, s)
	if h := c.f.takeHits(); h[b.name] == 0 || len(h) != 1 {
		t.Fatalf("login requests went to %v, want %s only", h, b.name)
	}
	c.f.pin(cc)
	c.mustBind(t, sel)
	if h := c.f.takeHits(); h[cc.name] != 1 || len(h) != 1 {
		t.Fatalf("the Bind went to %v, want %s only", h, cc.name)
	}

	// The response on A, and again on B within the grace period.
	time.Sleep(pollGap)
	body := c.deliver(t, a, s, answerWithin)
	time.Sleep(pollGap)
	again := c.poll(b, s)
	if again.status != http.StatusOK || !bytes.Equal(again.body, body) {
		t.Fatalf("poll on B within the grace period: %s (same bytes: %v)", again, bytes.Equal(again.body, body))
	}

	// The session is done: its link, opened anywhere, says so.
	if code := openLink(t, cc, s.authURL()); code != http.StatusConflict {
		t.Errorf("a new link of the bound session on C: %d, want 409", code)
	}
	// Opening a link spends nothing; it completes one sign-in, whichever
	// replica gets the second.
	s2 := c.create(t, cc)
	link := s2.authURL()
	for _, r := range []*replica{a, b} {
		if code := openLink(t, r, link); code != http.StatusSeeOther {
			t.Fatalf("a fresh link on %s: %d, want 303 to the identity provider", r.name, code)
		}
	}
	c.f.pin(a)
	if code := c.signIn(t, link); code != http.StatusOK {
		t.Fatalf("the first sign-in through the link on A: %d, want 200 (the selection page)", code)
	}
	c.f.pin(b)
	if code := c.signIn(t, link); code != http.StatusUnauthorized {
		t.Errorf("a second sign-in through the link on B: %d, want 401 (used)", code)
	}
}

// TestAllReplicasKilledAfterBind: users bind five sessions; before any
// client polled, every replica is killed at once (SIGKILL) and started
// again with the same flags. Every client's poll gets its
// BindingResponse, and the sessions still pending (never used, or with
// the user on the selection page) go on: link, login, Bind, poll.
func TestAllReplicasKilledAfterBind(t *testing.T) {
	c := newCluster(t, clusterOpts{replicas: 3})
	reps := c.reps

	const bound = 5
	var done []*session
	for i := range bound {
		s := c.create(t, reps[i%3])
		c.bindVia(t, s, reps[(i+1)%3], reps[(i+2)%3])
		done = append(done, s)
	}
	// On the selection page before the kill, Bind after it.
	mid := c.create(t, reps[0])
	c.f.pin(reps[1])
	sel := c.openSelection(t, mid)
	// Created before the kill and never used.
	fresh := []*session{c.create(t, reps[1]), c.create(t, reps[2]), c.create(t, reps[0])}
	// A link signed in through before the kill stays used after it.
	used := c.create(t, reps[2])
	usedLink := used.authURL()
	c.f.pin(reps[2])
	if code := c.signIn(t, usedLink); code != http.StatusOK {
		t.Fatalf("a sign-in through a fresh link: %d, want 200", code)
	}

	killAll(t, reps...)
	t.Logf("killed all %d replicas at once; no client had polled", len(reps))
	for _, r := range reps {
		r.start(t)
	}
	for _, r := range reps {
		r.waitReady(t)
	}

	// Ready means the records are read: the first poll of each bound
	// session gets its response, on any replica, and so does a later one
	// within the grace period, elsewhere.
	bodies := map[*session][]byte{}
	for i, s := range done {
		r := reps[i%3]
		a := c.poll(r, s)
		if a.err != nil || a.status != http.StatusOK {
			t.Fatalf("first poll of bound session %d on %s after the restart: %s\n%.300s", i, r.name, a, a.body)
		}
		c.checkResponse(t, s, a.body)
		bodies[s] = a.body
	}
	time.Sleep(pollGap)
	for i, s := range done {
		r := reps[(i+1)%3]
		if a := c.poll(r, s); a.status != http.StatusOK || !bytes.Equal(a.body, bodies[s]) {
			t.Errorf("second poll of bound session %d on %s: %s (same bytes: %v)", i, r.name, a, bytes.Equal(a.body, bodies[s]))
		}
	}

	// The user on the selection page presses Bind now.
	c.f.pin(reps[2])
	c.mustBind(t, sel)
	c.deliver(t, reps[0], mid, answerWithin)

	// The sessions nobody had used: pending, then the whole flow.
	for i, s := range fresh {
		expect(t, "a fresh session after the restart", c.poll(reps[(i+2)%3], s), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
		c.bindVia(t, s, reps[i], reps[(i+1)%3])
		time.Sleep(pollGap)
		c.deliver(t, reps[(i+2)%3], s, answerWithin)
	}
	c.f.pin(reps[0])
	if code := c.signIn(t, usedLink); code != http.StatusUnauthorized {
		t.Errorf("a sign-in through the link used before the kill, after it: %d, want 401 (used)", code)
	}
}

// TestReplayAfterGrace: a response delivered on one replica is served to
// further polls for the grace period (3 s here), never after: neither the
// very poll that got it, replayed on every replica, nor a new correctly
// signed poll; and again after every replica restarted.
//
// What a replayed poll is answered: while the session's owner remembers
// the nonce (the same owner, not restarted), 401 invalid_signature: the
// protocol refuses a used nonce before it looks at the session. Restarted,
// the owner has forgotten it: the first replay is admitted and answered
// 410 expired_token (the first delivery, in the API server, is older than
// the grace period), the next ones 401 again. Never 200.
func TestReplayAfterGrace(t *testing.T) {
	const grace = 3 * time.Second
	c := newCluster(t, clusterOpts{replicas: 3, args: []string{"--grace-period", grace.String()}})
	reps := c.reps

	s := c.create(t, reps[0])
	t.Logf("session %s owned by %s", s.SessionID, ownerOf(reps, s.SessionID).name)
	c.bindVia(t, s, reps[0], reps[2])

	// The first delivery, on replica 1, by the signed poll u.
	var u = s.signedPoll()
	var body []byte
	for deadline := time.Now().Add(answerWithin); ; u = s.signedPoll() {
		a := c.send(reps[1], u, nil)
		if a.err == nil && a.status == http.StatusOK {
			body = a.body
			break
		}
		if !a.pending() || time.Now().After(deadline) {
			t.Fatalf("poll after the bind: %s", a)
		}
		time.Sleep(pollGap)
	}
	delivered := time.Now()
	c.checkResponse(t, s, body)
	time.Sleep(pollGap)
	if a := c.poll(reps[2], s); a.status != http.StatusOK || !bytes.Equal(a.body, body) {
		t.Fatalf("poll on replica-2 within the grace period: %s", a)
	}

	time.Sleep(time.Until(delivered.Add(grace + time.Second)))
	for _, r := range reps {
		a := c.send(r, u, nil)
		expect(t, "the delivering poll replayed after the grace period on "+r.name, a, http.StatusUnauthorized, v1alpha1.ErrorInvalidSignature)
	}
	for i, r := range reps {
		if i > 0 {
			time.Sleep(pollGap)
		}
		expect(t, "a new poll after the grace period on "+r.name, c.poll(r, s), http.StatusGone, v1alpha1.ErrorExpiredToken)
	}

	for _, r := range reps {
		r.stop(t)
	}
	for _, r := range reps {
		r.start(t)
	}
	for _, r := range reps {
		r.waitReady(t)
	}
	t.Logf("restarted every replica")
	for i, r := range reps {
		a := c.send(r, u, nil)
		if bytes.Contains(a.body, []byte("kubeconfig")) {
			t.Fatalf("the replayed poll on %s after the restart got the response: %s", r.name, a)
		}
		if i == 0 {
			expect(t, "the delivering poll replayed after the restart on "+r.name, a, http.StatusGone, v1alpha1.ErrorExpiredToken)
		} else {
			expect(t, "the delivering poll replayed again after the restart on "+r.name, a, http.StatusUnauthorized, v1alpha1.ErrorInvalidSignature)
		}
	}
	for _, r := range reps {
		time.Sleep(pollGap)
		expect(t, "a new poll after the restart on "+r.name, c.poll(r, s), http.StatusGone, v1alpha1.ErrorExpiredToken)
	}
}

// TestReplicasRefuseEachOther: replica X has the peer keys [B, A], Y has
// [A] (a rotation rolled out in the wrong order: the new key first). X's
// certificate is signed by B's CA, which Y does not trust; Y's by A's,
// which X trusts. TLS between peers is mutual, so every handshake fails,
// whichever dials: Y refuses X's server certificate, and X's client
// certificate. Each answers the sessions the other owns by itself.
// Sessions issued by Y (with A's session key) open on both; those X
// issues (with B's) only on X.
//
// What holds without the owner (the bounds asserted):
//   - outcomes and first deliveries are records in the API server, which
//     both read: once bound, a session is never answered pending by
//     either (after the first 200 anywhere), and its response is served
//     by both only within the grace period after the first delivery,
//     whichever replica made it;
//   - each replica by itself refuses a nonce it admitted;
//   - a nonce is admitted at most once per replica: up to twice here.
//     Single use across replicas needs the owner (sessions.Store's
//     AdmitPoll), and so does the poll pace.
func TestReplicasRefuseEachOther(t *testing.T) {
	const grace = 4 * time.Second
	keyA, keyB := procs.RandomKey(32), procs.RandomKey(32)
	c := newCluster(t, clusterOpts{
		replicas: 2,
		keyFiles: []string{writeKeyFile(t, keyB, keyA), writeKeyFile(t, keyA)},
		args:     []string{"--grace-period", grace.String()},
		logLevel: "debug",
	})
	x, y := c.reps[0], c.reps[1]

	// Sessions created on Y, one owned by each.
	owned := map[*replica]*session{}
	for i := 0; len(owned) < 2; i++ {
		if i == 64 {
			t.Fatal("64 sessions and still not one owned by each replica")
		}
		s := c.create(t, y)
		if o := ownerOf(c.reps, s.SessionID); owned[o] == nil {
			owned[o] = s
		}
	}
	// A session X issued (with B's key) is unknown to Y.
	sx := c.create(t, x)
	expect(t, "a session issued by X, polled on X", c.poll(x, sx), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
	expect(t, "a session issued by X, polled on Y", c.poll(y, sx), http.StatusGone, v1alpha1.ErrorExpiredToken)

	// Nonces: each replica refuses its own used nonces; the other may
	// admit a nonce once more, never twice.
	for _, owner := range []*replica{x, y} {
		s := owned[owner]
		u := s.signedPoll()
		admitted := 0
		for i, r := range []*replica{x, x, y, y, x} {
			a := c.send(r, u, nil)
			switch {
			case a.pending():
				admitted++
				if i == 1 || i == 3 || i == 4 {
					t.Errorf("session owned by %s: the nonce admitted again by %s (use %d): %s", owner.name, r.name, i+1, a)
				}
			case a.status == http.StatusUnauthorized && a.code == v1alpha1.ErrorInvalidSignature:
				if i == 0 {
					t.Errorf("session owned by %s: a fresh nonce refused by %s: %s", owner.name, r.name, a)
				}
			default:
				t.Errorf("session owned by %s: use %d of one nonce on %s: %s", owner.name, i+1, r.name, a)
			}
		}
		t.Logf("session owned by %s: one nonce sent to X, X, Y, Y, X: admitted %d times (bound: once per replica, 2)", owner.name, admitted)
		if admitted > 2 {
			t.Errorf("session owned by %s: a nonce admitted %d times by two replicas", owner.name, admitted)
		}
	}
	// They did refuse each other: each answered the other's sessions by
	// itself, over a TLS failure.
	for _, r := range []*replica{x, y} {
		if n := r.metric(t, "ring_peer_fallbacks_total"); n < 1 {
			t.Errorf("%s: ring_peer_fallbacks_total %v, want > 0: it reached the other replica", r.name, n)
		}
		if !strings.Contains(r.logs.String(), "session owner's TLS handshake failed") || !strings.Contains(r.logs.String(), "certificate") {
			t.Errorf("%s logged no failed TLS handshake with the owner over a certificate error", r.name)
		}
	}

	// Outcomes and deliveries: the session owned by X bound through X and
	// first delivered on Y; the one owned by Y bound through Y and first
	// delivered on X.
	for _, owner := range []*replica{x, y} {
		other := x
		if owner == x {
			other = y
		}
		time.Sleep(pollGap)
		c.bindVia(t, owned[owner], owner, owner)
		c.outcomeOnBoth(t, owned[owner], grace, other, owner)
	}
}

// outcomeOnBoth polls a session just bound on a and b in turn, a poll gap
// apart, and expects: pending only until the outcome reached the
// replica's informer (and never after a 200 anywhere), then the same
// response on both until the grace period after the first delivery is
// over, then 410 on both.
func (c *cluster) outcomeOnBoth(t *testing.T, s *session, grace time.Duration, a, b *replica) {
	t.Helper()
	bound := time.Now()
	var body []byte
	// The first delivery happened between firstSent and firstGot.
	var firstSent, firstGot time.Time
	pendingAfterBind := 0
	gone := map[*replica]bool{}
	for i := 0; len(gone) < 2; i++ {
		if i > 0 {
			time.Sleep(pollGap)
		}
		r := []*replica{a, b}[i%2]
		sent := time.Now()
		ans := c.poll(r, s)
		got := time.Now()
		switch {
		case ans.err != nil:
			t.Fatalf("poll on %s: %s", r.name, ans)
		case ans.pending() && body == nil && got.Sub(bound) < answerWithin:
			pendingAfterBind++
		case ans.status == http.StatusOK && body == nil:
			body, firstSent, firstGot = ans.body, sent, got
			c.checkResponse(t, s, body)
		case ans.status == http.StatusOK && bytes.Equal(ans.body, body) && sent.Sub(firstGot) <= grace:
			// Within the grace period.
		case ans.status == http.StatusGone && ans.code == v1alpha1.ErrorExpiredToken && body != nil && got.Sub(firstSent) > grace:
			gone[r] = true
		default:
			since := "before any delivery"
			if body != nil {
				since = fmt.Sprintf("%s after the first delivery", sent.Sub(firstGot).Round(time.Millisecond))
			}
			t.Fatalf("session %s, poll %d on %s, %s (grace period %s): %s", s.SessionID, i+1, r.name, since, grace, ans)
		}
	}
	t.Logf("session %s: %d pending answers right after the bind, first delivered on %s, the response on both within the grace period, 410 on both after it",
		s.SessionID, pendingAfterBind, a.name)
}
