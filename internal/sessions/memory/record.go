package memory

import (
	"bytes"
	"errors"
	"slices"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

// Record is what a store holds of one session, in a form that can move to
// another store (a hashring replica): the session and the hashes
// (NonceHash) of its used nonces.
type Record struct {
	Session sessions.Session
	Nonces  []uint64
	// Partial says Nonces holds only some of the session's nonces (the
	// ones a single operation added): Import merges it into a held record
	// and refuses it (ErrNotFound) when none is held.
	Partial bool
	// LastPoll marks the poll that set Session.LastPollAt.
	LastPoll PollMark
	// Mutable says Session carries only the ID and the mutable fields (a
	// change the owner sends its backup, which has the rest): Import
	// merges it into the held record, keeping its fixed fields, and
	// refuses it (ErrNotFound) when none is held, as a partial record.
	Mutable bool
}

// ErrStaticMismatch: an imported record's fixed fields (ID, cluster ID,
// secret, creation time, callback fields) differ from the held session's:
// it is another session under the same ID, refused.
var ErrStaticMismatch = errors.New("imported record is another session with the same ID")

// copyBound is how many backup copies a store keeps at most, as a multiple
// of MaxSessions: owned sessions are bounded by Create's limit, copies and
// handed-over sessions by this, so memory stays bounded whatever peers
// push.
const copyBound = 2

func (e *entry) record() Record {
	r := Record{Session: e.session(), Nonces: make([]uint64, 0, e.nonces.len()), LastPoll: e.lastPoll}
	for _, h := range e.nonces.slots {
		if h != 0 {
			r.Nonces = append(r.Nonces, h)
		}
	}
	return r
}

// Export returns the record of session id, owned or a backup copy, and
// whether it is owned.
func (s *Store) Export(id string) (rec Record, owned, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held(id, s.now())
	if e == nil {
		return Record{}, false, false
	}
	return e.record(), !e.copy, true
}

// Demote turns an owned session into a backup copy and returns its record,
// in one step: from then on the sessions.Store methods refuse it
// (ErrNotOwned), so nothing changes it here after the record was taken
// (a handover to the new owner). wasOwned is false if it was a copy.
func (s *Store) Demote(id string) (rec Record, wasOwned, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held(id, s.now())
	if e == nil {
		return Record{}, false, false
	}
	wasOwned = !e.copy
	if wasOwned {
		e.copy = true
		s.copies++
		// Waiters here are released (Wait answers ErrNotOwned): they
		// wait again where the session went.
		e.wake()
	}
	return e.record(), wasOwned, true
}

// Promote makes a held backup copy owned (the owner is gone) and reports
// whether the store now owns the session.
func (s *Store) Promote(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held(id, s.now())
	if e == nil {
		return false
	}
	if e.copy {
		e.copy = false
		s.copies--
	}
	return true
}

// Remove drops session id, owned or a copy.
func (s *Store) Remove(id string) { s.remove(id, false) }

// RemoveCopy drops session id if it is held as a backup copy.
func (s *Store) RemoveCopy(id string) { s.remove(id, true) }

func (s *Store) remove(id string, copyOnly bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.t.get(id); e != nil && (e.copy || !copyOnly) {
		s.dropLocked(e)
	}
}

// Owned returns the IDs of the live sessions the store owns.
func (s *Store) Owned() []string { return s.ids(false) }

// Copies returns the IDs of the live backup copies the store holds.
func (s *Store) Copies() []string { return s.ids(true) }

func (s *Store) ids(copies bool) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var ids []string
	s.t.each(func(e *entry) {
		if e.copy == copies && now.Before(e.expiresAt()) {
			ids = append(ids, e.id())
		}
	})
	return ids
}

// Import merges rec into the store. owned true takes the session as owned
// (a handover, a promotion); owned false keeps a new record as a backup
// copy and leaves the role of a held one as it is, except that it then
// refuses (ErrNonceUsed) a record that brings a nonce this store already
// holds for a session it owns: two replicas both acting as owner of a
// session for a moment (a join) cannot both accept one nonce, as each
// sends what it accepts to the other before answering. The one nonce a
// poll spent is not refused when the held record already has that poll's
// mark (samePoll).
//
// The merge is a semilattice (see mergeInto): records pushed twice, out of
// order or by several replicas give the same result. A record already
// expired is ignored; a partial or mutable-only record of an unheld
// session is ErrNotFound (send the full one); another session under the same ID is
// ErrStaticMismatch; beyond the bound on held records, ErrFull.
func (s *Store) Import(rec Record, owned bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if !now.Before(rec.Session.ExpiresAt) {
		return nil
	}
	e := s.held(rec.Session.ID, now)
	if e == nil {
		if rec.Partial || rec.Mutable {
			return sessions.ErrNotFound
		}
		if s.t.len() >= (copyBound+1)*s.limits.MaxSessions {
			return sessions.ErrFull
		}
		sess := rec.Session
		sess.Response = cloneBytes(sess.Response)
		e = s.t.add(sess)
		e.copy, e.lastPoll = !owned, rec.LastPoll
		mergeNonces(&e.nonces, rec.Nonces, s.limits.MaxNoncesPerSession)
		if e.copy {
			s.copies++
		}
		s.noteExpiry(sess.ExpiresAt)
		s.peak = max(s.peak, s.t.len())
		return nil
	}
	if !rec.Mutable && !sameStatic(e.static(), rec.Session) {
		return ErrStaticMismatch
	}
	if !owned && !e.copy {
		for _, h := range rec.Nonces {
			if e.nonces.has(h) && !e.samePoll(rec, h) {
				return sessions.ErrNonceUsed
			}
		}
	}
	held := e.session()
	e.lastPoll = mergePollMark(held.LastPollAt, e.lastPoll, rec.Session.LastPollAt, rec.LastPoll)
	mergeInto(&held, rec.Session, s.limits.Grace)
	e.setMutable(held)
	if held.State != sessions.StatePending {
		e.wake() // if pending until now, its waiters are woken
	}
	mergeNonces(&e.nonces, rec.Nonces, s.limits.MaxNoncesPerSession)
	if owned && e.copy {
		e.copy = false
		s.copies--
	}
	s.noteExpiry(held.ExpiresAt)
	return nil
}

