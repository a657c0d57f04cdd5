// Package admission remembers, in one process, the pace and the used
// nonces of the sessions it polls: what sessions.Store.AdmitPoll decides.
//
// A session is remembered until its expiry (the one AdmitPoll is given,
// which includes the grace period) on this process's clock. Memory is
// bounded: at most Limits.MaxPolledSessions sessions and MaxNonces nonces
// in all. Past either bound the table never forgets a session silently:
// it evicts the sessions that expire first and keeps one watermark, the
// latest expiry it evicted; a session that is not in the table and
// expires no later than the watermark is refused with
// sessions.ErrSessionOver. So an evicted session is never admitted again,
// and no used nonce becomes usable by load alone.
package admission

import (
	"container/heap"
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

// MaxNonces bounds the nonces remembered in all (8 bytes each in a slice
// that at most doubles: at most 16 MiB at the bound).
const MaxNonces = 1 << 20

// Table is the admission state of one process. Safe for concurrent use.
type Table struct {
	limits    sessions.Limits
	seeds     [2]maphash.Seed
	maxNonces int // MaxNonces; smaller in tests

	mu      sync.Mutex
	entries map[sessionKey]*entry
	byExp   expiryHeap // the entries, the earliest expiry first
	nonces  int
	// evictedUntil is the latest expiry (Unix nanoseconds) of a session
	// evicted while it could still be polled: sessions expiring no later
	// are refused unless remembered.
	evictedUntil int64
}

// sessionKey is a 128-bit keyed hash of a session ID: a table entry does
// not keep the ID itself, and nobody without the seeds can make two IDs
// collide.
type sessionKey [2]uint64

// entry is one polled session: 56 bytes plus 8 per nonce (the slice's
// spare capacity at most doubles that).
type entry struct {
	key      sessionKey
	expires  int64 // Unix nanoseconds
	lastPoll int64 // Unix nanoseconds; 0: never admitted
	nonces   []uint64
}

// New returns an empty table with limits (zero fields: sessions.DefaultLimits).
func New(limits sessions.Limits) *Table {
	return &Table{limits: limits.WithDefaults(), seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		maxNonces: MaxNonces, entries: map[sessionKey]*entry{}}
}

// Admit decides a poll of session id with nonce at now, as
// sessions.Store.AdmitPoll documents.
func (t *Table) Admit(id, nonce string, expires, now time.Time, minInterval time.Duration) error {
	key := sessionKey{maphash.String(t.seeds[0], id), maphash.String(t.seeds[1], id)}
	h := maphash.String(t.seeds[0], nonce)
	exp, at := expires.UnixNano(), now.UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	if exp <= at {
		// Past what its entry would be kept for: a poll now could find
		// the entry swept, so the session is over here whatever else.
		return sessions.ErrSessionOver
	}
	e := t.entries[key]
	if e == nil {
		if exp <= t.evictedUntil {
			return sessions.ErrSessionOver
		}
		t.sweep(at)
		if len(t.entries) >= t.limits.MaxPolledSessions {
			if exp <= t.byExp[0].expires {
				// Every session remembered outlives this one: it is the
				// one the table cannot hold.
				return sessions.ErrSessionOver
			}
			t.evict()
		}
		e = &entry{key: key, expires: exp}
		t.entries[key] = e
		heap.Push(&t.byExp, e)
	}
	if slices.Contains(e.nonces, h) {
		return sessions.ErrNonceUsed
	}
	if e.lastPoll != 0 {
		if wait := time.Duration(e.lastPoll + int64(minInterval) - at); wait > 0 {
			return &sessions.TooSoonError{RetryAfter: wait}
		}
	}
	if len(e.nonces) >= t.limits.MaxNoncesPerSession {
		return sessions.ErrTooManyNonces
	}
	// Room for one more nonce in all: evict the sessions expiring first,
	// this one included if it comes first.
	for t.nonces >= t.maxNonces {
		if t.byExp[0] == e {
			t.evict()
			return sessions.ErrSessionOver
		}
		t.evict()
	}
	e.nonces = append(e.nonces, h)
	t.nonces++
	e.lastPoll = at
	return nil
}

// evict forgets the session expiring first and raises the watermark to
// its expiry.
func (t *Table) evict() {
	e := heap.Pop(&t.byExp).(*entry)
	t.evictedUntil = max(t.evictedUntil, e.expires)
	t.drop(e)
}

func (t *Table) drop(e *entry) {
	delete(t.entries, e.key)
	t.nonces -= len(e.nonces)
}

// sweep forgets the sessions expired at at (Unix nanoseconds): no poll of
// them is admitted any more, so nothing is lost.
func (t *Table) sweep(at int64) {
	for len(t.byExp) > 0 && t.byExp[0].expires <= at {
		t.drop(heap.Pop(&t.byExp).(*entry))
	}
}

// Sweep forgets every session that expired before now.
func (t *Table) Sweep(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweep(now.UnixNano())
}

// Len returns the sessions and the nonces remembered.
func (t *Table) Len() (sessionCount, nonceCount int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries), t.nonces
}

// expiryHeap is a container/heap of entries by expiry.
type expiryHeap []*entry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].expires < h[j].expires }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(*entry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
