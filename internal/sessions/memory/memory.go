// Package memory is a sessions.Store that keeps every session in the memory
// of one process: the store of a single replica, and the authoritative
// state a hashring owner keeps for the sessions it owns.
//
// Memory is bounded by sessions.Limits: at most MaxSessions live sessions,
// at most MaxNoncesPerSession remembered nonces per session (8 bytes each,
// so 8 KiB for a full set of the default 1024; TestNonceSetHeap measures
// it), and responses of at most MaxResponseBytes. Expired sessions are removed
// lazily when touched and by a background janitor, stopped by Close.
package memory

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"sync"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

// janitorInterval is how often the janitor drops expired sessions. Lazy
// expiry keeps answers correct in between; the janitor only frees memory.
const janitorInterval = 30 * time.Second

// Store is an in-memory sessions.Store. Create it with New and stop its
// janitor with Close.
type Store struct {
	limits sessions.Limits
	now    func() time.Time

	mu sync.Mutex
	t  *table
	// copies counts the entries held as backup copies (see Import).
	copies int
	// nextExpiry is no later than the earliest ExpiresAt of any held
	// session, so a full store sweeps only when a sweep can free a slot.
	nextExpiry time.Time
	// peak is the most sessions held since the table was last rebuilt:
	// Go maps never shrink, so the janitor rebuilds a table that emptied.
	peak int

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// PollMark identifies the poll that last spent a nonce of a session: the
// nonce's hash and the request ID the hashring gave that poll. A poll
// whose answer was lost between replicas (its owner died after spending
// the nonce and copying it to the backup) is sent again with the same
// request ID and gets the answer it would have had; a client's replay of
// the same signed request is a new request and is refused.
type PollMark struct {
	Nonce   uint64
	Request uint64
}

// ErrNotOwned says the store holds the session only as a backup copy
// (Import with owned false, or Demote): the sessions.Store methods do not
// serve it. A plain memory store never returns it.
var ErrNotOwned = errors.New("session held only as a backup copy")

// NonceHash is the 64-bit hash a store remembers of a used nonce: the
// first 8 bytes of its SHA-256. It is the same in every process, so a
// session's nonce set can move between replicas (Export, Import). Unlike a
// seeded hash, an attacker can compute it; but finding nonces that collide
// with a used one only lets them have a fresh nonce of their own session
// refused (signing it needs that session's secret), never a used one
// accepted.
func NonceHash(nonce string) uint64 {
	sum := sha256.Sum256([]byte(nonce))
	return binary.BigEndian.Uint64(sum[:8])
}

var _ sessions.Store = (*Store)(nil)

// New returns a store bounded by limits (zero fields take the value of
// sessions.DefaultLimits) that reads the time from clock (nil: time.Now).
// It starts a janitor goroutine; call Close to stop it.
func New(limits sessions.Limits, clock func() time.Time) *Store {
	return newStore(limits, clock, janitorInterval)
}

func newStore(limits sessions.Limits, clock func() time.Time, every time.Duration) *Store {
	if clock == nil {
		clock = time.Now
	}
	s := &Store{
		limits: withDefaults(limits),
		now:    clock,
		t:      newTable(),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	go s.janitor(every)
	return s
}

func withDefaults(l sessions.Limits) sessions.Limits {
	d := sessions.DefaultLimits
	if l.MaxSessions <= 0 {
		l.MaxSessions = d.MaxSessions
	}
	l.MaxSessions = min(l.MaxSessions, sessions.MaxSessionsBound)
	if l.MaxNoncesPerSession <= 0 {
		l.MaxNoncesPerSession = d.MaxNoncesPerSession
	}
	if l.MaxResponseBytes <= 0 {
		l.MaxResponseBytes = d.MaxResponseBytes
	}
	if l.Grace <= 0 {
		l.Grace = d.Grace
	}
	return l
}

// Limits returns the limits in force (defaults filled in).
func (s *Store) Limits() sessions.Limits { return s.limits }

// Close stops the janitor. The store stays usable; expired sessions are
// then only dropped when touched.
func (s *Store) Close() {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
}

// Len returns how many sessions the store holds, expired ones not yet
// reclaimed included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.t.len()
}

func (s *Store) janitor(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Sweep drops every expired session now and gives back map memory after a
// burst. The janitor calls it periodically.
func (s *Store) Sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(s.now())
	if s.peak > 1024 && s.t.len() < s.peak/4 {
		s.t = s.t.compacted()
		s.peak = s.t.len()
	}
}

func (s *Store) sweepLocked(now time.Time) {
	var next time.Time
	s.t.each(func(e *entry) {
		exp := e.expiresAt()
		if !now.Before(exp) {
			s.dropLocked(e)
			return
		}
		if next.IsZero() || exp.Before(next) {
			next = exp
		}
	})
	s.nextExpiry = next
}

// noteExpiry keeps nextExpiry a lower bound after an ExpiresAt changed.
func (s *Store) noteExpiry(t time.Time) {
	if s.nextExpiry.IsZero() || t.Before(s.nextExpiry) {
		s.nextExpiry = t
	}
}

func (s *Store) dropLocked(e *entry) {
	if e.copy {
		s.copies--
	}
	s.t.remove(e)
}

// held returns the unexpired entry for id, owned or a copy, dropping it if
// it expired.
func (s *Store) held(id string, now time.Time) *entry {
	e := s.t.get(id)
	if e == nil {
		return nil
	}
	if !now.Before(e.expiresAt()) {
		s.dropLocked(e)
		return nil
	}
	return e
}

// live returns the unexpired owned entry for id, or the error to answer:
// ErrNotFound, or ErrNotOwned for a backup copy.
func (s *Store) live(id string, now time.Time) (*entry, error) {
	e := s.held(id, now)
	switch {
	case e == nil:
		return nil, sessions.ErrNotFound
	case e.copy:
		return nil, ErrNotOwned
	}
	return e, nil
}

func (s *Store) Create(_ context.Context, sess sessions.Session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.held(sess.ID, now) != nil {
		return sessions.ErrExists
	}
	// Backup copies do not count against MaxSessions (they are bounded
	// apart, see Import): a replica's share of new sessions stays the same
	// whatever copies it keeps for the others.
	if s.t.len()-s.copies >= s.limits.MaxSessions {
		// Sweep only when some session may have expired: a full store of
		// live sessions answers ErrFull in O(1).
		if !s.nextExpiry.IsZero() && !now.Before(s.nextExpiry) {
			s.sweepLocked(now)
		}
		if s.t.len()-s.copies >= s.limits.MaxSessions {
			return sessions.ErrFull
		}
	}
	sess.Response = cloneBytes(sess.Response)
	s.t.add(sess)
	s.noteExpiry(sess.ExpiresAt)
	s.peak = max(s.peak, s.t.len())
	return nil
}

func (s *Store) Get(_ context.Context, id string) (sessions.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.live(id, s.now())
	if err != nil {
		return sessions.Session{}, err
	}
	return e.session(), nil
}

// Static returns the fields of the session fixed at Create. A backup copy
// (hashring) answers too: those fields are the owner's, and never change.
func (s *Store) Static(_ context.Context, id string) (sessions.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held(id, s.now())
	if e == nil {
		return sessions.Session{}, sessions.ErrNotFound
	}
	return e.static(), nil
}

// StaticOf returns the fixed fields of session id, owned or a backup
// copy, with their StaticDigest, and whether it is owned: what a hashring
// replica needs of a poll's session before it serves or forwards it, in
// one lookup.
func (s *Store) StaticOf(id string) (static sessions.Session, digest [16]byte, owned, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held(id, s.now())
	if e == nil {
		return sessions.Session{}, [16]byte{}, false, false
	}
	return e.static(), e.digest, !e.copy, true
}

func (s *Store) UseNonce(_ context.Context, id, nonce string) error {
	h := NonceHash(nonce)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.live(id, s.now())
	if err != nil {
		return err
	}
	return s.useNonceLocked(e, h)
}

func (s *Store) useNonceLocked(e *entry, h uint64) error {
	if e.nonces.has(h) {
		return sessions.ErrNonceUsed
	}
	if !e.nonces.add(h, s.limits.MaxNoncesPerSession) {
		return sessions.ErrTooManyNonces
	}
	return nil
}

func (s *Store) RecordPoll(ctx context.Context, id, nonce string, minInterval time.Duration) (sessions.Session, error) {
	return s.RecordPollRequest(ctx, id, nonce, minInterval, 0)
}

// RecordPollRequest is RecordPoll for a poll with request ID req (0:
// none). A nonce already used by the session's last poll with the same
// non-zero req is that poll sent again, not a replay: it is answered with
// the session as it is now and changes nothing.
func (s *Store) RecordPollRequest(_ context.Context, id, nonce string, minInterval time.Duration, req uint64) (sessions.Session, error) {
	return s.recordPoll(id, nonce, minInterval, req, nil)
}

// RecordPollChecked is RecordPollRequest for a poll whose signature was
// checked with fixed fields taken from elsewhere (a backup's copy, a
// cache), whose StaticDigest is static: a session with other fixed fields
// (its ID used again) answers sessions.ErrStaleStatic and changes nothing.
func (s *Store) RecordPollChecked(_ context.Context, id, nonce string, minInterval time.Duration, req uint64, static []byte) (sessions.Session, error) {
	if static == nil {
		static = []byte{} // checked: matches no digest
	}
	return s.recordPoll(id, nonce, minInterval, req, static)
}

func (s *Store) recordPoll(id, nonce string, minInterval time.Duration, req uint64, static []byte) (sessions.Session, error) {
	h := NonceHash(nonce)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e, err := s.live(id, now)
	if err != nil {
		return sessions.Session{}, err
	}
	if static != nil && string(static) != string(e.digest[:]) {
		return sessions.Session{}, sessions.ErrStaleStatic
	}
	// A replayed nonce is refused as such even when it comes too soon; a
	// poll refused as too soon changes nothing, not even the nonce set, so
	// that polling too fast cannot fill it.
	if e.nonces.has(h) {
		if req != 0 && e.lastPoll == (PollMark{Nonce: h, Request: req}) {
			s.deliverLocked(e, now)
			return e.session(), nil
		}
		return sessions.Session{}, sessions.ErrNonceUsed
	}
	if last := FromUnixNanos(e.lastPollAt); !last.IsZero() {
		if wait := last.Add(minInterval).Sub(now); wait > 0 {
			return sessions.Session{}, &sessions.TooSoonError{RetryAfter: wait}
		}
	}
	if err := s.useNonceLocked(e, h); err != nil {
		return sessions.Session{}, err
	}
	e.lastPollAt = UnixNanos(now)
	e.lastPoll = PollMark{Nonce: h, Request: req}
	s.deliverLocked(e, now)
	return e.session(), nil
}

// deliverLocked marks a completed session delivered the first time it is
// handed out (by a poll or a Wait): its response stays for the grace
// period from now.
func (s *Store) deliverLocked(e *entry, now time.Time) {
	if e.state == sessions.StateCompleted && e.delivered == 0 {
		e.delivered = UnixNanos(now)
		e.expires = UnixNanos(now.Add(s.limits.Grace))
		s.noteExpiry(e.expiresAt())
	}
}

// Wait waits on the session's done channel. The entry is looked up again
// after waking: a session deleted and created again under the same ID is
// another session (another gen, even at the same table position), so its
// waiters get ErrNotFound.
func (s *Store) Wait(ctx context.Context, id string) (sessions.Session, error) {
	s.mu.Lock()
	now := s.now()
	e, err := s.live(id, now)
	if err != nil {
		s.mu.Unlock()
		return sessions.Session{}, err
	}
	if e.state != sessions.StatePending {
		s.deliverLocked(e, now)
		sess := e.session()
		s.mu.Unlock()
		return sess, nil
	}
	if e.done == nil {
		e.done = make(chan struct{})
	}
	done, gen := e.done, e.gen
	s.mu.Unlock()

	select {
	case <-done:
	case <-ctx.Done():
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	now = s.now()
	cur, err := s.live(id, now)
	if err != nil {
		return sessions.Session{}, err
	}
	if cur.gen != gen {
		return sessions.Session{}, sessions.ErrNotFound
	}
	s.deliverLocked(cur, now)
	return cur.session(), nil
}

func (s *Store) Complete(_ context.Context, id string, response []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e, err := s.live(id, now)
	if err != nil {
		return err
	}
	if e.state != sessions.StatePending {
		return sessions.ErrNotPending
	}
	if len(response) > s.limits.MaxResponseBytes {
		return sessions.ErrTooLarge
	}
	e.state = sessions.StateCompleted
	// A copy: the caller may reuse its buffer, and returned Sessions share
	// this slice, which is never written again.
	e.response = cloneBytes(response)
	if min := now.Add(s.limits.Grace); e.expiresAt().Before(min) {
		e.expires = UnixNanos(min)
	}
	e.wake()
	return nil
}

func (s *Store) Deny(_ context.Context, id, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.live(id, s.now())
	if err != nil {
		return err
	}
	if e.state != sessions.StatePending {
		return sessions.ErrNotPending
	}
	e.state = sessions.StateDenied
	e.denyReason = reason
	e.wake()
	return nil
}

// Delete removes an owned session; a backup copy is left alone
// (ErrNotOwned), as the other methods leave it (Remove drops either).
func (s *Store) Delete(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.t.get(id); e != nil {
		if e.copy {
			return ErrNotOwned
		}
		s.dropLocked(e)
	}
	return nil
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}
