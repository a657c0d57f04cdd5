// Package storetest is the conformance suite every sessions.Store must pass
// unchanged: it pins down the behaviour that the Store interface's doc
// comments describe, one subtest per rule.
//
// The store under test must take every time decision (expiry, poll
// intervals, grace period, the time it records) from the Clock it is given,
// so the suite can move time without sleeping.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

// NewStoreFunc returns a fresh, empty store bounded by limits that reads the
// time from clock. It registers its own cleanup with t.
type NewStoreFunc func(t *testing.T, limits sessions.Limits, clock *Clock) sessions.Store

// Start is the time every test's clock starts at.
var Start = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

// TTL is the lifetime of the sessions the suite creates.
const TTL = 10 * time.Minute

// testLimits are small limits, so that limits are reached quickly.
var testLimits = sessions.Limits{
	MaxSessions:         8,
	MaxNoncesPerSession: 16,
	MaxResponseBytes:    1024,
	Grace:               60 * time.Second,
}

// Run runs the conformance suite against stores made by newStore.
func Run(t *testing.T, newStore NewStoreFunc) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, *env)
	}{
		{"CreateGet", testCreateGet},
		{"GetUnknown", testGetUnknown},
		{"Static", testStatic},
		{"StaticUnknown", testStaticUnknown},
		{"StaticRecreated", testStaticRecreated},
		{"CreateDuplicate", testCreateDuplicate},
		{"Full", testFull},
		{"FullRecoversAfterExpiry", testFullRecoversAfterExpiry},
		{"FullRecoversAfterDelete", testFullRecoversAfterDelete},
		{"FullRecoversAfterGrace", testFullRecoversAfterGrace},
		{"NonceSingleUse", testNonceSingleUse},
		{"NoncePerSession", testNoncePerSession},
		{"NonceCap", testNonceCap},
		{"UnknownSession", testUnknownSession},
		{"PollRecordsTime", testPollRecordsTime},
		{"PollTooSoon", testPollTooSoon},
		{"TooSoonSpendsNothing", testTooSoonSpendsNothing},
		{"PollZeroInterval", testPollZeroInterval},
		{"Complete", testComplete},
		{"CompleteCopiesResponse", testCompleteCopiesResponse},
		{"Deny", testDeny},
		{"ResponseTooLarge", testResponseTooLarge},
		{"CompleteExtendsExpiry", testCompleteExtendsExpiry},
		{"GracePeriod", testGracePeriod},
		{"GraceShortensExpiry", testGraceShortensExpiry},
		{"ExpiryAfterTTL", testExpiryAfterTTL},
		{"RecreateAfterExpiry", testRecreateAfterExpiry},
		{"Delete", testDelete},
		{"ConcurrentNonce", testConcurrentNonce},
		{"ConcurrentPoll", testConcurrentPoll},
		{"ConcurrentComplete", testConcurrentCompleteDeny},
		{"ConcurrentCreate", testConcurrentCreate},
		{"ConcurrentCreateSameID", testConcurrentCreateSameID},
		{"WaitUnknown", testWaitUnknown},
		{"WaitComplete", testWaitComplete},
		{"WaitDeny", testWaitDeny},
		{"WaitEndsWithContext", testWaitEndsWithContext},
		{"WaitFinalAtOnce", testWaitFinalAtOnce},
		{"WaitDelete", testWaitDelete},
		{"WaitDeleteCreateAgain", testWaitDeleteCreateAgain},
		{"WaitMany", testWaitMany},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewClock(Start)
			e := &env{t: t, clock: clock, limits: testLimits, ctx: context.Background()}
			e.newStore = func(l sessions.Limits) sessions.Store { return newStore(t, l, clock) }
			e.store = e.newStore(testLimits)
			tc.fn(t, e)
		})
	}
}

type env struct {
	t        *testing.T
	ctx      context.Context
	clock    *Clock
	limits   sessions.Limits
	store    sessions.Store
	newStore func(sessions.Limits) sessions.Store
	seq      int
}

// withLimits replaces the store by a fresh one with other limits.
func (e *env) withLimits(l sessions.Limits) {
	e.limits = l
	e.store = e.newStore(l)
}

