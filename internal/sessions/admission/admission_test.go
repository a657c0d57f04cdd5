package admission

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

var t0 = time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)

// Past its bound the table evicts the sessions expiring first, and never
// admits an evicted session again: its used nonce stays refused, and so
// does a fresh one. Sessions expiring later are admitted.
func TestEvictedNeverReadmitted(t *testing.T) {
	tab := New(sessions.Limits{MaxPolledSessions: 3, MaxNoncesPerSession: 4})
	victimExp := t0.Add(time.Minute)
	if err := tab.Admit("victim", "used", victimExp, t0, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := tab.Admit(fmt.Sprint("other", i), "n", victimExp.Add(time.Duration(i+1)*time.Second), t0, 0); err != nil {
			t.Fatalf("a later session refused: %v", err)
		}
	}
	if n, _ := tab.Len(); n != 3 {
		t.Fatalf("%d sessions remembered, want 3", n)
	}
	for _, nonce := range []string{"used", "fresh"} {
		if err := tab.Admit("victim", nonce, victimExp, t0, 0); !errors.Is(err, sessions.ErrSessionOver) {
			t.Fatalf("evicted victim polled with nonce %q: %v, want ErrSessionOver", nonce, err)
		}
	}
	// A session remembered keeps its nonces.
	if err := tab.Admit("other9", "n", victimExp.Add(10*time.Second), t0, 0); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("a remembered session's used nonce: %v, want ErrNonceUsed", err)
	}
	// A full table refuses a new session that would expire before every
	// remembered one instead of forgetting a later one.
	if err := tab.Admit("early", "n", victimExp.Add(time.Second/2), t0, 0); !errors.Is(err, sessions.ErrSessionOver) {
		t.Fatalf("a session expiring first into a full table: %v, want ErrSessionOver", err)
	}
}

// A session is over at its expiry on the table's clock, swept or not.
func TestExpiredRefused(t *testing.T) {
	tab := New(sessions.Limits{})
	exp := t0.Add(time.Minute)
	if err := tab.Admit("s", "a", exp, t0, 0); err != nil {
		t.Fatal(err)
	}
	if err := tab.Admit("s", "b", exp, exp, 0); !errors.Is(err, sessions.ErrSessionOver) {
		t.Fatalf("poll at the expiry: %v, want ErrSessionOver", err)
	}
	tab.Sweep(exp)
	if err := tab.Admit("s", "a", exp, exp.Add(time.Second), 0); !errors.Is(err, sessions.ErrSessionOver) {
		t.Fatalf("used nonce after the sweep: %v, want ErrSessionOver", err)
	}
}

// Expired sessions go on Sweep, and the nonce count follows.
func TestSweep(t *testing.T) {
	tab := New(sessions.Limits{MaxPolledSessions: 100, MaxNoncesPerSession: 10})
	for i := range 5 {
		for j := range 3 {
			if err := tab.Admit(fmt.Sprint(i), fmt.Sprint(j), t0.Add(time.Duration(i+1)*time.Minute), t0, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	tab.Sweep(t0.Add(3 * time.Minute)) // sessions 0, 1 and 2 expired
	if s, n := tab.Len(); s != 2 || n != 6 {
		t.Fatalf("after the sweep: %d sessions, %d nonces; want 2 and 6", s, n)
	}
	// Sweeping raises no watermark: a live session is admitted.
	if err := tab.Admit("5", "n", t0.Add(4*time.Minute), t0.Add(3*time.Minute), 0); err != nil {
		t.Fatalf("a live session after the sweep: %v", err)
	}
}

// The nonces of all sessions together stay within MaxNonces, also when
// sessions already remembered keep polling; the sessions evicted for it
// are refused from then on.
func TestNonceBound(t *testing.T) {
	const perSession, maxNonces = 64, 1 << 12
	tab := New(sessions.Limits{MaxPolledSessions: 10 * maxNonces / perSession, MaxNoncesPerSession: perSession})
	tab.maxNonces = maxNonces
	sessionsNeeded := maxNonces/perSession + 8
	exp := func(i int) time.Time { return t0.Add(time.Hour + time.Duration(i)*time.Second) }
	for j := range perSession {
		for i := range sessionsNeeded {
			err := tab.Admit(fmt.Sprint("s", i), fmt.Sprint(j), exp(i), t0, 0)
			if err != nil && !(i < 8 && errors.Is(err, sessions.ErrSessionOver)) {
				t.Fatalf("session %d, nonce %d: %v", i, j, err)
			}
		}
	}
	if _, n := tab.Len(); n > maxNonces {
		t.Fatalf("%d nonces remembered, more than the bound %d", n, maxNonces)
	}
	if err := tab.Admit("s0", "0", exp(0), t0, 0); !errors.Is(err, sessions.ErrSessionOver) {
		t.Fatalf("the session evicted first: %v, want ErrSessionOver", err)
	}
}

// TestBytesPerSession measures the heap a remembered session costs with
// one nonce, so that docs/sessions.md's bound stays true.
func TestBytesPerSession(t *testing.T) {
	const n = 100_000
	tab := New(sessions.Limits{MaxPolledSessions: n})
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("session-", i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i, id := range ids {
		if err := tab.Admit(id, "n", t0.Add(time.Hour+time.Duration(i)), t0, 0); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per session with one nonce", per)
	if per > 200 {
		t.Fatalf("%.0f bytes per session, docs/sessions.md says at most 200", per)
	}
	runtime.KeepAlive(tab)
}

// BenchmarkAdmit: a poll's admission on a table holding many sessions.
func BenchmarkAdmit(b *testing.B) {
	tab := New(sessions.Limits{})
	exp := t0.Add(time.Hour)
	ids := make([]string, 10000)
	for i := range ids {
		ids[i] = fmt.Sprint("session-", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := tab.Admit(ids[i%len(ids)], fmt.Sprint(i), exp, t0, 0); err != nil && !errors.Is(err, sessions.ErrTooManyNonces) {
			b.Fatal(err)
		}
		i++
	}
}
