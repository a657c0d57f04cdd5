// Package sessions keeps the state of binding sessions: the session record a
// client created, the nonces it has used, when it last polled, and the
// outcome of the browser part (a BindingResponse, or a denial).
//
// Store is the one interface every implementation satisfies; the behaviour
// is pinned down by the shared conformance suite in sessions/storetest,
// which every implementation must pass unchanged.
package sessions

import (
	"context"
	"errors"
	"fmt"
	"time"
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

// Session is one binding session. ID, ClusterID, Secret, CreatedAt and the
// callback fields are fixed at Create; the rest changes only through the
// Store's methods.
type Session struct {
	ID        string
	ClusterID string
	// Secret is the session secret that keys request signatures. Never log it.
	Secret    string
	CreatedAt time.Time
	// ExpiresAt is when the session stops existing: CreatedAt+TTL while
	// pending, later once completed (see Store.Complete and Store.RecordPoll).
	ExpiresAt time.Time

	// CallbackURL and CallbackSessionID are set for sessions of the callback
	// flow of released CLIs: where to redirect the browser, and the CLI's own
	// session ID to echo back.
	CallbackURL       string
	CallbackSessionID string

	State State
	// Response is the JSON BindingResponse, set when State is StateCompleted.
	Response []byte
	// DenyReason says in words why the session was denied.
	DenyReason string
	// DeliveredAt is when the Response was first handed to a poll.
	DeliveredAt time.Time
	// LastPollAt is when the session was last polled (zero: never).
	LastPollAt time.Time
}

// StaticPart returns the fields of s fixed at Create (what Store.Static
// returns), every other field zero.
func (s Session) StaticPart() Session {
	return Session{ID: s.ID, ClusterID: s.ClusterID, Secret: s.Secret, CreatedAt: s.CreatedAt,
		CallbackURL: s.CallbackURL, CallbackSessionID: s.CallbackSessionID}
}

// Store keeps sessions. Every method is safe for concurrent use, and atomic
// with respect to the others for the same session, across every replica
// that shares the store. A session past its ExpiresAt behaves as if it did
// not exist (ErrNotFound). Callers must not modify returned Sessions'
// slices.
type Store interface {
	// Create stores a new pending session. It fails with ErrExists if the
	// ID is taken, and with ErrFull when the store holds its configured
	// maximum of sessions. Create sets nothing of s but what s carries; the
	// caller fills ID, ClusterID, Secret, CreatedAt and ExpiresAt.
	Create(ctx context.Context, s Session) error

	// Get returns the session with this ID, or ErrNotFound.
	Get(ctx context.Context, id string) (Session, error)

	// Static returns the part of the session fixed at Create (ID,
	// ClusterID, Secret, CreatedAt, CallbackURL, CallbackSessionID; every
	// other field zero), or ErrNotFound for a session it does not know.
	// These fields never change, so an implementation may answer from a
	// cache, and may still return them for a session that ended moments
	// ago: what the session's state allows is decided by the operations
	// that follow (RecordPoll of an ended session fails with ErrNotFound).
	// A signature check needs only this part.
	Static(ctx context.Context, id string) (Session, error)

	// UseNonce records that nonce was used for this session. It fails with
	// ErrNonceUsed if it was used before (by UseNonce or RecordPoll), with
	// ErrNotFound for an unknown session, and with ErrTooManyNonces once the
	// session has used its bounded number of nonces.
	UseNonce(ctx context.Context, id, nonce string) error

	// RecordPoll uses nonce exactly as UseNonce does, then records a poll at
	// the store's current time. If the previous poll of this session was
	// less than minInterval ago it fails with a *TooSoonError (errors.Is
	// ErrTooSoon) carrying how long to wait, and changes nothing: the poll
	// does not count as the session's last one and its nonce stays unused,
	// so that polling too fast cannot fill the session's bounded nonce set
	// (a used nonce is still ErrNonceUsed, too soon or not). Otherwise it
	// returns the session as it is after the poll. The first poll that sees StateCompleted sets
	// DeliveredAt and shortens ExpiresAt to DeliveredAt plus the store's
	// grace period: further polls get the same response until then.
	//
	// An implementation that answers Static from a cache may fail with
	// ErrStaleStatic, changing nothing, when the session under this ID is
	// not the one its cache holds (the ID was deleted and created again
	// with other fields): the caller checks the signature again with a
	// fresh Static and retries.
	RecordPoll(ctx context.Context, id, nonce string, minInterval time.Duration) (Session, error)

	// Complete moves a pending session to StateCompleted with response (a
	// JSON BindingResponse) and extends ExpiresAt to at least now plus the
	// grace period. It fails with ErrNotPending if the session is not
	// pending, and with ErrTooLarge if response exceeds the store's limit.
	Complete(ctx context.Context, id string, response []byte) error

	// Deny moves a pending session to StateDenied with a reason in words.
	// It fails with ErrNotPending if the session is not pending.
	Deny(ctx context.Context, id, reason string) error

	// Delete removes the session at once. Deleting an unknown session is
	// not an error.
	Delete(ctx context.Context, id string) error

	// Wait blocks until the session is no longer pending (Complete or
	// Deny, on whichever replica) or ctx ends, and returns the session as
	// it is then: completed, denied, or still pending when ctx ended (that
	// is not an error; a store that asks another replica may return
	// pending up to WaitMargin before ctx's deadline, so that its answer
	// is in before the caller gives up). It fails with ErrNotFound for an unknown session
	// and for one deleted or expired while waited for. Wait records no
	// poll and spends no nonce (the caller has called RecordPoll), but a
	// completed session it returns counts as delivered, exactly as the
	// first poll that sees it: DeliveredAt is set and ExpiresAt shortened
	// to DeliveredAt plus the grace period. It serves long polls
	// (docs/long-polling.md).
	Wait(ctx context.Context, id string) (Session, error)
}

var (
	ErrNotFound      = errors.New("session not found or expired")
	ErrExists        = errors.New("session already exists")
	ErrFull          = errors.New("too many pending sessions")
	ErrNonceUsed     = errors.New("nonce already used")
	ErrTooManyNonces = errors.New("session used too many nonces")
	ErrTooSoon       = errors.New("polled too soon")
	ErrNotPending    = errors.New("session is not pending")
	ErrTooLarge      = errors.New("binding response too large")
	ErrStaleStatic   = errors.New("the session's static part changed since Static; check the signature again")
	// ErrUnavailable: the session may exist but the part of the store
	// holding it cannot answer now (a replica that is slow, restarting or
	// handing its sessions over). Transient, unlike ErrNotFound: the
	// caller should try again shortly (503 with Retry-After), not start
	// over.
	ErrUnavailable = errors.New("session store temporarily unavailable")
)

// TooSoonError is returned by RecordPoll for a poll within the interval.
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
	// MaxSessions is the most sessions held at once; Create beyond it fails
	// with ErrFull. At most MaxSessionsBound.
	MaxSessions int
	// MaxNoncesPerSession bounds the used nonces remembered per session.
	MaxNoncesPerSession int
	// MaxResponseBytes bounds a stored BindingResponse.
	MaxResponseBytes int
	// Grace is how long a delivered response stays available.
	Grace time.Duration
}

// MaxSessionsBound is the largest MaxSessions a store takes (a memory
// store indexes the sessions and copies it holds, up to three times
// MaxSessions, with 32-bit positions); a larger one is taken as this.
const MaxSessionsBound = 100_000_000

// WaitMargin is how much before its context's deadline Store.Wait may
// return a session that is still pending.
const WaitMargin = 250 * time.Millisecond

// DefaultTTL is how long a session lives after creation where nothing else
// is configured (the backend's --session-ttl default); the browser login
// gets as long.
const DefaultTTL = 10 * time.Minute

// DefaultLimits are the limits used where none are configured.
var DefaultLimits = Limits{
	MaxSessions:         10000,
	MaxNoncesPerSession: 1024,
	MaxResponseBytes:    256 << 10,
	Grace:               60 * time.Second,
}
