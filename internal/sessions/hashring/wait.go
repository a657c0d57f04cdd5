package hashring

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
	"github.com/kbprovider/backend/internal/sessions/memory"
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
// sessions.Store). Where the session is held as owner it waits in the
// local store (taking the session first if the ring names this replica
// its owner); elsewhere it waits at the owner, following the session to a
// new owner when a handover or a ring change moves it.
func (s *Store) Wait(ctx context.Context, id string) (sessions.Session, error) {
	for moves := 0; ; moves++ {
		if owned, _ := s.local.Holds(id); owned {
			// Wait here. A handover releases the wait (ErrNotOwned):
			// wait again where the session went. ErrNotFound: deleted or
			// expired meanwhile (never taken back from a copy). A
			// completed session is delivered now: its copy learns so.
			sess, err := s.local.Wait(ctx, id)
			if !errors.Is(err, memory.ErrNotOwned) {
				return sess, s.waitDelivered(ctx, sess, err)
			}
			if moves >= maxWaitMoves {
				return sessions.Session{}, fmt.Errorf("%w: the session kept moving while waited for", sessions.ErrUnavailable)
			}
			continue
		}
		var (
			sess sessions.Session
			err  error
		)
		owner := s.view().owner(id)
		switch {
		case owner == "":
			return sessions.Session{}, fmt.Errorf("%w: this replica has not joined the session ring", sessions.ErrUnavailable)
		case owner == s.self:
			err = s.take(ctx, id)
			if err == nil {
				err = errMoved // now held here: wait again
			}
		default:
			sess, err = s.waitAt(ctx, owner, id)
			if s.peerDown(owner, err) {
				s.markDown(owner)
				err = errMoved
			}
		}
		if errors.Is(err, errMoved) && ctx.Err() != nil {
			// Time is up as the session moved: its state as it is now.
			c, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.peerTimeout)
			defer cancel()
			return s.Get(c, id)
		}
		if !errors.Is(err, errMoved) || moves >= maxWaitMoves {
			if errors.Is(err, errMoved) {
				err = fmt.Errorf("%w: the session kept moving while waited for", sessions.ErrUnavailable)
			}
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
	resps, err := s.roundTrip(ctx, s.waitClient, peer, [][]byte{encodeRequestJSON(req)})
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
	if owned, _ := s.local.Holds(req.ID); !owned {
		// Not held here as owner (handed over, or not taken yet).
		if s.Owner(req.ID) != s.self {
			return &peerResponse{Err: movedCode}
		}
		if err := s.take(wctx, req.ID); err != nil {
			return &peerResponse{Err: errorCode(err)}
		}
	}
	// ErrNotFound from here: deleted or expired while waited for.
	sess, err := s.local.Wait(wctx, req.ID)
	if errors.Is(err, memory.ErrNotOwned) {
		return &peerResponse{Err: movedCode}
	}
	if err = s.waitDelivered(ctx, sess, err); err != nil {
		return &peerResponse{Err: errorCode(err)}
	}
	return &peerResponse{Session: toWire(sess)}
}

// waitDelivered sends a session that a local Wait returned completed (and
// so delivered, which shortens its life to the grace period) to its
// backup, as RecordPoll's delivery is: a copy that did not learn of it
// would outlive the owner's record and could be taken over after it.
func (s *Store) waitDelivered(ctx context.Context, sess sessions.Session, err error) error {
	if err != nil || sess.State != sessions.StateCompleted {
		return err
	}
	return s.replicate(ctx, memory.Record{Session: sess, Partial: true})
}
