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
	"hash/maphash"
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
	seed   maphash.Seed

	mu       sync.Mutex
	sessions map[string]*entry
	// nextExpiry is no later than the earliest ExpiresAt of any held
	// session, so a full store sweeps only when a sweep can free a slot.
	nextExpiry time.Time
	// peak is the largest len(sessions) since the map was last rebuilt:
	// Go maps never shrink, so the janitor rebuilds a map that emptied.
	peak int

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type entry struct {
	s sessions.Session
	// nonces holds a seeded 64-bit hash of each used nonce: 8 bytes per
	// nonce whatever its length (nonceSet). A collision (about 2^-44 at
	// 1024 nonces) could only refuse a fresh nonce, never accept a used one.
	nonces nonceSet
	// done is closed when the session leaves the pending state or is
	// deleted, waking every Wait on it. It is made by the first Wait only:
	// most sessions are never waited for.
	done chan struct{}
}

// wake wakes the session's waiters. Call it (with the store's lock held)
// on every change that ends pending: Complete, Deny, Delete, and a merge
// that brings a final state.
func (e *entry) wake() {
	if e.done != nil {
		close(e.done)
		e.done = nil
	}
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
		limits:   withDefaults(limits),
		now:      clock,
		seed:     maphash.MakeSeed(),
		sessions: make(map[string]*entry),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go s.janitor(every)
	return s
}

func withDefaults(l sessions.Limits) sessions.Limits {
	d := sessions.DefaultLimits
	if l.MaxSessions <= 0 {
		l.MaxSessions = d.MaxSessions
	}
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
	return len(s.sessions)
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
	if s.peak > 1024 && len(s.sessions) < s.peak/4 {
		m := make(map[string]*entry, len(s.sessions))
		for id, e := range s.sessions {
			m[id] = e
		}
		s.sessions = m
		s.peak = len(m)
	}
}

func (s *Store) sweepLocked(now time.Time) {
	var next time.Time
	for id, e := range s.sessions {
		if !now.Before(e.s.ExpiresAt) {
			delete(s.sessions, id)
			continue
		}
		if next.IsZero() || e.s.ExpiresAt.Before(next) {
			next = e.s.ExpiresAt
		}
	}
	s.nextExpiry = next
}

// noteExpiry keeps nextExpiry a lower bound after an ExpiresAt changed.
func (s *Store) noteExpiry(t time.Time) {
	if s.nextExpiry.IsZero() || t.Before(s.nextExpiry) {
		s.nextExpiry = t
	}
}

// live returns the unexpired entry for id, dropping it if it expired.
func (s *Store) live(id string, now time.Time) *entry {
	e := s.sessions[id]
	if e == nil {
		return nil
	}
	if !now.Before(e.s.ExpiresAt) {
		delete(s.sessions, id)
		return nil
	}
	return e
}

func (s *Store) Create(_ context.Context, sess sessions.Session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.live(sess.ID, now) != nil {
		return sessions.ErrExists
	}
	if len(s.sessions) >= s.limits.MaxSessions {
		// Sweep only when some session may have expired: a full store of
		// live sessions answers ErrFull in O(1).
		if !s.nextExpiry.IsZero() && !now.Before(s.nextExpiry) {
			s.sweepLocked(now)
		}
		if len(s.sessions) >= s.limits.MaxSessions {
			return sessions.ErrFull
		}
	}
	sess.Response = cloneBytes(sess.Response)
	s.sessions[sess.ID] = &entry{s: sess}
	s.noteExpiry(sess.ExpiresAt)
	if len(s.sessions) > s.peak {
		s.peak = len(s.sessions)
	}
	return nil
}

func (s *Store) Get(_ context.Context, id string) (sessions.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(id, s.now())
	if e == nil {
		return sessions.Session{}, sessions.ErrNotFound
	}
	return e.s, nil
}

