// Package sessions keeps what a binding session needs beyond what its ID and
// secret carry (package sessionkey derives those, so a pending session needs
// no stored state): the outcome of the browser part (a BindingResponse or a
// denial), the first delivery of a response, single-use marks (the nonces
// of authorize links, login states) and the pace of a session's polls.
//
// Writes pass a budget (Limits.WriteRate; the memory store also
// Limits.MaxRecords) that fails closed with ErrOverBudget.
//
// Store is the one interface every implementation satisfies; the behaviour
// is pinned down by the shared conformance suite in sessions/conformance,
// which every implementation must pass unchanged.
package sessions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/time/rate"
)

// State is where a session is in its life.
type State int

const (
	// StatePending: the user has not finished in the browser.
	StatePending State = iota
	// StateCompleted: a BindingResponse is ready for the client.
	StateCompleted
	// StateDenied: the user cancelled or the provider refused the user.
	StateDenied
)

func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateCompleted:
		return "completed"
	case StateDenied:
		return "denied"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Outcome is what the browser part of a session ended with. The zero
// Outcome is a pending session. A recorded outcome never changes.
type Outcome struct {
	State State
	// Response is the JSON BindingResponse when State is StateCompleted.
	// It holds a credential: never log it.
	Response []byte
	// Namespace is the provider namespace the response was issued for
	// (StateCompleted): the binding a delivery marks. Empty when the
	// record does not say (written by a version that did not keep it).
	Namespace string
	// DenyReason says in words why the session was denied.
	DenyReason string
}

// Store keeps the outcomes, marks and poll pace of sessions. Every method
// is safe for concurrent use, and every replica sharing a store sees the
// same outcomes and marks.
//
// Each record is kept until the time the caller gives with it (the
// session's expiry: sessionkey signs it into the session ID, so nothing
// can ask for a session past it) plus the store's grace period, and is
// collected after that. Callers must not modify returned slices.
type Store interface {
	// Outcome returns the session's outcome: the zero Outcome while none
	// is recorded.
	Outcome(ctx context.Context, id string) (Outcome, error)

	// Complete records response (a JSON BindingResponse), issued for
	// provider namespace ns, as the session's outcome, kept until expires
	// plus the grace period; Outcome returns both. Exactly one outcome is
	// recorded per session, whichever replica writes first: a session
	// with one fails with ErrNotPending. A response over the store's
	// limit fails with ErrTooLarge.
	Complete(ctx context.Context, id string, expires time.Time, ns string, response []byte) error

	// Deny records a denial with a reason in words, as Complete does.
	Deny(ctx context.Context, id string, expires time.Time, reason string) error

	// Deliver is called by each poll that is about to hand out the
	// session's completed response. The first call records the delivery;
	// every call returns when that was. The caller serves the response
	// only within the grace period after it (Limits.Grace), so that a
	// delivered credential is never served later, by any replica, after
	// any restart. It fails with ErrNotPending when no response is
	// recorded.
	Deliver(ctx context.Context, id string, expires time.Time) (time.Time, error)

	// UseOnce spends the single-use mark key (an authorize link's nonce,
	// a login state), kept until expires plus the grace period. It fails
	// with ErrNonceUsed if key was spent before, on any replica.
	UseOnce(ctx context.Context, key string, expires time.Time) error

	// AdmitPoll admits a poll of the session with nonce. It fails with
	// ErrNonceUsed if the session used nonce before, with
	// ErrTooManyNonces once the session used its bounded number of
	// nonces, and with a *TooSoonError (errors.Is ErrTooSoon) when the
	// session's previous admitted poll was less than minInterval ago; a
	// poll refused as too soon changes nothing (its nonce stays unused
	// and it does not count as the last poll). It fails with
	// ErrSessionOver once expires has passed on the store's clock, and
	// for a session whose state the store had to evict: a session is
	// never forgotten and then admitted again, so no load makes a used
	// nonce usable. The pace and the nonces are kept in memory by the
	// replica that owns the session, so that polls need no write to any
	// database: a change of owners (a replica joining, leaving, restarting
	// or unreachable) may let a nonce be used once more on the new owner
	// (docs/sessions.md).
	AdmitPoll(ctx context.Context, id, nonce string, expires time.Time, minInterval time.Duration) error

	// Wait blocks until the session has an outcome or ctx ends, and
	// returns the outcome then (pending when ctx ended; that is not an
	// error). It serves long polls (docs/long-polling.md).
	Wait(ctx context.Context, id string) (Outcome, error)
}

// Peeker is a Store that keeps what a poll decides on in memory and the
// responses in a database, read on demand: a replica then holds a few
// hundred bytes per outcome, not its response. The ring reads responses
// through its cache on the session's owner, so that the replicas' reads
// of one response cost the database one read.
type Peeker interface {
	Store
	// Peek returns the session's outcome as far as this replica's memory
	// holds it, with no request: the zero Outcome while pending or after
	// its record's collection time. When record is not empty, the
	// Outcome lacks what only ReadOutcome returns (the response of a
	// completed session, a deny reason too long to keep in memory); a
	// completed one has its Namespace where the record has one.
	Peek(ctx context.Context, id string) (o Outcome, record string, err error)
	// WaitPeek is Wait returning what Peek does.
	WaitPeek(ctx context.Context, id string) (o Outcome, record string, err error)
	// ReadOutcome reads the whole outcome of session id from record (as
	// Peek returned it): the zero Outcome when that record is gone or
	// past its collection time.
	ReadOutcome(ctx context.Context, id, record string) (Outcome, error)
}

