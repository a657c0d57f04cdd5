package hashring

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/testutil/await"
)

type waited struct {
	s   sessions.Session
	err error
	at  time.Time
}

func waitIn(ctx context.Context, r *replica, id string) <-chan waited {
	ch := make(chan waited, 1)
	go func() {
		s, err := r.Wait(ctx, id)
		ch <- waited{s, err, time.Now()}
	}()
	return ch
}

func got(t *testing.T, ch <-chan waited) waited {
	t.Helper()
	select {
	case w := <-ch:
		return w
	case <-time.After(time.Minute):
		t.Fatal("Wait did not return")
		return waited{}
	}
}

// A long poll held on a replica that does not own the session ends as
// soon as the owner completes it, also after the wait ran longer than one
// held peer request (maxPeerWait), and the owner counts the response as
// delivered.
func TestWaitOnNonOwner(t *testing.T) {
	rs := startRing(t, 2, sessions.DefaultLimits, time.Now)
	owner, other := rs[0], rs[1]
	for _, after := range []time.Duration{200 * time.Millisecond, maxPeerWait + time.Second} {
		id := ownedBy(t, rs, owner, "held-"+after.String())
		if err := other.Create(ctx, testSession(id, time.Now())); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, maxPeerWait*3)
		ch := waitIn(wctx, other, id)
		select {
		case w := <-ch:
			t.Fatalf("Wait returned for a pending session: %+v %v", w.s.State, w.err)
		case <-time.After(after):
		}
		resp := []byte(`{"kind":"BindingResponse"}`)
		completed := time.Now()
		if err := owner.Complete(ctx, id, resp); err != nil {
			t.Fatal(err)
		}
		w := got(t, ch)
		cancel()
		if w.err != nil || w.s.State != sessions.StateCompleted || !bytes.Equal(w.s.Response, resp) || w.s.DeliveredAt.IsZero() {
			t.Fatalf("Wait on the non-owner after %s: state %v, delivered %v, error %v", after, w.s.State, w.s.DeliveredAt, w.err)
		}
		if held, _ := owner.Local().Get(ctx, id); held.DeliveredAt.IsZero() {
			t.Fatal("the owner did not count the response the wait handed out as delivered")
		}
		t.Logf("completed after %s: the non-owner's Wait returned %s after Complete", after, w.at.Sub(completed))
	}
}

// A wait whose deadline comes while the owner holds it returns the session
// still pending, no later than its deadline, without error.
func TestWaitOnNonOwnerTimesOut(t *testing.T) {
	rs := startRing(t, 2, sessions.DefaultLimits, time.Now)
	id := ownedBy(t, rs, rs[0], "timeout")
	if err := rs[1].Create(ctx, testSession(id, time.Now())); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	deadline, _ := wctx.Deadline()
	w := got(t, waitIn(wctx, rs[1], id))
	if w.err != nil || w.s.State != sessions.StatePending || w.s.Secret == "" {
		t.Fatalf("Wait until the deadline: state %v, error %v", w.s.State, w.err)
	}
	if early := deadline.Sub(w.at); early > sessions.WaitMargin {
		t.Fatalf("returned %s before the deadline", early)
	}

	// Cancelled while held (a client that went away, a shutdown): the
	// current state, at once.
	cctx, cancelNow := context.WithCancel(ctx)
	ch := waitIn(cctx, rs[1], id)
	time.Sleep(200 * time.Millisecond)
	cancelNow()
	if w := got(t, ch); w.err != nil || w.s.State != sessions.StatePending {
		t.Fatalf("cancelled Wait: state %v, error %v", w.s.State, w.err)
	}
}

// An owner that dies while it holds a wait: the wait goes on at the
// backup, which now serves the session, and ends when it completes there.
func TestWaitOwnerDies(t *testing.T) {
	rs := startRing(t, 2, sessions.DefaultLimits, time.Now)
	id := ownedBy(t, rs, rs[0], "dies")
	if err := rs[1].Create(ctx, testSession(id, time.Now())); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ch := waitIn(wctx, rs[1], id)
	time.Sleep(300 * time.Millisecond)
	rs[0].stop()
	await.True(t, "the backup owns the session", func() bool {
		owned, _ := rs[1].Local().Holds(id)
		return owned
	})
	if err := rs[1].Complete(ctx, id, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if w := got(t, ch); w.err != nil || w.s.State != sessions.StateCompleted || wctx.Err() != nil {
		t.Fatalf("Wait after its owner died: state %v, error %v (context: %v), want completed before the deadline", w.s.State, w.err, wctx.Err())
	}
}

// A session that moves to another replica while waited for (a replica
// joins and the old owner hands the session over to it) is waited for at
// its new owner, where it completes.
func TestWaitFollowsMovedSession(t *testing.T) {
	rs := startRing(t, 2, sessions.DefaultLimits, time.Now)
	old, waiter := rs[0], rs[1]
	next := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	var id string
	for i := 0; id == ""; i++ {
		c := fmt.Sprintf("moves-%d", i)
		if OwnerOf([]string{old.url, waiter.url}, c) == old.url && OwnerOf([]string{old.url, waiter.url, next.url}, c) == next.url {
			id = c
		}
	}
	sess := testSession(id, time.Now())
	if err := waiter.Create(ctx, sess); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ch := waitIn(wctx, waiter, id) // held at old
	time.Sleep(300 * time.Millisecond)

	joinRing(t, []*replica{old, waiter, next}) // old hands the session to next
	await.True(t, "the new replica owns the session", func() bool {
		owned, _ := next.Local().Holds(id)
		return owned
	})
	select {
	case w := <-ch:
		t.Fatalf("Wait returned when its session moved: state %v, error %v", w.s.State, w.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := old.Complete(ctx, id, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if w := got(t, ch); w.err != nil || w.s.State != sessions.StateCompleted {
		t.Fatalf("Wait for a moved session: state %v, error %v", w.s.State, w.err)
	}
}