// samePoll says whether nonce h of rec was spent by the very poll whose
// mark e holds: its copy reaches a store that already took the poll's
// outcome as owner (a handover from the replica that served it raced the
// copy, or the forwarder got the session meanwhile). The request ID is
// random per poll, as RecordPollRequest's replay of a retried poll
// relies on too, so this is the same acceptance arriving twice, not a
// second one.
func (e *entry) samePoll(rec Record, h uint64) bool {
	return rec.LastPoll.Request != 0 && rec.LastPoll.Nonce == h && rec.LastPoll == e.lastPoll
}

func sameStatic(a, b sessions.Session) bool {
	return a.ID == b.ID && a.ClusterID == b.ClusterID && a.Secret == b.Secret &&
		a.CreatedAt.Equal(b.CreatedAt) && a.CallbackURL == b.CallbackURL &&
		a.CallbackSessionID == b.CallbackSessionID
}

// mergeInto merges the mutable part of in into held so that the result
// does not depend on the order in which records arrive:
//   - state: pending < completed, denied; of two different final states
//     (only a split brain makes them) completed wins, since its binding
//     exists on the provider cluster, and of two completed responses the
//     bytewise smaller: order-independent, where "keep the held one" is
//     not. Response and DenyReason follow the state.
//   - LastPollAt: the later; DeliveredAt: the earlier non-zero;
//   - ExpiresAt: the later, except once delivered: DeliveredAt+grace,
//     which is what RecordPoll sets.
func mergeInto(held *sessions.Session, in sessions.Session, grace time.Duration) {
	if rank(in) > rank(*held) || rank(in) == rank(*held) && in.State == sessions.StateCompleted &&
		bytes.Compare(in.Response, held.Response) < 0 {
		held.State, held.Response, held.DenyReason = in.State, cloneBytes(in.Response), in.DenyReason
	} else if rank(in) == rank(*held) && in.State == sessions.StateDenied && in.DenyReason < held.DenyReason {
		held.DenyReason = in.DenyReason
	}
	if in.LastPollAt.After(held.LastPollAt) {
		held.LastPollAt = in.LastPollAt
	}
	if !in.DeliveredAt.IsZero() && (held.DeliveredAt.IsZero() || in.DeliveredAt.Before(held.DeliveredAt)) {
		held.DeliveredAt = in.DeliveredAt
	}
	if in.ExpiresAt.After(held.ExpiresAt) {
		held.ExpiresAt = in.ExpiresAt
	}
	if held.State != sessions.StateCompleted {
		held.DeliveredAt = time.Time{}
	} else if !held.DeliveredAt.IsZero() {
		held.ExpiresAt = held.DeliveredAt.Add(grace)
	}
}

// mergePollMark keeps the mark of the later poll (of two at the same
// time, the larger mark), so that it follows LastPollAt in any order.
func mergePollMark(heldAt time.Time, held PollMark, inAt time.Time, in PollMark) PollMark {
	switch {
	case inAt.After(heldAt):
		return in
	case heldAt.After(inAt):
		return held
	case in.Nonce > held.Nonce || in.Nonce == held.Nonce && in.Request > held.Request:
		return in
	}
	return held
}

func rank(s sessions.Session) int {
	switch s.State {
	case sessions.StatePending:
		return 0
	case sessions.StateDenied:
		return 1
	}
	return 2
}

// mergeNonces adds hs to set. A union beyond limit keeps the limit
// smallest hashes, so the result is independent of order; the set is then
// full, and a full set refuses every further nonce (ErrTooManyNonces):
// a dropped hash can never make a used nonce acceptable.
func mergeNonces(set *nonceSet, hs []uint64, limit int) {
	var fresh []uint64
	for _, h := range hs {
		h = nonEmpty(h)
		if !set.has(h) && !slices.Contains(fresh, h) {
			fresh = append(fresh, h)
		}
	}
	if len(fresh) == 0 {
		return
	}
	if set.len()+len(fresh) <= limit {
		for _, h := range fresh {
			set.add(h, limit)
		}
		return
	}
	all := fresh
	for _, h := range set.slots {
		if h != 0 {
			all = append(all, h)
		}
	}
	for i := range all {
		all[i] = nonEmpty(all[i])
	}
	slices.Sort(all)
	all = slices.Compact(all)[:limit]
	*set = nonceSet{}
	for _, h := range all {
		set.add(h, limit)
	}
}

// Holds reports whether session id is held, and whether as owner.
func (s *Store) Holds(id string) (owned, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held(id, s.now())
	if e == nil {
		return false, false
	}
	return !e.copy, true
}

// Peek returns session id whether owned or a backup copy (its fixed part
// is the same on every holder).
func (s *Store) Peek(id string) (sessions.Session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held(id, s.now())
	if e == nil {
		return sessions.Session{}, false
	}
	return e.session(), true
}