var (
	ErrNonceUsed     = errors.New("nonce already used")
	ErrTooManyNonces = errors.New("session used too many nonces")
	ErrTooSoon       = errors.New("polled too soon")
	// ErrSessionOver: AdmitPoll admits no more polls of the session (it
	// expired, or its state was evicted under load). Final: the client
	// starts a new session.
	ErrSessionOver = errors.New("session over: its polls are no longer admitted")
	ErrNotPending  = errors.New("session is not pending")
	ErrTooLarge    = errors.New("binding response too large")
	// ErrUnavailable: the store cannot answer now (its database is
	// unreachable, or its write budget is spent). Transient: the caller
	// should try again shortly (503 with Retry-After), not start over.
	ErrUnavailable = errors.New("session store temporarily unavailable")
	// ErrOverBudget: a write refused because the store's write budget
	// (Limits.WriteRate, Limits.MaxRecords) is spent; errors.Is
	// ErrUnavailable too. Nothing was written.
	ErrOverBudget = fmt.Errorf("%w: write budget spent", ErrUnavailable)
)

// TooSoonError is returned by AdmitPoll for a poll within the interval.
type TooSoonError struct {
	// RetryAfter is how long until the next poll is welcome (> 0).
	RetryAfter time.Duration
}

func (e *TooSoonError) Error() string {
	return fmt.Sprintf("polled too soon, retry after %s", e.RetryAfter)
}

// Is makes errors.Is(err, ErrTooSoon) true.
func (e *TooSoonError) Is(target error) bool { return target == ErrTooSoon }

// Limits bound what a store keeps, so memory stays bounded.
type Limits struct {
	// MaxPolledSessions bounds the sessions whose poll pace and nonces a
	// replica remembers; beyond it, the sessions expiring first are
	// evicted and their polls refused with ErrSessionOver.
	MaxPolledSessions int
	// MaxNoncesPerSession bounds the nonces remembered per session.
	MaxNoncesPerSession int
	// MaxResponseBytes bounds a stored BindingResponse.
	MaxResponseBytes int
	// Grace is how long a delivered response stays available, and how
	// long records are kept past their session's expiry.
	Grace time.Duration
	// WriteRate and WriteBurst are the store's write budget: a token
	// bucket of records written (Complete, Deny, the first Deliver,
	// UseOnce) per second, per store instance (per replica: the global
	// budget of a shared database is replicas × WriteRate). A write past
	// it fails at once with ErrOverBudget and writes nothing: the caller
	// answers 503, and nothing queues.
	WriteRate  float64
	WriteBurst int
	// MaxRecords bounds the records a store keeps in its own memory
	// (outcomes, deliveries and marks; the memory store): a write that
	// would keep more fails with ErrOverBudget.
	MaxRecords int
}

// DefaultTTL is how long a session lives after creation where nothing else
// is configured (the backend's --session-ttl default); the browser login
// gets as long.
const DefaultTTL = 10 * time.Minute

// DefaultLimits are the limits used where none are configured.
var DefaultLimits = Limits{
	MaxPolledSessions:   100_000,
	MaxNoncesPerSession: 1024,
	MaxResponseBytes:    256 << 10,
	Grace:               60 * time.Second,
	// A bind writes four records (the link's nonce, the login state,
	// the outcome, the first delivery): about 12 binds a second per
	// replica, 25 at once.
	WriteRate:  50,
	WriteBurst: 100,
	// Records live a session's TTL plus the grace period (11 minutes by
	// default): 20,000 is about 5,000 binds in that time.
	MaxRecords: 20_000,
}

// WithDefaults returns l with every zero field taken from DefaultLimits.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits
	if l.MaxPolledSessions <= 0 {
		l.MaxPolledSessions = d.MaxPolledSessions
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
	if !(l.WriteRate > 0) {
		l.WriteRate = d.WriteRate
	}
	if l.WriteBurst <= 0 {
		l.WriteBurst = d.WriteBurst
	}
	if l.MaxRecords <= 0 {
		l.MaxRecords = d.MaxRecords
	}
	return l
}

// WriteBudget is the token bucket of Limits.WriteRate and WriteBurst,
// on the store's clock. Safe for concurrent use.
type WriteBudget struct {
	now func() time.Time
	lim *rate.Limiter
}

// NewWriteBudget returns the write budget of l (l.WithDefaults()) on the
// clock now.
func NewWriteBudget(l Limits, now func() time.Time) *WriteBudget {
	l = l.WithDefaults()
	return &WriteBudget{now: now, lim: rate.NewLimiter(rate.Limit(l.WriteRate), l.WriteBurst)}
}

// Take spends one write, or fails with ErrOverBudget when none is left
// now: it never waits.
func (b *WriteBudget) Take() error {
	if !b.lim.AllowN(b.now(), 1) {
		return ErrOverBudget
	}
	return nil
}