// session returns a new pending session living ttl from now.
func (e *env) session(ttl time.Duration) sessions.Session {
	e.seq++
	now := e.clock.Now()
	return sessions.Session{
		ID:        fmt.Sprintf("sess-%s-%d", e.t.Name(), e.seq),
		ClusterID: fmt.Sprintf("cluster-%d", e.seq),
		Secret:    fmt.Sprintf("secret-%d-c2VjcmV0LWZvci10ZXN0", e.seq),
		CreatedAt: now,
		ExpiresAt: now.Add(ttl),
	}
}

// create stores a new session living TTL and returns it.
func (e *env) create() sessions.Session {
	e.t.Helper()
	s := e.session(TTL)
	if err := e.store.Create(e.ctx, s); err != nil {
		e.t.Fatalf("Create(%s): %v", s.ID, err)
	}
	return s
}

func (e *env) get(id string) sessions.Session {
	e.t.Helper()
	s, err := e.store.Get(e.ctx, id)
	if err != nil {
		e.t.Fatalf("Get(%s): %v", id, err)
	}
	return s
}

func (e *env) poll(id, nonce string, interval time.Duration) sessions.Session {
	e.t.Helper()
	s, err := e.store.RecordPoll(e.ctx, id, nonce, interval)
	if err != nil {
		e.t.Fatalf("RecordPoll(%s, %s): %v", id, nonce, err)
	}
	return s
}

func wantErr(t *testing.T, what string, got, want error) {
	t.Helper()
	if !errors.Is(got, want) {
		t.Fatalf("%s: got error %v, want %v", what, got, want)
	}
}

