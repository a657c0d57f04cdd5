// Package conformance is the conformance suite every sessions.Store must pass
// unchanged: it pins down the behaviour that the Store interface's doc
// comments describe, one subtest per rule.
//
// The store under test must take every time decision (poll intervals, the
// delivery time it records) from the clock it is given, so the suite can
// move time without sleeping. A store may show its own writes a moment
// late (a store read through an informer does): the suite waits up to
// ShowWithin for a write to show, never for a refusal.
package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil"

	"github.com/kbprovider/backend/internal/sessions"
)

// NewStoreFunc returns a fresh, empty store bounded by limits that reads the
// time from clock. It registers its own cleanup with t.
type NewStoreFunc func(t *testing.T, limits sessions.Limits, clock *testutil.Clock) sessions.Store

// Start is the time every test's clock starts at.
var Start = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

// TTL is the lifetime of the sessions the suite uses.
const TTL = 10 * time.Minute

// ShowWithin is how long a store may take to show its own write.
const ShowWithin = 10 * time.Second

// testNS is the provider namespace the tests' responses are issued for.
const testNS = "kb-consumer-1"

// testLimits are small limits, so that limits are reached quickly.
var testLimits = sessions.Limits{
	MaxPolledSessions:   8,
	MaxNoncesPerSession: 16,
	MaxResponseBytes:    1024,
	Grace:               60 * time.Second,
}

// budgetLimits are testLimits with a write budget small enough to spend.
var budgetLimits = func() sessions.Limits {
	l := testLimits
	l.WriteRate, l.WriteBurst = 1, 3
	return l
}()

// Run runs the conformance suite against stores made by newStore.
func Run(t *testing.T, newStore NewStoreFunc) {
	for _, tc := range []struct {
		name   string
		fn     func(*testing.T, *env)
		limits *sessions.Limits // nil: testLimits
	}{
		{"UnknownIsPending", testUnknownIsPending, nil},
		{"Complete", testComplete, nil},
		{"CompleteCopiesResponse", testCompleteCopiesResponse, nil},
		{"Deny", testDeny, nil},
		{"OneOutcome", testOneOutcome, nil},
		{"ResponseTooLarge", testResponseTooLarge, nil},
		{"DeliverRecordsFirst", testDeliverRecordsFirst, nil},
		{"DeliverPending", testDeliverPending, nil},
		{"UseOnce", testUseOnce, nil},
		{"NonceSingleUse", testNonceSingleUse, nil},
		{"NoncePerSession", testNoncePerSession, nil},
		{"NonceCap", testNonceCap, nil},
		{"PollTooSoon", testPollTooSoon, nil},
		{"TooSoonSpendsNothing", testTooSoonSpendsNothing, nil},
		{"PollZeroInterval", testPollZeroInterval, nil},
		{"PolledSessionsBounded", testPolledSessionsBounded, nil},
		{"PollAfterExpiry", testPollAfterExpiry, nil},
		{"ConcurrentOutcome", testConcurrentOutcome, nil},
		{"ConcurrentUseOnce", testConcurrentUseOnce, nil},
		{"ConcurrentNonce", testConcurrentNonce, nil},
		{"WaitComplete", testWaitComplete, nil},
		{"WaitDeny", testWaitDeny, nil},
		{"WaitEndsWithContext", testWaitEndsWithContext, nil},
		{"WaitFinalAtOnce", testWaitFinalAtOnce, nil},
		{"WaitMany", testWaitMany, nil},
		{"WriteBudget", testWriteBudget, &budgetLimits},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.ClockAt(Start)
			e := &env{t: t, clock: clock, ctx: context.Background()}
			limits := testLimits
			if tc.limits != nil {
				limits = *tc.limits
			}
			e.store = newStore(t, limits, clock)
			tc.fn(t, e)
		})
	}
}

type env struct {
	t     *testing.T
	ctx   context.Context
	clock *testutil.Clock
	store sessions.Store
	seq   int
}

// id returns a session ID no other subtest uses (stores may share a
// database between subtests).
func (e *env) id() string {
	e.seq++
	return fmt.Sprintf("%s-%d-%d", e.t.Name(), time.Now().UnixNano(), e.seq)
}

func (e *env) expires() time.Time { return e.clock.Now().Add(TTL) }

