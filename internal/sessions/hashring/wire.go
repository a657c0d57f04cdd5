package hashring

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/memory"
)

// Operations of the peer API.
const (
	opCreate   = "create"
	opGet      = "get"
	opState    = "state" // the mutable part only, and the static digest
	opStatic   = "static"
	opUseNonce = "usenonce"
	opPoll     = "poll"
	opComplete = "complete"
	opDeny     = "deny"
	opDelete   = "delete"

	// Membership and ownership (membership.go, owner.go).
	opJoin      = "join"      // Member false: a hello (who is in?); true: add me
	opLeave     = "leave"     // remove me from your ring
	opTransfer  = "transfer"  // give me (the new owner) what you hold of ID
	opReplicate = "replicate" // keep these records as backup copies
	opHandover  = "handover"  // take these records as owner
	opDropCopy  = "dropcopy"  // the owner deleted ID: drop your copy
)

// peerRequest is the plaintext of a sealed request to a session's owner.
type peerRequest struct {
	Sent     int64        `json:"t"` // Unix nanoseconds, wall clock
	Op       string       `json:"op"`
	ID       string       `json:"id,omitempty"`
	Nonce    string       `json:"n,omitempty"`
	Interval int64        `json:"i,omitempty"`
	Reason   string       `json:"r,omitempty"`
	Response []byte       `json:"b,omitempty"`
	Session  *wireSession `json:"s,omitempty"`

	// From, Inc, Member and Left say who sends: its peer URL, its
	// incarnation (random per process, so a restarted replica at the same
	// URL is told apart), whether it is a member of the ring (joined, not
	// leaving) and whether it left (neither: not joined yet).
	From   string `json:"f,omitempty"`
	Inc    uint64 `json:"inc,omitempty"`
	Member bool   `json:"m,omitempty"`
	Left   bool   `json:"l,omitempty"`
	// Hop counts how often the request was forwarded: a replica forwards
	// at most maxHops times, so rings that briefly disagree never make a
	// request bounce.
	Hop     int          `json:"h,omitempty"`
	Records []wireRecord `json:"rs,omitempty"`
	// Req identifies one poll (random, made by the replica the client
	// asked) through forwards and retries: see memory.PollMark.
	Req uint64 `json:"rq,omitempty"`
}

// wireRecord is a memory.Record on the wire.
type wireRecord struct {
	Session *wireSession `json:"s"`
	Nonces  []uint64     `json:"n,omitempty"`
	Partial bool         `json:"p,omitempty"`
	// LastPoll is memory.Record.LastPoll: nonce hash and request ID.
	LastPollNonce   uint64 `json:"ln,omitempty"`
	LastPollRequest uint64 `json:"lr,omitempty"`
}

func toWireRecord(r memory.Record) wireRecord {
	return wireRecord{Session: toWire(r.Session), Nonces: r.Nonces, Partial: r.Partial,
		LastPollNonce: r.LastPoll.Nonce, LastPollRequest: r.LastPoll.Request}
}

func fromWireRecord(w wireRecord) (memory.Record, bool) {
	if w.Session == nil {
		return memory.Record{}, false
	}
	return memory.Record{Session: fromWire(w.Session), Nonces: w.Nonces, Partial: w.Partial,
		LastPoll: memory.PollMark{Nonce: w.LastPollNonce, Request: w.LastPollRequest}}, true
}

// peerResponse is the plaintext of a sealed answer.
type peerResponse struct {
	Err        string       `json:"e,omitempty"`
	RetryAfter int64        `json:"ra,omitempty"`
	Session    *wireSession `json:"s,omitempty"`
	Static     []byte       `json:"st,omitempty"`

	// Member, Left and Inc: the answering replica's membership, as in
	// requests.
	Member bool   `json:"m,omitempty"`
	Left   bool   `json:"l,omitempty"`
	Inc    uint64 `json:"inc,omitempty"`
	// Record and Owned answer a transfer: what the replica held, and
	// whether it held it as owner (then it holds it as a copy now).
	Record *wireRecord `json:"rec,omitempty"`
	Owned  bool        `json:"o,omitempty"`
	// Errs answer replicate and handover: one wire error code per record
	// ("" for success).
	Errs []string `json:"es,omitempty"`
}

