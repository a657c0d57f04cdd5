package hashring

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

// Long polls (Store.Wait) on a replica that does not own the session wait
// at the owner, which is the only replica that learns at once when the
// session completes. The wait travels as the peer operation opWait, in a
// request of its own on connections of its own: a held request must not
// sit in (or delay) the pipe that carries every other operation, and its
// timeouts are longer.
//
// A wait is cut into segments of at most maxPeerWait, each one request:
// the peer API's server cuts responses that take longer than its write
// timeout (10s), and a caller whose ring changed moves on to the new owner
// at the next segment. A wait request carries its duration in Interval
// (nanoseconds), so the operation needs no field of its own on the wire.
const (
	opWait = "wait"
	// maxPeerWait bounds one held peer request, well below the peer
	// server's write timeout.
	maxPeerWait = 5 * time.Second
	// waitMargin is how much sooner than the caller's deadline the owner is
	// asked to answer, so that its "still pending" arrives before the
	// caller gives up on the request.
	waitMargin = sessions.WaitMargin * 4 / 5
	// maxWaitMoves bounds how often one Wait follows a session to another
	// owner (a handover while it waited).
	maxWaitMoves = 3
	// movedCode is the owner's answer when it no longer holds the session
	// and its ring names another owner: the caller waits there.
	movedCode = "moved"
)

// errMoved says the replica asked no longer owns the session.
var errMoved = errors.New("hashring: the session moved to another replica while waited for")

// newWaitClient returns the HTTP client of held wait requests: the peer
// transport's settings on a pool of its own, with a response header
// timeout that lets the owner hold a request for maxPeerWait.
func newWaitClient(rt http.RoundTripper, peerTimeout time.Duration) *http.Client {
	if t, ok := rt.(*http.Transport); ok {
		t = t.Clone()
		t.ResponseHeaderTimeout = maxPeerWait + peerTimeout
		rt = t
	}
	return &http.Client{Transport: rt, Timeout: maxPeerWait + 2*peerTimeout}
}

// Wait waits until the session is completed or denied, or ctx ends (see
// sessions.Store). On the owner it waits in the local store; elsewhere it
// waits at the owner, following the session to a new owner when a ring
// change moves it.
func (s *Store) Wait(ctx context.Context, id string) (sessions.Session, error) {
	for moves := 0; ; moves++ {
		owner := s.Owner(id)
		var (
			sess sessions.Session
			err  error
		)
		if owner == s.self {
			sess, err = s.local.Wait(ctx, id)
			// Handed over while waited for: the local copy is gone, the
			// ring names its new owner.
			if errors.Is(err, sessions.ErrNotFound) && s.Owner(id) != s.self {
				err = errMoved
			}
		} else {
			sess, err = s.waitAt(ctx, owner, id)
		}
		if !errors.Is(err, errMoved) || moves >= maxWaitMoves || ctx.Err() != nil || s.Owner(id) == owner {
			return sess, err
		}
	}
}

// waitAt waits at owner, segment by segment, until the session is no
// longer pending, ctx ends, or the ring names another owner (errMoved).
func (s *Store) waitAt(ctx context.Context, owner, id string) (sessions.Session, error) {
	for {
		d := maxPeerWait
		if dl, ok := ctx.Deadline(); ok {
			d = max(min(d, time.Until(dl)-waitMargin), 0)
		}
		sess, err := s.callWait(ctx, owner, id, d)
		if err != nil && ctx.Err() != nil {
			// ctx ended while the owner held the request (a cancelled
			// poll, or the deadline came before the owner's answer):
			// ask for the state as it is now, at once.
			c, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.peerTimeout)
			defer cancel()
			return s.callWait(c, owner, id, 0)
		}
		if err != nil || sess.State != sessions.StatePending || d == 0 || ctx.Err() != nil {
			return sess, err
		}
		if s.Owner(id) != owner {
			return sess, errMoved
		}
	}
}

// callWait sends one wait request to peer, in a sealed message of its own
// (a batch of one, not through the pipe), held there for at most d, and
// returns the session as the owner answered it.
func (s *Store) callWait(ctx context.Context, peer, id string, d time.Duration) (sessions.Session, error) {
	req := &peerRequest{Op: opWait, ID: id, Interval: int64(d)}
	resps, err := s.roundTrip(ctx, s.waitClient, peer, [][]byte{mustJSON(req)})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("session owner did not answer", "peer", peer, "op", opWait, "error", err)
		}
		return sessions.Session{}, &OwnerUnavailableError{Owner: peer, Op: opWait, Err: err}
	}
	resp := resps[0]
	if resp.Err == movedCode {
		return sessions.Session{}, errMoved
	}
	if err := decodeError(resp); err != nil {
		return sessions.Session{}, err
	}
	if resp.Session == nil {
		return sessions.Session{}, &OwnerUnavailableError{Owner: peer, Op: opWait, Err: errors.New("peer answered without a session")}
	}
	return fromWire(resp.Session), nil
}

// serveWait is opWait on the owner: it waits in the local store for at
// most the asked duration (capped at maxPeerWait) or until the caller
// gives up (ctx). A replica that no longer holds the session and whose
// ring names another owner answers movedCode.
func (s *Store) serveWait(ctx context.Context, req *peerRequest) *peerResponse {
	d := min(max(time.Duration(req.Interval), 0), maxPeerWait)
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	sess, err := s.local.Wait(wctx, req.ID)
	switch {
	case errors.Is(err, sessions.ErrNotFound) && s.Owner(req.ID) != s.self:
		return &peerResponse{Err: movedCode}
	case err != nil:
		return &peerResponse{Err: errorCode(err)}
	}
	return &peerResponse{Session: toWire(sess)}
}
