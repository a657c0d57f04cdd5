package storetest

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

// The Wait cases run real goroutines against the store; only the store's
// time decisions use the fake clock.

// waitResult is what a Wait started in the background returned.
type waitResult struct {
	s   sessions.Session
	err error
}

// waitAsync starts Wait(ctx, id) and returns where its result arrives.
func (e *env) waitAsync(ctx context.Context, id string) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		s, err := e.store.Wait(ctx, id)
		ch <- waitResult{s, err}
	}()
	return ch
}

// stillWaiting fails if the Wait behind ch returned within a short while:
// a pending session must hold it.
func stillWaiting(t *testing.T, ch <-chan waitResult) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("Wait returned while the session was pending: state %v, error %v", r.s.State, r.err)
	case <-time.After(100 * time.Millisecond):
	}
}

// result returns the Wait's result, failing after a generous bound.
func result(t *testing.T, ch <-chan waitResult) waitResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not return after the session changed")
		return waitResult{}
	}
}

func testWaitUnknown(t *testing.T, e *env) {
	_, err := e.store.Wait(e.ctx, "no-such-session")
	wantErr(t, "Wait for an unknown session", err, sessions.ErrNotFound)
}

func testWaitComplete(t *testing.T, e *env) {
	s := e.create()
	e.poll(s.ID, "n1", time.Second)
	ch := e.waitAsync(e.ctx, s.ID)
	stillWaiting(t, ch)
	e.clock.Advance(5 * time.Second)
	resp := []byte(`{"kind":"BindingResponse"}`)
	noErr(t, "Complete", e.store.Complete(e.ctx, s.ID, resp))
	r := result(t, ch)
	noErr(t, "Wait", r.err)
	if r.s.State != sessions.StateCompleted || !bytes.Equal(r.s.Response, resp) {
		t.Fatalf("Wait after Complete: state %v, response %q", r.s.State, r.s.Response)
	}
	// What Wait handed out counts as delivered, as for a poll.
	now := e.clock.Now()
	sameTime(t, "DeliveredAt of the Wait's session", r.s.DeliveredAt, now)
	sameTime(t, "ExpiresAt of the Wait's session", r.s.ExpiresAt, now.Add(e.limits.Grace))
	got := e.get(s.ID)
	sameTime(t, "DeliveredAt after Wait", got.DeliveredAt, now)
	sameTime(t, "ExpiresAt after Wait", got.ExpiresAt, now.Add(e.limits.Grace))
	// Wait spends no nonce and records no poll.
	sameTime(t, "LastPollAt after Wait", got.LastPollAt, Start)
	e.clock.Advance(time.Second)
	if p := e.poll(s.ID, "n2", time.Second); p.State != sessions.StateCompleted || !p.DeliveredAt.Equal(now) {
		t.Fatalf("poll after the Wait: state %v, DeliveredAt %v, want %v", p.State, p.DeliveredAt, now)
	}
}

func testWaitDeny(t *testing.T, e *env) {
	s := e.create()
	ch := e.waitAsync(e.ctx, s.ID)
	stillWaiting(t, ch)
	noErr(t, "Deny", e.store.Deny(e.ctx, s.ID, "the user cancelled"))
	r := result(t, ch)
	noErr(t, "Wait", r.err)
	if r.s.State != sessions.StateDenied || r.s.DenyReason != "the user cancelled" || !r.s.DeliveredAt.IsZero() {
		t.Fatalf("Wait after Deny: %+v", redact(r.s))
	}
}