func noErr(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func sameTime(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if !got.Equal(want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// sameSession compares every field of two sessions.
func sameSession(t *testing.T, got, want sessions.Session) {
	t.Helper()
	if got.ID != want.ID || got.ClusterID != want.ClusterID || got.Secret != want.Secret ||
		got.CallbackURL != want.CallbackURL || got.CallbackSessionID != want.CallbackSessionID ||
		got.State != want.State || got.DenyReason != want.DenyReason || !bytes.Equal(got.Response, want.Response) {
		t.Fatalf("session differs:\n got %+v\nwant %+v", redact(got), redact(want))
	}
	sameTime(t, "CreatedAt", got.CreatedAt, want.CreatedAt)
	sameTime(t, "ExpiresAt", got.ExpiresAt, want.ExpiresAt)
	sameTime(t, "DeliveredAt", got.DeliveredAt, want.DeliveredAt)
	sameTime(t, "LastPollAt", got.LastPollAt, want.LastPollAt)
}

func redact(s sessions.Session) sessions.Session {
	if s.Secret != "" {
		s.Secret = fmt.Sprintf("<%d bytes>", len(s.Secret))
	}
	return s
}

func testCreateGet(t *testing.T, e *env) {
	s := e.session(TTL)
	s.CallbackURL = "http://127.0.0.1:45678/callback"
	s.CallbackSessionID = "cli-session-1"
	noErr(t, "Create", e.store.Create(e.ctx, s))
	got := e.get(s.ID)
	if got.State != sessions.StatePending {
		t.Fatalf("State = %v, want pending", got.State)
	}
	sameSession(t, got, s)
	if !got.LastPollAt.IsZero() || !got.DeliveredAt.IsZero() || got.Response != nil {
		t.Fatalf("new session carries poll or response data: %+v", redact(got))
	}
}

func testGetUnknown(t *testing.T, e *env) {
	_, err := e.store.Get(e.ctx, "no-such-session")
	wantErr(t, "Get unknown", err, sessions.ErrNotFound)
}

// testStatic: Static returns the fields fixed at Create and nothing else,
// the same before and after the session's state changed.
func testStatic(t *testing.T, e *env) {
	s := e.session(TTL)
	s.CallbackURL = "http://127.0.0.1:45678/callback"
	s.CallbackSessionID = "cli-session-1"
	noErr(t, "Create", e.store.Create(e.ctx, s))
	want := s.StaticPart()
	if want.ExpiresAt != (time.Time{}) || want.ID != s.ID || want.Secret != s.Secret {
		t.Fatalf("StaticPart of %+v is %+v", redact(s), redact(want))
	}
	for i := 0; i < 4; i++ { // again, so that cached answers are checked too
		got, err := e.store.Static(e.ctx, s.ID)
		noErr(t, "Static", err)
		sameSession(t, got, want)
	}
	e.poll(s.ID, "n1", 0)
	noErr(t, "Complete", e.store.Complete(e.ctx, s.ID, []byte(`{"kind":"BindingResponse"}`)))
	e.poll(s.ID, "n2", 0)
	for i := 0; i < 4; i++ {
		got, err := e.store.Static(e.ctx, s.ID)
		noErr(t, "Static after polls and Complete", err)
		sameSession(t, got, want)
	}
}

func testStaticUnknown(t *testing.T, e *env) {
	_, err := e.store.Static(e.ctx, "no-such-session")
	wantErr(t, "Static unknown", err, sessions.ErrNotFound)
}

// testStaticRecreated: a session deleted and created again under the same
// ID with another secret. A caller that checks a signature with Static and
// then polls must never have its poll recorded with the old secret: the
// poll either succeeds after a Static that returned the new session's
// part, or fails with ErrStaleStatic and changes nothing, and a few
// rounds of Static and RecordPoll succeed.
func testStaticRecreated(t *testing.T, e *env) {
	s := e.create()
	for i := 0; i < 4; i++ { // every replica of a ring may cache it
		_, err := e.store.Static(e.ctx, s.ID)
		noErr(t, "Static", err)
	}
	noErr(t, "Delete", e.store.Delete(e.ctx, s.ID))
	again := e.session(TTL)
	again.ID = s.ID
	noErr(t, "Create again", e.store.Create(e.ctx, again))
	for attempt := 0; ; attempt++ {
		if attempt == 8 {
			t.Fatal("no poll succeeded after 8 rounds of Static and RecordPoll")
		}
		st, err := e.store.Static(e.ctx, s.ID)
		noErr(t, "Static", err)
		// The same nonce and a long interval every round: a refused round
		// that had spent the nonce or counted as a poll fails the next.
		_, err = e.store.RecordPoll(e.ctx, s.ID, "n1", time.Hour)
		if errors.Is(err, sessions.ErrStaleStatic) {
			continue
		}
		noErr(t, "RecordPoll", err)
		if st.Secret != again.Secret {
			t.Fatal("a poll was recorded after Static returned the deleted session's secret")
		}
		return
	}
}

func testCreateDuplicate(t *testing.T, e *env) {
	s := e.create()
	dup := s
	dup.Secret = "another-secret"
	wantErr(t, "Create duplicate", e.store.Create(e.ctx, dup), sessions.ErrExists)
	if got := e.get(s.ID); got.Secret != s.Secret {
		t.Fatal("a refused duplicate Create replaced the stored session")
	}
}

// fill creates sessions living ttl until the store refuses one with ErrFull
// and returns the stored ones and the refused one. A store made of several
// parts (a hashring) may bound each part, so at least MaxSessions fit.
func (e *env) fill(ttl time.Duration) (stored []sessions.Session, refused sessions.Session) {
	e.t.Helper()
	for i := 0; i < 100*e.limits.MaxSessions; i++ {
		s := e.session(ttl)
		err := e.store.Create(e.ctx, s)
		if errors.Is(err, sessions.ErrFull) {
			if len(stored) < e.limits.MaxSessions {
				e.t.Fatalf("ErrFull after %d sessions, want at least MaxSessions=%d", len(stored), e.limits.MaxSessions)
			}
			return stored, s
		}
		noErr(e.t, "Create", err)
		stored = append(stored, s)
	}
	e.t.Fatalf("store took %d sessions without ErrFull, MaxSessions=%d", len(stored), e.limits.MaxSessions)
	return nil, sessions.Session{}
}

var smallLimits = sessions.Limits{MaxSessions: 3, MaxNoncesPerSession: 16, MaxResponseBytes: 1024, Grace: time.Minute}

func testFull(t *testing.T, e *env) {
	e.withLimits(smallLimits)
	stored, refused := e.fill(TTL)
	_, err := e.store.Get(e.ctx, refused.ID)
	wantErr(t, "Get of a refused session", err, sessions.ErrNotFound)
	e.clock.Advance(TTL / 2)
	wantErr(t, "Create again while full", e.store.Create(e.ctx, refused), sessions.ErrFull)
	for _, s := range stored {
		e.get(s.ID)
	}
}

func testFullRecoversAfterExpiry(t *testing.T, e *env) {
	e.withLimits(smallLimits)
	_, refused := e.fill(time.Minute)
	e.clock.Advance(time.Minute + time.Second)
	refused.CreatedAt = e.clock.Now()
	refused.ExpiresAt = refused.CreatedAt.Add(TTL)
	// Expired sessions must not count, even if nobody touched them.
	noErr(t, "Create after the sessions expired", e.store.Create(e.ctx, refused))
	e.get(refused.ID)
}

func testFullRecoversAfterDelete(t *testing.T, e *env) {
	e.withLimits(smallLimits)
	stored, refused := e.fill(TTL)
	for _, s := range stored {
		noErr(t, "Delete", e.store.Delete(e.ctx, s.ID))
	}
	noErr(t, "Create after Delete", e.store.Create(e.ctx, refused))
}

func testFullRecoversAfterGrace(t *testing.T, e *env) {
	e.withLimits(smallLimits)
	stored, refused := e.fill(TTL)
	for _, s := range stored {
		noErr(t, "Complete", e.store.Complete(e.ctx, s.ID, []byte(`{"kind":"BindingResponse"}`)))
		e.poll(s.ID, "n1", time.Second)
	}
	wantErr(t, "Create when full", e.store.Create(e.ctx, refused), sessions.ErrFull)
	e.clock.Advance(time.Minute + time.Second)
	// The sessions' TTL is far away, but their grace period is over.
	noErr(t, "Create after the grace period", e.store.Create(e.ctx, refused))
}

func testNonceSingleUse(t *testing.T, e *env) {
	s := e.create()
	noErr(t, "UseNonce a", e.store.UseNonce(e.ctx, s.ID, "nonce-a"))
	wantErr(t, "UseNonce a again", e.store.UseNonce(e.ctx, s.ID, "nonce-a"), sessions.ErrNonceUsed)
	_, err := e.store.RecordPoll(e.ctx, s.ID, "nonce-a", 0)
	wantErr(t, "RecordPoll with a nonce UseNonce used", err, sessions.ErrNonceUsed)
	if got := e.get(s.ID); !got.LastPollAt.IsZero() {
		t.Fatal("a poll refused for its nonce was recorded")
	}
	e.poll(s.ID, "nonce-b", 0)
	wantErr(t, "UseNonce with a nonce RecordPoll used", e.store.UseNonce(e.ctx, s.ID, "nonce-b"), sessions.ErrNonceUsed)
	_, err = e.store.RecordPoll(e.ctx, s.ID, "nonce-b", 0)
	wantErr(t, "RecordPoll b again", err, sessions.ErrNonceUsed)
}

func testNoncePerSession(t *testing.T, e *env) {
	a, b := e.create(), e.create()
	noErr(t, "UseNonce on a", e.store.UseNonce(e.ctx, a.ID, "shared-nonce"))
	noErr(t, "the same nonce on another session", e.store.UseNonce(e.ctx, b.ID, "shared-nonce"))
}

func testNonceCap(t *testing.T, e *env) {
	e.withLimits(sessions.Limits{MaxSessions: 8, MaxNoncesPerSession: 4, MaxResponseBytes: 1024, Grace: time.Minute})
	s := e.create()
	for i := 0; i < 3; i++ {
		noErr(t, "UseNonce", e.store.UseNonce(e.ctx, s.ID, fmt.Sprintf("n%d", i)))
	}
	e.poll(s.ID, "n3", 0) // polls count against the same bound
	wantErr(t, "UseNonce beyond the cap", e.store.UseNonce(e.ctx, s.ID, "n4"), sessions.ErrTooManyNonces)
	_, err := e.store.RecordPoll(e.ctx, s.ID, "n5", 0)
	wantErr(t, "RecordPoll beyond the cap", err, sessions.ErrTooManyNonces)
	// The cap is per session.
	other := e.create()
	noErr(t, "UseNonce on another session", e.store.UseNonce(e.ctx, other.ID, "n4"))
}

func testUnknownSession(t *testing.T, e *env) {
	const id = "no-such-session"
	wantErr(t, "UseNonce", e.store.UseNonce(e.ctx, id, "n"), sessions.ErrNotFound)
	_, err := e.store.RecordPoll(e.ctx, id, "n", time.Second)
	wantErr(t, "RecordPoll", err, sessions.ErrNotFound)
	wantErr(t, "Complete", e.store.Complete(e.ctx, id, []byte("{}")), sessions.ErrNotFound)
	wantErr(t, "Deny", e.store.Deny(e.ctx, id, "no"), sessions.ErrNotFound)
}

func testPollRecordsTime(t *testing.T, e *env) {
	s := e.create()
	e.clock.Advance(3 * time.Second)
	got := e.poll(s.ID, "n1", 2*time.Second)
	want := s
	want.LastPollAt = e.clock.Now()
	sameSession(t, got, want)
	sameSession(t, e.get(s.ID), want)
}

func testPollTooSoon(t *testing.T, e *env) {
	const interval = 2 * time.Second
	s := e.create()
	first := e.clock.Now()
	e.poll(s.ID, "n1", interval)

	e.clock.Advance(500 * time.Millisecond)
	_, err := e.store.RecordPoll(e.ctx, s.ID, "n2", interval)
	wantRetryAfter(t, err, 1500*time.Millisecond)
	sameTime(t, "LastPollAt after a too-soon poll", e.get(s.ID).LastPollAt, first)

	// Had the too-soon poll counted, the wait would now be 1s, not 0.5s.
	e.clock.Advance(time.Second)
	_, err = e.store.RecordPoll(e.ctx, s.ID, "n3", interval)
	wantRetryAfter(t, err, 500*time.Millisecond)

	e.clock.Advance(500 * time.Millisecond)
	got := e.poll(s.ID, "n4", interval)
	sameTime(t, "LastPollAt", got.LastPollAt, e.clock.Now())

	// A too-soon poll with a used nonce is refused for its nonce.
	e.clock.Advance(100 * time.Millisecond)
	_, err = e.store.RecordPoll(e.ctx, s.ID, "n1", interval)
	wantErr(t, "too-soon replay of a used nonce", err, sessions.ErrNonceUsed)

	// A too-soon poll did not use its nonce.
	e.clock.Advance(interval)
	e.poll(s.ID, "n2", interval)
}

// Polls refused as too soon change nothing: however many there are, they
// neither use up the session's bounded nonces nor grow what it holds.
func testTooSoonSpendsNothing(t *testing.T, e *env) {
	const interval = 2 * time.Second
	e.withLimits(sessions.Limits{MaxSessions: 8, MaxNoncesPerSession: 3, MaxResponseBytes: 1024, Grace: time.Minute})
	s := e.create()
	e.poll(s.ID, "first", interval)
	for i := 0; i < 50; i++ {
		_, err := e.store.RecordPoll(e.ctx, s.ID, fmt.Sprintf("soon-%d", i), interval)
		wantErr(t, "poll too soon", err, sessions.ErrTooSoon)
	}
	// Two of the three nonces are left.
	e.clock.Advance(interval)
	e.poll(s.ID, "second", interval)
	e.clock.Advance(interval)
	e.poll(s.ID, "soon-0", interval)
	e.clock.Advance(interval)
	_, err := e.store.RecordPoll(e.ctx, s.ID, "fourth", interval)
	wantErr(t, "poll beyond the cap", err, sessions.ErrTooManyNonces)
}

func wantRetryAfter(t *testing.T, err error, want time.Duration) {
	t.Helper()
	wantErr(t, "RecordPoll too soon", err, sessions.ErrTooSoon)
	var ts *sessions.TooSoonError
	if !errors.As(err, &ts) {
		t.Fatalf("RecordPoll too soon: error %T is not a *sessions.TooSoonError", err)
	}
	if ts.RetryAfter != want {
		t.Fatalf("RetryAfter = %v, want %v", ts.RetryAfter, want)
	}
}

func testPollZeroInterval(t *testing.T, e *env) {
	s := e.create()
	for i := 0; i < 3; i++ {
		e.poll(s.ID, fmt.Sprintf("n%d", i), 0)
	}
}

func testComplete(t *testing.T, e *env) {
	s := e.create()
	resp := []byte(`{"kind":"BindingResponse"}`)
	noErr(t, "Complete", e.store.Complete(e.ctx, s.ID, resp))
	got := e.get(s.ID)
	if got.State != sessions.StateCompleted || !bytes.Equal(got.Response, resp) {
		t.Fatalf("after Complete: state %v, response %q", got.State, got.Response)
	}
	if !got.DeliveredAt.IsZero() {
		t.Fatal("DeliveredAt set before any poll")
	}
	wantErr(t, "Complete twice", e.store.Complete(e.ctx, s.ID, []byte(`{}`)), sessions.ErrNotPending)
	wantErr(t, "Deny after Complete", e.store.Deny(e.ctx, s.ID, "late"), sessions.ErrNotPending)
	if got := e.get(s.ID); got.State != sessions.StateCompleted || !bytes.Equal(got.Response, resp) || got.DenyReason != "" {
		t.Fatalf("a refused transition changed the session: %+v", redact(got))
	}
	polled := e.poll(s.ID, "n1", time.Second)
	if polled.State != sessions.StateCompleted || !bytes.Equal(polled.Response, resp) {
		t.Fatalf("poll after Complete: state %v, response %q", polled.State, polled.Response)
	}
}

func testCompleteCopiesResponse(t *testing.T, e *env) {
	s := e.create()
	buf := []byte(`{"kind":"BindingResponse"}`)
	want := bytes.Clone(buf)
	noErr(t, "Complete", e.store.Complete(e.ctx, s.ID, buf))
	copy(buf, "XXXXXXXX")
	if got := e.get(s.ID).Response; !bytes.Equal(got, want) {
		t.Fatalf("stored response follows the caller's buffer: %q", got)
	}
}

func testDeny(t *testing.T, e *env) {
	s := e.create()
	noErr(t, "Deny", e.store.Deny(e.ctx, s.ID, "the user cancelled"))
	got := e.get(s.ID)
	if got.State != sessions.StateDenied || got.DenyReason != "the user cancelled" || got.Response != nil {
		t.Fatalf("after Deny: %+v", redact(got))
	}
	wantErr(t, "Deny twice", e.store.Deny(e.ctx, s.ID, "again"), sessions.ErrNotPending)
	wantErr(t, "Complete after Deny", e.store.Complete(e.ctx, s.ID, []byte(`{}`)), sessions.ErrNotPending)
	polled := e.poll(s.ID, "n1", time.Second)
	if polled.State != sessions.StateDenied || polled.DenyReason != "the user cancelled" {
		t.Fatalf("poll after Deny: %+v", redact(polled))
	}
	sameTime(t, "ExpiresAt after Deny", polled.ExpiresAt, s.ExpiresAt)
}

func testResponseTooLarge(t *testing.T, e *env) {
	e.withLimits(sessions.Limits{MaxSessions: 8, MaxNoncesPerSession: 16, MaxResponseBytes: 16, Grace: time.Minute})
	s := e.create()
	wantErr(t, "Complete with 17 bytes", e.store.Complete(e.ctx, s.ID, bytes.Repeat([]byte("x"), 17)), sessions.ErrTooLarge)
	if got := e.get(s.ID); got.State != sessions.StatePending || got.Response != nil {
		t.Fatalf("a refused response changed the session: state %v", got.State)
	}
	noErr(t, "Complete with 16 bytes", e.store.Complete(e.ctx, s.ID, bytes.Repeat([]byte("x"), 16)))
}

func testCompleteExtendsExpiry(t *testing.T, e *env) {
	s := e.session(5 * time.Second) // expires well before the grace period ends
	noErr(t, "Create", e.store.Create(e.ctx, s))
	e.clock.Advance(2 * time.Second)
	noErr(t, "Complete", e.store.Complete(e.ctx, s.ID, []byte(`{}`)))
	min := e.clock.Now().Add(e.limits.Grace)
	if got := e.get(s.ID).ExpiresAt; got.Before(min) {
		t.Fatalf("ExpiresAt after Complete = %v, want at least %v", got, min)
	}
	e.clock.Advance(e.limits.Grace - time.Second)
	got := e.poll(s.ID, "n1", time.Second)
	if got.State != sessions.StateCompleted {
		t.Fatalf("State = %v, want completed", got.State)
	}

	// Complete never shortens a longer life.
	long := e.create()
	noErr(t, "Complete", e.store.Complete(e.ctx, long.ID, []byte(`{}`)))
	sameTime(t, "ExpiresAt after Complete", e.get(long.ID).ExpiresAt, long.ExpiresAt)
}

func testGracePeriod(t *testing.T, e *env) {
	s := e.create()
	resp := []byte(`{"kind":"BindingResponse"}`)
	noErr(t, "Complete", e.store.Complete(e.ctx, s.ID, resp))
	e.clock.Advance(time.Second)
	delivered := e.clock.Now()
	got := e.poll(s.ID, "n1", time.Second)
	sameTime(t, "DeliveredAt", got.DeliveredAt, delivered)
	sameTime(t, "ExpiresAt", got.ExpiresAt, delivered.Add(e.limits.Grace))

	e.clock.Advance(e.limits.Grace - time.Second)
	again := e.poll(s.ID, "n2", time.Second)
	if again.State != sessions.StateCompleted || !bytes.Equal(again.Response, resp) {
		t.Fatalf("poll within the grace period: state %v, response %q", again.State, again.Response)
	}
	sameTime(t, "DeliveredAt on a later poll", again.DeliveredAt, delivered)
	sameTime(t, "ExpiresAt on a later poll", again.ExpiresAt, delivered.Add(e.limits.Grace))

	e.clock.Advance(time.Second)
	_, err := e.store.RecordPoll(e.ctx, s.ID, "n3", time.Second)
	wantErr(t, "RecordPoll after the grace period", err, sessions.ErrNotFound)
	_, err = e.store.Get(e.ctx, s.ID)
	wantErr(t, "Get after the grace period", err, sessions.ErrNotFound)
}

func testGraceShortensExpiry(t *testing.T, e *env) {
	s := e.create()
	noErr(t, "Complete", e.store.Complete(e.ctx, s.ID, []byte(`{}`)))
	sameTime(t, "ExpiresAt before delivery", e.get(s.ID).ExpiresAt, s.ExpiresAt)
	e.clock.Advance(time.Minute)
	got := e.poll(s.ID, "n1", time.Second)
	want := e.clock.Now().Add(e.limits.Grace)
	if !want.Before(s.ExpiresAt) {
		t.Fatal("test setup: grace must end before the TTL")
	}
	sameTime(t, "ExpiresAt after delivery", got.ExpiresAt, want)
	sameTime(t, "stored ExpiresAt after delivery", e.get(s.ID).ExpiresAt, want)
}

func testExpiryAfterTTL(t *testing.T, e *env) {
	s := e.create()
	e.clock.Advance(TTL - time.Millisecond)
	e.get(s.ID)
	noErr(t, "UseNonce just before expiry", e.store.UseNonce(e.ctx, s.ID, "n1"))
	e.clock.Advance(2 * time.Millisecond)
	_, err := e.store.Get(e.ctx, s.ID)
	wantErr(t, "Get", err, sessions.ErrNotFound)
	wantErr(t, "UseNonce", e.store.UseNonce(e.ctx, s.ID, "n2"), sessions.ErrNotFound)
	_, err = e.store.RecordPoll(e.ctx, s.ID, "n3", time.Second)
	wantErr(t, "RecordPoll", err, sessions.ErrNotFound)
	wantErr(t, "Complete", e.store.Complete(e.ctx, s.ID, []byte(`{}`)), sessions.ErrNotFound)
	wantErr(t, "Deny", e.store.Deny(e.ctx, s.ID, "no"), sessions.ErrNotFound)

	// Untouched sessions expire too.
	u := e.create()
	e.clock.Advance(TTL + time.Second)
	_, err = e.store.Get(e.ctx, u.ID)
	wantErr(t, "Get of an untouched expired session", err, sessions.ErrNotFound)
}

func testRecreateAfterExpiry(t *testing.T, e *env) {
	s := e.create()
	noErr(t, "UseNonce", e.store.UseNonce(e.ctx, s.ID, "n1"))
	e.clock.Advance(TTL + time.Second)
	again := s
	again.CreatedAt = e.clock.Now()
	again.ExpiresAt = again.CreatedAt.Add(TTL)
	noErr(t, "Create with the ID of an expired session", e.store.Create(e.ctx, again))
	sameSession(t, e.get(s.ID), again)
	// Nothing of the old session survives.
	noErr(t, "UseNonce of the expired session's nonce", e.store.UseNonce(e.ctx, s.ID, "n1"))
}

func testDelete(t *testing.T, e *env) {
	s := e.create()
	keep := e.create()
	noErr(t, "Delete", e.store.Delete(e.ctx, s.ID))
	_, err := e.store.Get(e.ctx, s.ID)
	wantErr(t, "Get after Delete", err, sessions.ErrNotFound)
	_, err = e.store.RecordPoll(e.ctx, s.ID, "n1", time.Second)
	wantErr(t, "RecordPoll after Delete", err, sessions.ErrNotFound)
	noErr(t, "Delete twice", e.store.Delete(e.ctx, s.ID))
	noErr(t, "Delete unknown", e.store.Delete(e.ctx, "no-such-session"))
	e.get(keep.ID)
	noErr(t, "Create with a deleted ID", e.store.Create(e.ctx, s))
}

const racers = 50

// race runs fn in racers goroutines started together and counts the
// outcomes by error.
func race(t *testing.T, fn func(i int) error) (ok int, errs map[error]int) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		mu    sync.Mutex
	)
	errs = map[error]int{}
	for i := 0; i < racers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := fn(i)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				ok++
				return
			}
			for _, known := range []error{sessions.ErrNonceUsed, sessions.ErrTooSoon, sessions.ErrNotPending, sessions.ErrFull, sessions.ErrExists} {
				if errors.Is(err, known) {
					errs[known]++
					return
				}
			}
			t.Errorf("racer %d: unexpected error %v", i, err)
		}()
	}
	close(start)
	wg.Wait()
	return ok, errs
}

