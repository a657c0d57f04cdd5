// Package memory is a sessions.Store held in one process: for a backend of
// one replica without a provider cluster, and for tests. Everything it
// keeps is lost when the process ends.
package memory

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/admission"
)

// Store keeps outcomes, deliveries and marks in maps, and collects them
// after their expiry plus the grace period. It keeps at most
// Limits.MaxRecords of them, and writes within Limits.WriteRate.
type Store struct {
	limits sessions.Limits
	now    func() time.Time
	admit  *admission.Table
	budget *sessions.WriteBudget

	mu          sync.Mutex
	outcomes    map[string]record
	delivered   map[string]record
	marks       map[string]time.Time // key -> collect after
	waiters     map[string][]chan struct{}
	nextCollect time.Time
	seq         uint64 // numbers the outcomes, for Peek's record
}

type record struct {
	outcome sessions.Outcome
	at      time.Time // deliveries: when
	collect time.Time
	seq     uint64
}

// New returns an empty store. now is its clock (nil: time.Now).
func New(limits sessions.Limits, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	limits = limits.WithDefaults()
	return &Store{
		limits: limits, now: now, admit: admission.New(limits), budget: sessions.NewWriteBudget(limits, now),
		outcomes: map[string]record{}, delivered: map[string]record{},
		marks: map[string]time.Time{}, waiters: map[string][]chan struct{}{},
	}
}

var _ sessions.Peeker = (*Store)(nil)

// Outcome implements sessions.Store.
func (s *Store) Outcome(_ context.Context, id string) (sessions.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outcomes[id].outcome, nil
}

// Peek implements sessions.Peeker: a completed outcome's response is read
// with ReadOutcome.
func (s *Store) Peek(_ context.Context, id string) (sessions.Outcome, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peek(id)
}

func (s *Store) peek(id string) (sessions.Outcome, string, error) {
	r, ok := s.outcomes[id]
	if !ok || s.now().After(r.collect) {
		return sessions.Outcome{}, "", nil
	}
	if r.outcome.State != sessions.StateCompleted {
		return r.outcome, "", nil
	}
	return sessions.Outcome{State: sessions.StateCompleted, Namespace: r.outcome.Namespace}, strconv.FormatUint(r.seq, 10), nil
}

// WaitPeek implements sessions.Peeker.
func (s *Store) WaitPeek(ctx context.Context, id string) (sessions.Outcome, string, error) {
	if _, err := s.Wait(ctx, id); err != nil {
		return sessions.Outcome{}, "", err
	}
	return s.Peek(ctx, id)
}

// ReadOutcome implements sessions.Peeker.
func (s *Store) ReadOutcome(_ context.Context, id, rec string) (sessions.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.outcomes[id]
	if !ok || strconv.FormatUint(r.seq, 10) != rec || s.now().After(r.collect) {
		return sessions.Outcome{}, nil
	}
	return r.outcome, nil
}

// Complete implements sessions.Store.
func (s *Store) Complete(_ context.Context, id string, expires time.Time, ns string, response []byte) error {
	if len(response) > s.limits.MaxResponseBytes {
		return sessions.ErrTooLarge
	}
	return s.record(id, expires, sessions.Outcome{State: sessions.StateCompleted, Response: append([]byte(nil), response...), Namespace: ns})
}

// Deny implements sessions.Store.
func (s *Store) Deny(_ context.Context, id string, expires time.Time, reason string) error {
	return s.record(id, expires, sessions.Outcome{State: sessions.StateDenied, DenyReason: reason})
}

func (s *Store) record(id string, expires time.Time, o sessions.Outcome) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.collect()
	if _, ok := s.outcomes[id]; ok {
		return sessions.ErrNotPending
	}
	if err := s.admitWrite(); err != nil {
		return err
	}
	s.seq++
	s.outcomes[id] = record{outcome: o, collect: expires.Add(s.limits.Grace), seq: s.seq}
	for _, w := range s.waiters[id] {
		close(w)
	}
	delete(s.waiters, id)
	return nil
}

// Deliver implements sessions.Store.
func (s *Store) Deliver(_ context.Context, id string, expires time.Time) (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.outcomes[id].outcome.State != sessions.StateCompleted {
		return time.Time{}, sessions.ErrNotPending
	}
	if d, ok := s.delivered[id]; ok {
		return d.at, nil
	}
	if err := s.admitWrite(); err != nil {
		return time.Time{}, err
	}
	now := s.now()
	s.delivered[id] = record{at: now, collect: expires.Add(s.limits.Grace)}
	return now, nil
}

// UseOnce implements sessions.Store.
func (s *Store) UseOnce(_ context.Context, key string, expires time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.collect()
	if _, used := s.marks[key]; used {
		return sessions.ErrNonceUsed
	}
	if err := s.admitWrite(); err != nil {
		return err
	}
	s.marks[key] = expires.Add(s.limits.Grace)
	return nil
}

// AdmitPoll implements sessions.Store.
func (s *Store) AdmitPoll(_ context.Context, id, nonce string, expires time.Time, minInterval time.Duration) error {
	return s.admit.Admit(id, nonce, expires, s.now(), minInterval)
}

// Wait implements sessions.Store.
func (s *Store) Wait(ctx context.Context, id string) (sessions.Outcome, error) {
	s.mu.Lock()
	r, ok := s.outcomes[id]
	if ok {
		s.mu.Unlock()
		return r.outcome, nil
	}
	ch := make(chan struct{})
	s.waiters[id] = append(s.waiters[id], ch)
	s.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		s.dropWaiter(id, ch)
	}
	return s.Outcome(ctx, id)
}

func (s *Store) dropWaiter(id string, ch chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.waiters[id]
	for i, w := range ws {
		if w == ch {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(s.waiters, id)
	} else {
		s.waiters[id] = ws
	}
}

// admitWrite admits one new record, with mu held: within the write
// budget and below MaxRecords (collecting first when at it), else
// ErrOverBudget.
func (s *Store) admitWrite() error {
	if len(s.outcomes)+len(s.delivered)+len(s.marks) >= s.limits.MaxRecords {
		s.collectNow()
		if len(s.outcomes)+len(s.delivered)+len(s.marks) >= s.limits.MaxRecords {
			return sessions.ErrOverBudget
		}
	}
	return s.budget.Take()
}

// collect drops what is past its time. Called with mu held by every
// write, so the maps never hold more than what is alive plus one write's
// worth; reads need not collect (an expired session is refused before
// its records are asked for).
func (s *Store) collect() {
	if s.now().Before(s.nextCollect) {
		return
	}
	s.collectNow()
}

// collectNow is collect whenever it was last run.
func (s *Store) collectNow() {
	now := s.now()
	s.nextCollect = now.Add(collectEvery)
	for id, r := range s.outcomes {
		if now.After(r.collect) {
			delete(s.outcomes, id)
		}
	}
	for id, r := range s.delivered {
		if now.After(r.collect) {
			delete(s.delivered, id)
		}
	}
	for k, at := range s.marks {
		if now.After(at) {
			delete(s.marks, k)
		}
	}
	s.admit.Sweep(now)
}

// collectEvery spaces the scans of collect.
const collectEvery = 10 * time.Second

// Len returns how many outcomes, deliveries and marks the store holds.
func (s *Store) Len() (outcomes, deliveries, marks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.outcomes), len(s.delivered), len(s.marks)
}
