package admission

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

var t0 = time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)

// The table stays within its bound on sessions, forgetting the least
// recently polled first; a session polled since is kept.
func TestBoundedLRU(t *testing.T) {
	tab := New(sessions.Limits{MaxPolledSessions: 3, MaxNoncesPerSession: 4})
	exp := t0.Add(time.Hour)
	for _, id := range []string{"a", "b", "c"} {
		if err := tab.Admit(id, "n1", exp, t0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := tab.Admit("a", "n2", exp, t0, 0); err != nil { // a is now the most recent
		t.Fatal(err)
	}
	if err := tab.Admit("d", "n1", exp, t0, 0); err != nil { // evicts b
		t.Fatal(err)
	}
	if n, _ := tab.Len(); n != 3 {
		t.Fatalf("%d sessions remembered, want 3", n)
	}
	if err := tab.Admit("a", "n1", exp, t0, 0); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("a was forgotten: %v", err)
	}
	if err := tab.Admit("b", "n1", exp, t0, 0); err != nil {
		t.Fatalf("b should have been forgotten (its nonce admitted again): %v", err)
	}
}

// Expired sessions go first and on Sweep, and the nonce count follows.
func TestSweep(t *testing.T) {
	tab := New(sessions.Limits{MaxPolledSessions: 100, MaxNoncesPerSession: 10})
	for i := range 5 {
		for j := range 3 {
			if err := tab.Admit(fmt.Sprint(i), fmt.Sprint(j), t0.Add(time.Duration(i)*time.Minute), t0, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	tab.Sweep(t0.Add(2 * time.Minute)) // sessions 0, 1 and 2 expired
	if s, n := tab.Len(); s != 2 || n != 6 {
		t.Fatalf("after the sweep: %d sessions, %d nonces; want 2 and 6", s, n)
	}
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

// The nonces of all sessions together stay within MaxNonces, also when
// sessions already remembered keep polling.
func TestNonceBound(t *testing.T) {
	perSession := 1024
	tab := New(sessions.Limits{MaxPolledSessions: 10 * MaxNonces / perSession, MaxNoncesPerSession: perSession})
	exp := t0.Add(time.Hour)
	sessionsNeeded := MaxNonces/perSession + 8
	for j := range perSession {
		for i := range sessionsNeeded {
			if err := tab.Admit(fmt.Sprint("s", i), fmt.Sprint(j), exp, t0, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, n := tab.Len(); n > MaxNonces {
		t.Fatalf("%d nonces remembered, more than MaxNonces %d", n, MaxNonces)
	}
}