func wantRace(t *testing.T, what string, ok int, errs map[error]int, wantOK int, loser error) {
	t.Helper()
	if ok != wantOK || errs[loser] != racers-wantOK {
		t.Fatalf("%s: %d succeeded (want %d), losers %v (want %d × %v)", what, ok, wantOK, errs, racers-wantOK, loser)
	}
}

func testConcurrentNonce(t *testing.T, e *env) {
	s := e.create()
	ok, errs := race(t, func(int) error { return e.store.UseNonce(e.ctx, s.ID, "the-nonce") })
	wantRace(t, "UseNonce of one nonce", ok, errs, 1, sessions.ErrNonceUsed)

	p := e.create()
	ok, errs = race(t, func(int) error {
		_, err := e.store.RecordPoll(e.ctx, p.ID, "the-nonce", 0)
		return err
	})
	wantRace(t, "RecordPoll of one nonce", ok, errs, 1, sessions.ErrNonceUsed)
}

func testConcurrentPoll(t *testing.T, e *env) {
	e.withLimits(sessions.Limits{MaxSessions: 8, MaxNoncesPerSession: 2 * racers, MaxResponseBytes: 1024, Grace: time.Minute})
	s := e.create()
	var delivered atomic.Int32
	noErr(t, "Complete", e.store.Complete(e.ctx, s.ID, []byte(`{}`)))
	ok, errs := race(t, func(i int) error {
		got, err := e.store.RecordPoll(e.ctx, s.ID, fmt.Sprintf("n%d", i), time.Hour)
		if err == nil && !got.DeliveredAt.IsZero() {
			delivered.Add(1)
		}
		return err
	})
	wantRace(t, "RecordPoll within one interval", ok, errs, 1, sessions.ErrTooSoon)
	if delivered.Load() != 1 {
		t.Fatalf("%d polls saw the response delivered, want 1", delivered.Load())
	}
}