// wireSession is a Session on the wire; times are Unix nanoseconds, 0 for
// the zero time.
type wireSession struct {
	ID                string `json:"id"`
	ClusterID         string `json:"c,omitempty"`
	Secret            string `json:"k,omitempty"`
	CreatedAt         int64  `json:"ca,omitempty"`
	ExpiresAt         int64  `json:"ea,omitempty"`
	CallbackURL       string `json:"cu,omitempty"`
	CallbackSessionID string `json:"cs,omitempty"`
	State             int    `json:"st,omitempty"`
	Response          []byte `json:"r,omitempty"`
	DenyReason        string `json:"dr,omitempty"`
	DeliveredAt       int64  `json:"da,omitempty"`
	LastPollAt        int64  `json:"lp,omitempty"`
	// StaticDigest identifies the static part (opState answers only).
	StaticDigest []byte `json:"sd,omitempty"`
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func toWire(s sessions.Session) *wireSession {
	return &wireSession{
		ID: s.ID, ClusterID: s.ClusterID, Secret: s.Secret,
		CreatedAt: nanos(s.CreatedAt), ExpiresAt: nanos(s.ExpiresAt),
		CallbackURL: s.CallbackURL, CallbackSessionID: s.CallbackSessionID,
		State: int(s.State), Response: s.Response, DenyReason: s.DenyReason,
		DeliveredAt: nanos(s.DeliveredAt), LastPollAt: nanos(s.LastPollAt),
	}
}

func fromWire(w *wireSession) sessions.Session {
	return sessions.Session{
		ID: w.ID, ClusterID: w.ClusterID, Secret: w.Secret,
		CreatedAt: fromNanos(w.CreatedAt), ExpiresAt: fromNanos(w.ExpiresAt),
		CallbackURL: w.CallbackURL, CallbackSessionID: w.CallbackSessionID,
		State: sessions.State(w.State), Response: w.Response, DenyReason: w.DenyReason,
		DeliveredAt: fromNanos(w.DeliveredAt), LastPollAt: fromNanos(w.LastPollAt),
	}
}

// staticPart is what of a session never changes after Create: the value
// cached in the groupcache group, keyed by session ID.
type staticPart struct {
	ID                string `json:"id"`
	ClusterID         string `json:"c,omitempty"`
	Secret            string `json:"k,omitempty"`
	CreatedAt         int64  `json:"ca,omitempty"`
	CallbackURL       string `json:"cu,omitempty"`
	CallbackSessionID string `json:"cs,omitempty"`
}

func staticOf(s sessions.Session) staticPart {
	return staticPart{ID: s.ID, ClusterID: s.ClusterID, Secret: s.Secret, CreatedAt: nanos(s.CreatedAt),
		CallbackURL: s.CallbackURL, CallbackSessionID: s.CallbackSessionID}
}

// digest identifies a static part: a session deleted and created again
// under the same ID with other fields has another digest, so a stale
// cached static part is never combined with the new session's state.
func (p staticPart) digest() []byte {
	h := sha256.New()
	for _, f := range []string{p.ID, p.ClusterID, p.Secret, p.CallbackURL, p.CallbackSessionID} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(p.CreatedAt))
	h.Write(n[:])
	return h.Sum(nil)[:16]
}

// Error codes on the wire, one per sessions error.
var wireErrors = map[string]error{
	"not_found":       sessions.ErrNotFound,
	"exists":          sessions.ErrExists,
	"full":            sessions.ErrFull,
	"nonce_used":      sessions.ErrNonceUsed,
	"too_many_nonces": sessions.ErrTooManyNonces,
	"too_soon":        sessions.ErrTooSoon,
	"not_pending":     sessions.ErrNotPending,
	"too_large":       sessions.ErrTooLarge,
	"unavailable":     sessions.ErrUnavailable,
	"mismatch":        memory.ErrStaticMismatch,
	"malformed":       errBadOp,
}

func errorCode(err error) string {
	for code, e := range wireErrors {
		if errors.Is(err, e) {
			return code
		}
	}
	return "internal"
}

// decodeError turns a wire error back into the sessions error.
func decodeError(r *peerResponse) error {
	if r.Err == "" {
		return nil
	}
	if r.Err == "too_soon" {
		return &sessions.TooSoonError{RetryAfter: time.Duration(r.RetryAfter)}
	}
	if e, ok := wireErrors[r.Err]; ok {
		return e
	}
	return errors.New("hashring: the owner failed: " + r.Err)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain structs are marshalled
	}
	return b
}