// Static returns the fields of the session fixed at Create.
func (s *Store) Static(_ context.Context, id string) (sessions.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(id, s.now())
	if e == nil {
		return sessions.Session{}, sessions.ErrNotFound
	}
	return e.s.StaticPart(), nil
}

func (s *Store) UseNonce(_ context.Context, id, nonce string) error {
	h := maphash.String(s.seed, nonce)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(id, s.now())
	if e == nil {
		return sessions.ErrNotFound
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

func (s *Store) RecordPoll(_ context.Context, id, nonce string, minInterval time.Duration) (sessions.Session, error) {
	h := maphash.String(s.seed, nonce)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e := s.live(id, now)
	if e == nil {
		return sessions.Session{}, sessions.ErrNotFound
	}
	// A replayed nonce is refused as such even when it comes too soon; a
	// poll refused as too soon changes nothing, not even the nonce set, so
	// that polling too fast cannot fill it.
	if e.nonces.has(h) {
		return sessions.Session{}, sessions.ErrNonceUsed
	}
	if last := e.s.LastPollAt; !last.IsZero() {
		if wait := last.Add(minInterval).Sub(now); wait > 0 {
			return sessions.Session{}, &sessions.TooSoonError{RetryAfter: wait}
		}
	}
	if err := s.useNonceLocked(e, h); err != nil {
		return sessions.Session{}, err
	}
	e.s.LastPollAt = now
	s.deliverLocked(e, now)
	return e.s, nil
}

// deliverLocked marks a completed session delivered the first time it is
// handed out (by a poll or a Wait): its response stays for the grace
// period from now.
func (s *Store) deliverLocked(e *entry, now time.Time) {
	if e.s.State == sessions.StateCompleted && e.s.DeliveredAt.IsZero() {
		e.s.DeliveredAt = now
		e.s.ExpiresAt = now.Add(s.limits.Grace)
		s.noteExpiry(e.s.ExpiresAt)
	}
}

// Wait waits on the session's done channel. The entry is looked up again
// after waking: a session deleted and created again under the same ID is
// another session, so its waiters get ErrNotFound.
func (s *Store) Wait(ctx context.Context, id string) (sessions.Session, error) {
	s.mu.Lock()
	now := s.now()
	e := s.live(id, now)
	if e == nil {
		s.mu.Unlock()
		return sessions.Session{}, sessions.ErrNotFound
	}
	if e.s.State != sessions.StatePending {
		s.deliverLocked(e, now)
		sess := e.s
		s.mu.Unlock()
		return sess, nil
	}
	if e.done == nil {
		e.done = make(chan struct{})
	}
	done := e.done
	s.mu.Unlock()

	select {
	case <-done:
	case <-ctx.Done():
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	now = s.now()
	if s.live(id, now) != e {
		return sessions.Session{}, sessions.ErrNotFound
	}
	s.deliverLocked(e, now)
	return e.s, nil
}

func (s *Store) Complete(_ context.Context, id string, response []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e := s.live(id, now)
	if e == nil {
		return sessions.ErrNotFound
	}
	if e.s.State != sessions.StatePending {
		return sessions.ErrNotPending
	}
	if len(response) > s.limits.MaxResponseBytes {
		return sessions.ErrTooLarge
	}
	e.s.State = sessions.StateCompleted
	// A copy: the caller may reuse its buffer, and returned Sessions share
	// this slice, which is never written again.
	e.s.Response = cloneBytes(response)
	if min := now.Add(s.limits.Grace); e.s.ExpiresAt.Before(min) {
		e.s.ExpiresAt = min
	}
	e.wake()
	return nil
}

func (s *Store) Deny(_ context.Context, id, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(id, s.now())
	if e == nil {
		return sessions.ErrNotFound
	}
	if e.s.State != sessions.StatePending {
		return sessions.ErrNotPending
	}
	e.s.State = sessions.StateDenied
	e.s.DenyReason = reason
	e.wake()
	return nil
}

func (s *Store) Delete(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.sessions[id]; e != nil {
		e.wake()
		delete(s.sessions, id)
	}
	return nil
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}