func testConcurrentCompleteDeny(t *testing.T, e *env) {
	s := e.create()
	ok, errs := race(t, func(i int) error {
		if i%2 == 0 {
			return e.store.Deny(e.ctx, s.ID, fmt.Sprintf("reason %d", i))
		}
		return e.store.Complete(e.ctx, s.ID, []byte(fmt.Sprintf(`{"n":%d}`, i)))
	})
	wantRace(t, "Complete and Deny", ok, errs, 1, sessions.ErrNotPending)
	got := e.get(s.ID)
	if (got.State == sessions.StateCompleted) == (got.DenyReason != "") || got.State == sessions.StatePending {
		t.Fatalf("session after the race is inconsistent: %+v", redact(got))
	}
}

func testConcurrentCreate(t *testing.T, e *env) {
	base := e.session(TTL)
	ok, errs := race(t, func(i int) error {
		s := base
		s.ID = fmt.Sprintf("%s-%d", base.ID, i)
		return e.store.Create(e.ctx, s)
	})
	if ok < e.limits.MaxSessions || ok == racers || ok+errs[sessions.ErrFull] != racers {
		t.Fatalf("Create racing beyond MaxSessions=%d: %d succeeded, losers %v", e.limits.MaxSessions, ok, errs)
	}
}

func testConcurrentCreateSameID(t *testing.T, e *env) {
	s := e.session(TTL)
	ok, errs := race(t, func(i int) error {
		c := s
		c.Secret = fmt.Sprintf("secret-%d", i)
		return e.store.Create(e.ctx, c)
	})
	wantRace(t, "Create of one ID", ok, errs, 1, sessions.ErrExists)
}
