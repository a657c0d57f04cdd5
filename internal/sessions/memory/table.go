package memory

import (
	"crypto/sha256"
	"encoding/binary"
	"hash/maphash"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

// table holds a store's entries so that the garbage collector has little
// to trace: entries live in chunks of chunkSize (no object per session),
// each keeps its session's fixed strings in one string, its times as
// integers, and the index from ID to entry is a map of 64-bit hashes to
// positions, which has no pointers and is not scanned at all. A store of
// 200,000 sessions held about a million heap objects as a map of
// pointers to entries, each with its own strings, and every collection
// traced them all: under hack/pollbench that was about 12 µs of each
// poll's CPU on the first replica of a two-replica ring, whose replicas
// share a core (a collection there cost about twice what one replica's
// did). Laid out here, the same sessions are about two objects each,
// found by a linear scan of the
// chunks (TestTableKeepsTheHeapFlat measures it).
//
// Entries do not move while held (chunks are never reallocated), so an
// *entry stays valid under the store's lock until its session is removed;
// after that its position may be reused by another session, which gen
// tells apart.
type table struct {
	hash   func(id string) uint64 // seeded: IDs cannot be chosen to collide
	index  map[uint64]int32       // hash of an ID → position of the first entry with that hash
	chunks []*[chunkSize]entry
	free   []int32 // positions of removed entries, reused first
	n      int
	gen    uint64 // of the last entry added
}

const chunkSize = 1024

func newTable() *table {
	seed := maphash.MakeSeed()
	return &table{hash: func(id string) uint64 { return maphash.String(seed, id) }, index: map[uint64]int32{}}
}

func (t *table) at(pos int32) *entry { return &t.chunks[pos/chunkSize][pos%chunkSize] }

// len returns how many entries the table holds.
func (t *table) len() int { return t.n }

// get returns the entry of id, or nil.
func (t *table) get(id string) *entry {
	pos, ok := t.index[t.hash(id)]
	for ok {
		e := t.at(pos)
		if e.id() == id {
			return e
		}
		pos, ok = e.next-1, e.next != 0
	}
	return nil
}

// add returns a new entry for sess, which must not be held, with its
// fixed fields and times set and the rest zero.
func (t *table) add(sess sessions.Session) *entry {
	e := t.place(sess.ID)
	t.gen++
	e.gen = t.gen
	e.setFixed(sess)
	e.setMutable(sess)
	return e
}

// place returns a zeroed entry at a free position, found under id's hash.
func (t *table) place(id string) *entry {
	var pos int32
	if n := len(t.free); n > 0 {
		pos, t.free = t.free[n-1], t.free[:n-1]
	} else {
		if t.n == len(t.chunks)*chunkSize {
			t.chunks = append(t.chunks, new([chunkSize]entry))
		}
		pos = int32(t.n)
	}
	e := t.at(pos)
	*e = entry{pos: pos, used: true}
	h := t.hash(id)
	if first, ok := t.index[h]; ok {
		e.next = first + 1
	}
	t.index[h] = pos
	t.n++
	return e
}

// remove takes e out of the table.
func (t *table) remove(e *entry) {
	h := t.hash(e.id())
	first := t.index[h]
	if first == e.pos {
		if e.next == 0 {
			delete(t.index, h)
		} else {
			t.index[h] = e.next - 1
		}
	} else {
		for prev := t.at(first); ; prev = t.at(prev.next - 1) {
			if prev.next-1 == e.pos {
				prev.next = e.next
				break
			}
		}
	}
	t.free = append(t.free, e.pos)
	e.wake()     // its waiters find it gone
	*e = entry{} // lets its strings, nonces and response go
	t.n--
}

// each calls f on every entry; f may remove the entry it is given.
func (t *table) each(f func(e *entry)) {
	for _, c := range t.chunks {
		for i := range c {
			if c[i].used {
				f(&c[i])
			}
		}
	}
}

// compacted returns a table of the same entries without free positions,
// its map and chunks sized for them: Go maps never shrink, so a table that
// emptied after a burst is rebuilt (Sweep). Entries move, and keep their
// gen.
func (t *table) compacted() *table {
	nt := &table{hash: t.hash, index: make(map[uint64]int32, t.n), gen: t.gen}
	t.each(func(e *entry) {
		ne := nt.place(e.id())
		pos, next := ne.pos, ne.next
		*ne = *e
		ne.pos, ne.next = pos, next
	})
	return nt
}

// entry is one session in a table. Its fixed strings are kept in one
// string and its times as Unix nanoseconds (0: the zero time), so that
// the collector follows few pointers per session; session() puts them
// back together without copying.
type entry struct {
	fixed  string    // ID, ClusterID, Secret, CallbackURL, CallbackSessionID, back to back
	ends   [4]uint32 // where the first four end in fixed
	digest [16]byte  // StaticDigest of the fixed fields

	created, expires, delivered, lastPollAt int64
	state                                   sessions.State
	response                                []byte
	denyReason                              string

	// nonces holds a 64-bit hash (NonceHash) of each used nonce: 8 bytes
	// per nonce whatever its length (nonceSet). A collision (about 2^-44
	// at 1024 nonces) could only refuse a fresh nonce, never accept a used
	// one.
	nonces nonceSet
	// copy marks a backup copy held for another replica (a hashring
	// owner): the sessions.Store methods treat it as not theirs to serve
	// (ErrNotOwned) until Import or Promote makes it owned.
	copy bool
	// done is closed when the session leaves the pending state or is
	// removed, waking every Wait on it. It is made by the first Wait only:
	// most sessions are never waited for.
	done chan struct{}
	// lastPoll marks the poll that set LastPollAt (see PollMark).
	lastPoll PollMark

	// Table bookkeeping: the entry's position, 1 + the position of the
	// next entry with the same ID hash (0: none), which addition to the
	// table it is, and whether the position is in use.
	pos, next int32
	gen       uint64
	used      bool
}

func (e *entry) id() string { return e.fixed[:e.ends[0]] }

func (e *entry) setFixed(s sessions.Session) {
	e.fixed = s.ID + s.ClusterID + s.Secret + s.CallbackURL + s.CallbackSessionID
	n := uint32(0)
	for i, f := range [...]string{s.ID, s.ClusterID, s.Secret, s.CallbackURL} {
		n += uint32(len(f))
		e.ends[i] = n
	}
	e.created = UnixNanos(s.CreatedAt)
	e.digest = StaticDigest(s)
}

// setMutable sets the fields that change after Create from s. The
// response is kept as it is: callers pass a slice nobody else writes.
func (e *entry) setMutable(s sessions.Session) {
	e.expires, e.delivered, e.lastPollAt = UnixNanos(s.ExpiresAt), UnixNanos(s.DeliveredAt), UnixNanos(s.LastPollAt)
	e.state, e.response, e.denyReason = s.State, s.Response, s.DenyReason
}

// session returns the session e holds; its strings and response share
// e's memory, which is never written in place.
func (e *entry) session() sessions.Session {
	s := e.static()
	s.ExpiresAt, s.DeliveredAt, s.LastPollAt = FromUnixNanos(e.expires), FromUnixNanos(e.delivered), FromUnixNanos(e.lastPollAt)
	s.State, s.Response, s.DenyReason = e.state, e.response, e.denyReason
	return s
}

// static returns the fields fixed at Create, as Session.StaticPart.
func (e *entry) static() sessions.Session {
	f, end := e.fixed, e.ends
	return sessions.Session{
		ID: f[:end[0]], ClusterID: f[end[0]:end[1]], Secret: f[end[1]:end[2]],
		CallbackURL: f[end[2]:end[3]], CallbackSessionID: f[end[3]:],
		CreatedAt: FromUnixNanos(e.created),
	}
}

func (e *entry) expiresAt() time.Time { return FromUnixNanos(e.expires) }

// wake wakes the session's waiters. Call it (with the store's lock held)
// on every change that ends pending: Complete, Deny, Delete, and a merge
// that brings a final state; removal wakes them too.
func (e *entry) wake() {
	if e.done != nil {
		close(e.done)
		e.done = nil
	}
}

// StaticDigest identifies a session's fixed fields (ID, cluster ID,
// secret, creation time, callback fields): a session deleted and created
// again under the same ID with other fields has another digest. Hashring
// replicas compare it to tell whether the fixed part they checked a
// signature with is the owner's, so its form is part of their wire
// protocol. A store keeps it with each session (computed once, not on
// every poll).
func StaticDigest(s sessions.Session) [16]byte {
	var buf [512]byte // on the stack for a session of the usual size
	b := buf[:0]
	for _, f := range [...]string{s.ID, s.ClusterID, s.Secret, s.CallbackURL, s.CallbackSessionID} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(f)))
		b = append(b, f...)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(UnixNanos(s.CreatedAt)))
	sum := sha256.Sum256(b)
	return [16]byte(sum[:16])
}

// UnixNanos and FromUnixNanos keep times as Unix nanoseconds, the zero
// time as 0; times come back in UTC, without a monotonic reading. The
// hashring's wire form uses them too.
func UnixNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func FromUnixNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}