func testWaitEndsWithContext(t *testing.T, e *env) {
	s := e.create()
	ctx, cancel := context.WithTimeout(e.ctx, time.Second)
	defer cancel()
	deadline, _ := ctx.Deadline()
	r := result(t, e.waitAsync(ctx, s.ID))
	noErr(t, "Wait until the deadline", r.err)
	if r.s.State != sessions.StatePending || r.s.ID != s.ID || r.s.Secret != s.Secret {
		t.Fatalf("Wait that timed out: %+v, want the pending session", redact(r.s))
	}
	if early := time.Until(deadline); early > sessions.WaitMargin {
		t.Fatalf("Wait returned a pending session %s before its deadline, more than WaitMargin", early)
	}
	ctx, cancel = context.WithCancel(e.ctx)
	ch := e.waitAsync(ctx, s.ID)
	stillWaiting(t, ch)
	cancel()
	r = result(t, ch)
	if r.err != nil || r.s.State != sessions.StatePending {
		t.Fatalf("Wait after cancel: state %v, error %v; want pending, no error", r.s.State, r.err)
	}
	if got := e.get(s.ID); !got.LastPollAt.IsZero() || got.State != sessions.StatePending {
		t.Fatalf("Wait changed the session: %+v", redact(got))
	}
}

func testWaitFinalAtOnce(t *testing.T, e *env) {
	s := e.create()
	resp := []byte(`{"kind":"BindingResponse"}`)
	noErr(t, "Complete", e.store.Complete(e.ctx, s.ID, resp))
	e.clock.Advance(time.Second)
	// A context that has ended still gets the final state.
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	got, err := e.store.Wait(ctx, s.ID)
	noErr(t, "Wait for a completed session", err)
	if got.State != sessions.StateCompleted || !bytes.Equal(got.Response, resp) {
		t.Fatalf("Wait for a completed session: %+v", redact(got))
	}
	sameTime(t, "DeliveredAt", got.DeliveredAt, e.clock.Now())
	// Once delivered, later Waits keep the first delivery time.
	e.clock.Advance(time.Second)
	again, err := e.store.Wait(e.ctx, s.ID)
	noErr(t, "second Wait", err)
	sameTime(t, "DeliveredAt of the second Wait", again.DeliveredAt, got.DeliveredAt)
	// Past the grace period the session is gone.
	e.clock.Advance(e.limits.Grace)
	_, err = e.store.Wait(e.ctx, s.ID)
	wantErr(t, "Wait after the grace period", err, sessions.ErrNotFound)
}

func testWaitDelete(t *testing.T, e *env) {
	s := e.create()
	ch := e.waitAsync(e.ctx, s.ID)
	stillWaiting(t, ch)
	noErr(t, "Delete", e.store.Delete(e.ctx, s.ID))
	wantErr(t, "Wait for a deleted session", result(t, ch).err, sessions.ErrNotFound)
}

// A session deleted and created again under its ID while a Wait is woken
// is another session: the Wait answers ErrNotFound, not the new one.
func testWaitDeleteCreateAgain(t *testing.T, e *env) {
	s := e.create()
	ch := e.waitAsync(e.ctx, s.ID)
	stillWaiting(t, ch)
	noErr(t, "Delete", e.store.Delete(e.ctx, s.ID))
	noErr(t, "Create again", e.store.Create(e.ctx, s))
	wantErr(t, "Wait for a session deleted and created again", result(t, ch).err, sessions.ErrNotFound)
}

func testWaitMany(t *testing.T, e *env) {
	s := e.create()
	other := e.create()
	var chs []<-chan waitResult
	for i := 0; i < 5; i++ {
		chs = append(chs, e.waitAsync(e.ctx, s.ID))
	}
	otherCtx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
	defer cancel()
	otherCh := e.waitAsync(otherCtx, other.ID)
	stillWaiting(t, chs[0])
	noErr(t, "Complete", e.store.Complete(e.ctx, s.ID, []byte(`{}`)))
	for i, ch := range chs {
		if r := result(t, ch); r.err != nil || r.s.State != sessions.StateCompleted {
			t.Fatalf("waiter %d: state %v, error %v", i, r.s.State, r.err)
		}
	}
	// Another session's waiter is not woken by it.
	deadline, _ := otherCtx.Deadline()
	if r := result(t, otherCh); r.err != nil || r.s.State != sessions.StatePending || time.Until(deadline) > sessions.WaitMargin {
		t.Fatalf("waiter of another session: state %v, error %v, returned %s before its deadline", r.s.State, r.err, time.Until(deadline))
	}
}