// shows waits until the outcome of id is in state.
func (e *env) shows(id string, state sessions.State) sessions.Outcome {
	e.t.Helper()
	deadline := time.Now().Add(ShowWithin)
	for {
		o, err := e.store.Outcome(e.ctx, id)
		noErr(e.t, "Outcome", err)
		if o.State == state {
			return o
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Outcome(%s) = %v after %s, want %v", id, o.State, ShowWithin, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deliver calls Deliver until the completed outcome shows to it.
func (e *env) deliver(id string) time.Time {
	e.t.Helper()
	deadline := time.Now().Add(ShowWithin)
	for {
		at, err := e.store.Deliver(e.ctx, id, e.expires())
		if err == nil {
			return at
		}
		if !errors.Is(err, sessions.ErrNotPending) || time.Now().After(deadline) {
			e.t.Fatalf("Deliver(%s): %v", id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) admit(id, nonce string, interval time.Duration) error {
	return e.store.AdmitPoll(e.ctx, id, nonce, e.expires(), interval)
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

func testUnknownIsPending(t *testing.T, e *env) {
	o, err := e.store.Outcome(e.ctx, e.id())
	noErr(t, "Outcome", err)
	if o.State != sessions.StatePending || o.Response != nil || o.DenyReason != "" {
		t.Fatalf("Outcome of an unknown session = %+v, want the zero (pending) Outcome", o)
	}
}

func testComplete(t *testing.T, e *env) {
	id := e.id()
	resp := []byte(`{"kind":"BindingResponse"}`)
	noErr(t, "Complete", e.store.Complete(e.ctx, id, e.expires(), testNS, resp))
	o := e.shows(id, sessions.StateCompleted)
	if !bytes.Equal(o.Response, resp) || o.DenyReason != "" || o.Namespace != testNS {
		t.Fatalf("Outcome = %+v, want the response %s for namespace %s", o, resp, testNS)
	}
	if p, ok := e.store.(sessions.Peeker); ok {
		// The namespace is kept with what a poll decides on: it needs no
		// read of the response.
		peeked, rec, err := p.Peek(e.ctx, id)
		noErr(t, "Peek", err)
		if peeked.State != sessions.StateCompleted || peeked.Namespace != testNS || rec == "" {
			t.Fatalf("Peek = %+v, %q, want completed for namespace %s with a record", peeked, rec, testNS)
		}
	}
	other, err := e.store.Outcome(e.ctx, e.id())
	noErr(t, "Outcome", err)
	if other.State != sessions.StatePending {
		t.Fatalf("another session became %v", other.State)
	}
}

func testCompleteCopiesResponse(t *testing.T, e *env) {
	id := e.id()
	resp := []byte(`{"a":1}`)
	noErr(t, "Complete", e.store.Complete(e.ctx, id, e.expires(), testNS, resp))
	resp[2] = 'X'
	if o := e.shows(id, sessions.StateCompleted); string(o.Response) != `{"a":1}` {
		t.Fatalf("the stored response changed with the caller's slice: %s", o.Response)
	}
}

func testDeny(t *testing.T, e *env) {
	id := e.id()
	noErr(t, "Deny", e.store.Deny(e.ctx, id, e.expires(), "the user cancelled"))
	o := e.shows(id, sessions.StateDenied)
	if o.DenyReason != "the user cancelled" || o.Response != nil || o.Namespace != "" {
		t.Fatalf("Outcome = %+v", o)
	}
	_, err := e.store.Deliver(e.ctx, id, e.expires())
	wantErr(t, "Deliver of a denied session", err, sessions.ErrNotPending)
}

func testOneOutcome(t *testing.T, e *env) {
	id := e.id()
	noErr(t, "Complete", e.store.Complete(e.ctx, id, e.expires(), testNS, []byte(`{}`)))
	wantErr(t, "second Complete", e.store.Complete(e.ctx, id, e.expires(), "kb-consumer-2", []byte(`{"x":1}`)), sessions.ErrNotPending)
	wantErr(t, "Deny after Complete", e.store.Deny(e.ctx, id, e.expires(), "no"), sessions.ErrNotPending)
	if o := e.shows(id, sessions.StateCompleted); string(o.Response) != `{}` || o.Namespace != testNS {
		t.Fatalf("the first outcome was replaced: %s for namespace %q", o.Response, o.Namespace)
	}
	id2 := e.id()
	noErr(t, "Deny", e.store.Deny(e.ctx, id2, e.expires(), "no"))
	wantErr(t, "Complete after Deny", e.store.Complete(e.ctx, id2, e.expires(), testNS, []byte(`{}`)), sessions.ErrNotPending)
}

func testResponseTooLarge(t *testing.T, e *env) {
	id := e.id()
	big := bytes.Repeat([]byte("x"), testLimits.MaxResponseBytes+1)
	wantErr(t, "Complete with a large response", e.store.Complete(e.ctx, id, e.expires(), testNS, big), sessions.ErrTooLarge)
	o, err := e.store.Outcome(e.ctx, id)
	noErr(t, "Outcome", err)
	if o.State != sessions.StatePending {
		t.Fatalf("a refused Complete left %v", o.State)
	}
	noErr(t, "Complete at the limit", e.store.Complete(e.ctx, id, e.expires(), testNS, big[1:]))
}

func testDeliverRecordsFirst(t *testing.T, e *env) {
	id := e.id()
	noErr(t, "Complete", e.store.Complete(e.ctx, id, e.expires(), testNS, []byte(`{}`)))
	e.shows(id, sessions.StateCompleted)
	e.clock.Advance(3 * time.Second)
	first := e.deliver(id)
	if !first.Equal(e.clock.Now()) && first.Sub(e.clock.Now()).Abs() > time.Second {
		t.Fatalf("first delivery recorded at %v, want the clock's %v", first, e.clock.Now())
	}
	e.clock.Advance(30 * time.Second)
	again := e.deliver(id)
	if again.Sub(first).Abs() > time.Second {
		t.Fatalf("a later Deliver returned %v, want the first delivery %v", again, first)
	}
}

func testDeliverPending(t *testing.T, e *env) {
	_, err := e.store.Deliver(e.ctx, e.id(), e.expires())
	wantErr(t, "Deliver of a pending session", err, sessions.ErrNotPending)
}

func testUseOnce(t *testing.T, e *env) {
	a, b := e.id(), e.id()
	noErr(t, "UseOnce", e.store.UseOnce(e.ctx, a, e.expires()))
	wantErr(t, "UseOnce again", e.store.UseOnce(e.ctx, a, e.expires()), sessions.ErrNonceUsed)
	noErr(t, "UseOnce of another key", e.store.UseOnce(e.ctx, b, e.expires()))
}

func testNonceSingleUse(t *testing.T, e *env) {
	id := e.id()
	noErr(t, "first poll", e.admit(id, "nonce-1", 0))
	wantErr(t, "same nonce", e.admit(id, "nonce-1", 0), sessions.ErrNonceUsed)
	noErr(t, "next nonce", e.admit(id, "nonce-2", 0))
}

func testNoncePerSession(t *testing.T, e *env) {
	a, b := e.id(), e.id()
	noErr(t, "session a", e.admit(a, "shared", 0))
	noErr(t, "session b, same nonce", e.admit(b, "shared", 0))
}

func testNonceCap(t *testing.T, e *env) {
	id := e.id()
	for i := range testLimits.MaxNoncesPerSession {
		noErr(t, "poll", e.admit(id, fmt.Sprint("n", i), 0))
	}
	wantErr(t, "poll beyond the cap", e.admit(id, "one-more", 0), sessions.ErrTooManyNonces)
	wantErr(t, "a used nonce beyond the cap", e.admit(id, "n0", 0), sessions.ErrNonceUsed)
}

func testPollTooSoon(t *testing.T, e *env) {
	id := e.id()
	noErr(t, "first poll", e.admit(id, "a", 2*time.Second))
	e.clock.Advance(500 * time.Millisecond)
	err := e.admit(id, "b", 2*time.Second)
	var soon *sessions.TooSoonError
	if !errors.As(err, &soon) || !errors.Is(err, sessions.ErrTooSoon) {
		t.Fatalf("poll after 0.5s of 2s: %v, want a TooSoonError", err)
	}
	if soon.RetryAfter <= 0 || soon.RetryAfter > 1500*time.Millisecond+time.Second {
		t.Fatalf("RetryAfter = %v, want about 1.5s", soon.RetryAfter)
	}
	e.clock.Advance(1500 * time.Millisecond)
	noErr(t, "poll after the interval", e.admit(id, "b", 2*time.Second))
}

func testTooSoonSpendsNothing(t *testing.T, e *env) {
	id := e.id()
	noErr(t, "first poll", e.admit(id, "a", time.Second))
	for i := range 3 * testLimits.MaxNoncesPerSession {
		wantErr(t, "too soon", e.admit(id, fmt.Sprint("soon", i), time.Second), sessions.ErrTooSoon)
	}
	e.clock.Advance(time.Second)
	noErr(t, "a nonce refused as too soon is unused", e.admit(id, "soon0", time.Second))
	wantErr(t, "a used nonce is refused as used even too soon", e.admit(id, "a", time.Second), sessions.ErrNonceUsed)
}

func testPollZeroInterval(t *testing.T, e *env) {
	id := e.id()
	for i := range 5 {
		noErr(t, "poll", e.admit(id, fmt.Sprint(i), 0))
	}
}

// testPolledSessionsBounded: past MaxPolledSessions the store keeps
// admitting sessions that expire later, rather than growing or refusing
// them; the session expiring first is evicted, and neither its used nonce
// nor a fresh one is admitted again. Enough sessions overfill every
// replica's table of a ring, whose share of the hash ring can be well
// under its fair one: 40 times the table's size.
func testPolledSessionsBounded(t *testing.T, e *env) {
	victim := e.id()
	victimExp := e.expires()
	noErr(t, "the victim's poll", e.store.AdmitPoll(e.ctx, victim, "used", victimExp, 0))
	for i := range 40 * testLimits.MaxPolledSessions {
		exp := victimExp.Add(time.Duration(i+1) * time.Second)
		noErr(t, "poll of a new session", e.store.AdmitPoll(e.ctx, fmt.Sprint(e.id(), i), "n", exp, 0))
	}
	for _, nonce := range []string{"used", "fresh"} {
		wantErr(t, "the evicted victim polled with nonce "+nonce,
			e.store.AdmitPoll(e.ctx, victim, nonce, victimExp, 0), sessions.ErrSessionOver)
	}
}

// testPollAfterExpiry: once the expiry AdmitPoll is given has passed on
// the store's clock, the session's polls are over, its used nonce too.
func testPollAfterExpiry(t *testing.T, e *env) {
	id, exp := e.id(), e.expires()
	noErr(t, "first poll", e.store.AdmitPoll(e.ctx, id, "used", exp, 0))
	e.clock.Advance(exp.Sub(e.clock.Now()))
	wantErr(t, "a used nonce at the expiry", e.store.AdmitPoll(e.ctx, id, "used", exp, 0), sessions.ErrSessionOver)
	wantErr(t, "a fresh nonce at the expiry", e.store.AdmitPoll(e.ctx, id, "fresh", exp, 0), sessions.ErrSessionOver)
}

func testConcurrentOutcome(t *testing.T, e *env) {
	id := e.id()
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			var err error
			if i%2 == 0 {
				err = e.store.Complete(e.ctx, id, e.expires(), fmt.Sprint("kb-consumer-", i), fmt.Appendf(nil, `{"i":%d}`, i))
			} else {
				err = e.store.Deny(e.ctx, id, e.expires(), fmt.Sprint("reason ", i))
			}
			switch {
			case err == nil:
				wins.Add(1)
			case !errors.Is(err, sessions.ErrNotPending):
				t.Errorf("concurrent outcome: %v", err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d concurrent outcomes were recorded, want exactly 1", wins.Load())
	}
	o, err := e.store.Outcome(e.ctx, id)
	noErr(t, "Outcome", err)
	var i int
	if o.State == sessions.StateCompleted {
		// The response and its namespace are of the same write.
		if _, err := fmt.Sscanf(string(o.Response), `{"i":%d}`, &i); err != nil || o.Namespace != fmt.Sprint("kb-consumer-", i) {
			t.Fatalf("the outcome recorded %s for namespace %q", o.Response, o.Namespace)
		}
	}
}

func testConcurrentUseOnce(t *testing.T, e *env) {
	key := e.id()
	var wins atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			switch err := e.store.UseOnce(e.ctx, key, e.expires()); {
			case err == nil:
				wins.Add(1)
			case !errors.Is(err, sessions.ErrNonceUsed):
				t.Errorf("UseOnce: %v", err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("a mark was spent %d times, want once", wins.Load())
	}
}

func testConcurrentNonce(t *testing.T, e *env) {
	id := e.id()
	var wins atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			switch err := e.admit(id, "same", 0); {
			case err == nil:
				wins.Add(1)
			case !errors.Is(err, sessions.ErrNonceUsed):
				t.Errorf("AdmitPoll: %v", err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("a nonce was admitted %d times, want once", wins.Load())
	}
}

// waitFor runs Wait in the background.
func (e *env) waitFor(ctx context.Context, id string) <-chan sessions.Outcome {
	ch := make(chan sessions.Outcome, 1)
	go func() {
		o, err := e.store.Wait(ctx, id)
		if err != nil {
			e.t.Errorf("Wait: %v", err)
		}
		ch <- o
	}()
	return ch
}

func (e *env) received(ch <-chan sessions.Outcome) sessions.Outcome {
	e.t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(ShowWithin):
		e.t.Fatalf("Wait did not return within %s", ShowWithin)
		return sessions.Outcome{}
	}
}

func testWaitComplete(t *testing.T, e *env) {
	id := e.id()
	ch := e.waitFor(e.ctx, id)
	time.Sleep(50 * time.Millisecond)
	noErr(t, "Complete", e.store.Complete(e.ctx, id, e.expires(), testNS, []byte(`{"done":true}`)))
	if o := e.received(ch); o.State != sessions.StateCompleted || string(o.Response) != `{"done":true}` || o.Namespace != testNS {
		t.Fatalf("Wait returned %+v", o)
	}
}

func testWaitDeny(t *testing.T, e *env) {
	id := e.id()
	ch := e.waitFor(e.ctx, id)
	time.Sleep(50 * time.Millisecond)
	noErr(t, "Deny", e.store.Deny(e.ctx, id, e.expires(), "not allowed"))
	if o := e.received(ch); o.State != sessions.StateDenied || o.DenyReason != "not allowed" {
		t.Fatalf("Wait returned %+v", o)
	}
}

func testWaitEndsWithContext(t *testing.T, e *env) {
	ctx, cancel := context.WithTimeout(e.ctx, 100*time.Millisecond)
	defer cancel()
	o, err := e.store.Wait(ctx, e.id())
	noErr(t, "Wait", err)
	if o.State != sessions.StatePending {
		t.Fatalf("Wait of a pending session returned %v when its context ended", o.State)
	}
}

func testWaitFinalAtOnce(t *testing.T, e *env) {
	id := e.id()
	noErr(t, "Deny", e.store.Deny(e.ctx, id, e.expires(), "no"))
	e.shows(id, sessions.StateDenied)
	ctx, cancel := context.WithTimeout(e.ctx, ShowWithin)
	defer cancel()
	o, err := e.store.Wait(ctx, id)
	noErr(t, "Wait", err)
	if o.State != sessions.StateDenied || ctx.Err() != nil {
		t.Fatalf("Wait of an ended session: %v (context %v)", o.State, ctx.Err())
	}
}

func testWaitMany(t *testing.T, e *env) {
	id := e.id()
	var chs []<-chan sessions.Outcome
	for range 20 {
		chs = append(chs, e.waitFor(e.ctx, id))
	}
	time.Sleep(50 * time.Millisecond)
	noErr(t, "Complete", e.store.Complete(e.ctx, id, e.expires(), testNS, []byte(`{}`)))
	for _, ch := range chs {
		if o := e.received(ch); o.State != sessions.StateCompleted {
			t.Fatalf("a waiter got %v", o.State)
		}
	}
}

// testWriteBudget: writes beyond the burst of the write budget fail at
// once with ErrOverBudget (an ErrUnavailable: the caller answers 503) and
// write nothing; the budget refills at WriteRate on the store's clock.
func testWriteBudget(t *testing.T, e *env) {
	noErr(t, "UseOnce within the budget", e.store.UseOnce(e.ctx, e.id(), e.expires()))
	noErr(t, "Deny within the budget", e.store.Deny(e.ctx, e.id(), e.expires(), "no"))
	noErr(t, "Complete within the budget", e.store.Complete(e.ctx, e.id(), e.expires(), testNS, []byte(`{}`)))
	key, id := e.id(), e.id()
	err := e.store.UseOnce(e.ctx, key, e.expires())
	wantErr(t, "UseOnce past the budget", err, sessions.ErrOverBudget)
	wantErr(t, "UseOnce past the budget", err, sessions.ErrUnavailable)
	wantErr(t, "Deny past the budget", e.store.Deny(e.ctx, id, e.expires(), "no"), sessions.ErrOverBudget)
	wantErr(t, "Complete past the budget", e.store.Complete(e.ctx, id, e.expires(), testNS, []byte(`{}`)), sessions.ErrOverBudget)
	if o, err := e.store.Outcome(e.ctx, id); err != nil || o.State != sessions.StatePending {
		t.Fatalf("a refused write left %v (%v), want pending", o.State, err)
	}
	e.clock.Advance(time.Second)
	noErr(t, "a refused UseOnce spent nothing: the key after a second", e.store.UseOnce(e.ctx, key, e.expires()))
	wantErr(t, "a second write in that second", e.store.Deny(e.ctx, id, e.expires(), "no"), sessions.ErrOverBudget)
	e.clock.Advance(time.Second)
	noErr(t, "Deny after another second", e.store.Deny(e.ctx, id, e.expires(), "no"))
	e.shows(id, sessions.StateDenied)
}
