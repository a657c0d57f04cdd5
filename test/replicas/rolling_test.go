package replicas

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// TestRollingRestartRotatesKey: three replicas with the peer key file [A]
// roll, one at a time (SIGTERM, a new process with the new file, ready),
// to [A, B], then to [B, A], as internal/sessions/ring documents a
// rotation: every replica must trust B before any presents a certificate
// signed by B's CA, and the session keys derived from the peer keys
// rotate with them (the first issues, every one opens). Rolling straight
// from [A] to [B, A] would leave replicas that refuse each other and
// sessions issued by the new ones unknown to the old ones
// (TestReplicasRefuseEachOther).
//
// Sessions in every state go through it: bound before and first polled
// after, on the selection page before and bound during, polled all
// along, and never used; none is lost, no poll fails, no replica ever
// refuses another's certificate. After it, sessions are issued with B:
// a replica that has only [B] opens them, and no longer those issued
// with A (which is why A stays until they expired).
func TestRollingRestartRotatesKey(t *testing.T) {
	keyA, keyB := procs.RandomKey(32), procs.RandomKey(32)
	fileA := writeKeyFile(t, keyA)
	idA, idB := sessionKeyID(t, keyA), sessionKeyID(t, keyB)
	c := newCluster(t, clusterOpts{replicas: 3, keyFiles: []string{fileA, fileA, fileA}, logLevel: "debug"})
	reps := c.reps

	issuedWith := func(s *session, want []byte, what string) {
		t.Helper()
		if !bytes.Equal(keyIDOf(t, s.SessionID), want) {
			t.Errorf("%s: session %s issued with %s", what, s.SessionID, keyName(t, s, idA, idB))
		}
	}

	var boundBefore, polled, fresh []*session
	var sels []*selection
	for i := range 3 {
		s := c.create(t, reps[i])
		c.bindVia(t, s, reps[(i+1)%3], reps[(i+2)%3])
		boundBefore = append(boundBefore, s)
		s = c.create(t, reps[i])
		c.f.pin(reps[(i+1)%3])
		sels = append(sels, c.openSelection(t, s))
		polled = append(polled, c.create(t, reps[i]))
		fresh = append(fresh, c.create(t, reps[i]))
	}
	for _, s := range slices.Concat(boundBefore, polled, fresh) {
		issuedWith(s, idA, "before the roll")
	}

	// poll polls every tracked session once on the given replicas, each
	// on another, and expects pending.
	round := 0
	poll := func(when string, on []*replica) {
		t.Helper()
		for j, s := range polled {
			r := on[(round+j)%len(on)]
			if a := c.poll(r, s); !a.pending() {
				t.Errorf("%s: poll of %s (issued with %s) on %s: %s", when, s.SessionID, keyName(t, s, idA, idB), r.name, a)
			}
		}
		round++
		time.Sleep(pollGap)
	}
	poll("before the roll", reps)

	roll := func(phase, file string, issuer []byte) {
		for i, r := range reps {
			r.stop(t)
			// Meanwhile the other two answer every session.
			poll(fmt.Sprintf("%s, %s stopped", phase, r.name), slices.Delete(slices.Clone(reps), i, i+1))
			r.args = replaceFlag(t, r.args, "--peer-key-file", file)
			r.start(t)
			r.waitReady(t)
			// It issues with the first key of its file, and every replica
			// opens what it issued.
			s := c.create(t, r)
			issuedWith(s, issuer, fmt.Sprintf("%s, created on %s just restarted", phase, r.name))
			polled = append(polled, s)
			// A user on the selection page presses Bind.
			if len(sels) > 0 {
				sel := sels[0]
				sels = sels[1:]
				c.f.pin(reps[(i+1)%3])
				c.mustBind(t, sel)
				time.Sleep(pollGap)
				c.deliver(t, reps[(i+2)%3], sel.s, answerWithin)
			}
			poll(fmt.Sprintf("%s, %s restarted", phase, r.name), reps)
		}
		t.Logf("rolled to %s", phase)
	}
	roll("[A, B]", writeKeyFile(t, keyA, keyB), idA)
	roll("[B, A]", writeKeyFile(t, keyB, keyA), idB)

	// Nothing was lost: the bound sessions deliver now, and the pending
	// ones, old and new, bind and deliver.
	for i, s := range boundBefore {
		c.deliver(t, reps[i], s, answerWithin)
	}
	for i, s := range []*session{fresh[0], fresh[1], fresh[2], polled[0], polled[len(polled)-1]} {
		c.bindVia(t, s, reps[i%3], reps[(i+1)%3])
		time.Sleep(pollGap)
		c.deliver(t, reps[(i+2)%3], s, answerWithin)
	}
	for _, r := range reps {
		for _, line := range strings.Split(r.logs.String(), "\n") {
			if strings.Contains(line, "certificate") {
				t.Errorf("%s logged a certificate problem during the roll: %s", r.name, line)
				break
			}
		}
	}

	// New sessions are issued with B: a replica with only [B] opens them,
	// and refuses those issued with A.
	onlyB := newReplica(t, "only-b", "127.0.0.1")
	onlyB.args = c.replicaArgs(onlyB, []string{onlyB.peerURL}, writeKeyFile(t, keyB), "info")
	onlyB.start(t)
	onlyB.waitReady(t)
	for _, r := range reps {
		s := c.create(t, r)
		issuedWith(s, idB, "after the roll, on "+r.name)
		expect(t, "a session issued after the roll, on the replica with only B", c.poll(onlyB, s), http.StatusForbidden, v1alpha1.ErrorAuthorizationPending)
	}
	expect(t, "a session issued with A, on the replica with only B", c.poll(onlyB, polled[1]), http.StatusGone, v1alpha1.ErrorExpiredToken)
}

// keyName says which of the keys issued s.
func keyName(t *testing.T, s *session, idA, idB []byte) string {
	switch id := keyIDOf(t, s.SessionID); {
	case bytes.Equal(id, idA):
		return "A"
	case bytes.Equal(id, idB):
		return "B"
	}
	return "another key"
}

// replaceFlag returns args with the value of flag (given as "--flag",
// "value") replaced.
func replaceFlag(t *testing.T, args []string, flag, value string) []string {
	t.Helper()
	out := slices.Clone(args)
	i := slices.Index(out, flag)
	if i < 0 || i+1 == len(out) {
		t.Fatalf("no %s in %v", flag, args)
	}
	out[i+1] = value
	return out
}
