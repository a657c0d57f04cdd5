// Package admission remembers, in one process, the pace and the used
// nonces of the sessions it polls: what sessions.Store.AdmitPoll decides.
// Memory is bounded: at most Limits.MaxPolledSessions sessions and
// MaxNonces nonces in all; past either bound the least recently polled
// session is forgotten.
package admission

import (
	"container/list"
	"hash/maphash"
	"sync"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

// MaxNonces bounds the nonces remembered in all (8 bytes each, plus the
// map's overhead: about 40 MB at the bound).
const MaxNonces = 1 << 20

// Table is the admission state of one process. Safe for concurrent use.
type Table struct {
	limits sessions.Limits
	seed   maphash.Seed

	mu      sync.Mutex
	entries map[string]*list.Element // of *entry
	lru     list.List                // front: most recently polled
	nonces  int
}

type entry struct {
	id       string
	expires  time.Time
	lastPoll time.Time
	nonces   map[uint64]struct{}
}

// New returns an empty table with limits (zero fields: sessions.DefaultLimits).
func New(limits sessions.Limits) *Table {
	return &Table{limits: limits.WithDefaults(), seed: maphash.MakeSeed(), entries: map[string]*list.Element{}}
}

// Admit decides a poll of session id with nonce at now, as
// sessions.Store.AdmitPoll documents.
func (t *Table) Admit(id, nonce string, expires, now time.Time, minInterval time.Duration) error {
	h := maphash.String(t.seed, nonce)
	t.mu.Lock()
	defer t.mu.Unlock()
	el := t.entries[id]
	if el == nil {
		t.evict(now)
		el = t.lru.PushFront(&entry{id: id, expires: expires, nonces: map[uint64]struct{}{}})
		t.entries[id] = el
	}
	t.lru.MoveToFront(el)
	e := el.Value.(*entry)
	if _, used := e.nonces[h]; used {
		return sessions.ErrNonceUsed
	}
	if !e.lastPoll.IsZero() {
		if wait := e.lastPoll.Add(minInterval).Sub(now); wait > 0 {
			return &sessions.TooSoonError{RetryAfter: wait}
		}
	}
	if len(e.nonces) >= t.limits.MaxNoncesPerSession {
		return sessions.ErrTooManyNonces
	}
	// Room for one more nonce in all: forget the least recently polled
	// other sessions (this one is at the front).
	for t.nonces >= MaxNonces && t.lru.Back() != el {
		t.remove(t.lru.Back())
	}
	e.nonces[h] = struct{}{}
	t.nonces++
	e.lastPoll = now
	return nil
}

// evict makes room for one more session: it drops expired sessions from
// the back, then the least recently polled ones while a bound is reached.
func (t *Table) evict(now time.Time) {
	for el := t.lru.Back(); el != nil; el = t.lru.Back() {
		e := el.Value.(*entry)
		full := len(t.entries) >= t.limits.MaxPolledSessions || t.nonces >= MaxNonces
		if !full && now.Before(e.expires) {
			return
		}
		t.remove(el)
	}
}

func (t *Table) remove(el *list.Element) {
	e := t.lru.Remove(el).(*entry)
	delete(t.entries, e.id)
	t.nonces -= len(e.nonces)
}

// Sweep forgets every session that expired before now.
func (t *Table) Sweep(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for el := t.lru.Front(); el != nil; {
		next := el.Next()
		if !now.Before(el.Value.(*entry).expires) {
			t.remove(el)
		}
		el = next
	}
}

// Len returns the sessions and the nonces remembered.
func (t *Table) Len() (sessionCount, nonceCount int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries), t.nonces
}
