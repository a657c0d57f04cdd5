package hashring

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

func defaultTransport(timeout time.Duration) http.RoundTripper {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: timeout / 2, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: timeout,
	}
}

// maxPeerMessage bounds a peer message: a response of the largest size,
// base64 in JSON, and the rest of a session.
func (s *Store) maxPeerMessage() int64 {
	return int64(s.limits.MaxResponseBytes)*4/3 + 64<<10
}

// call sends a sealed request to peer and returns its answer, or the
// sessions error the owner answered, or an *OwnerUnavailableError.
func (s *Store) call(ctx context.Context, peer string, req *peerRequest) (*peerResponse, error) {
	req.Sent = time.Now().UnixNano()
	msg := s.sealer.seal(mustJSON(req), aadRequest)
	reqNonce := msg[:gcmNonceSize]
	unavailable := func(err error) error {
		s.log.Warn("session owner did not answer", "peer", peer, "op", req.Op, "error", err)
		return &OwnerUnavailableError{Owner: peer, Op: req.Op, Err: err}
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, peer+PeerPath, bytes.NewReader(msg))
	if err != nil {
		return nil, unavailable(err)
	}
	hr.Header.Set("Content-Type", "application/octet-stream")
	res, err := s.client.Do(hr)
	if err != nil {
		return nil, unavailable(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, s.maxPeerMessage()+1))
	if err != nil {
		return nil, unavailable(err)
	}
	if res.StatusCode != http.StatusOK {
		return nil, unavailable(errors.New("peer answered " + res.Status))
	}
	_, plain, err := s.sealer.open(body, responseAAD(reqNonce))
	if err != nil {
		return nil, unavailable(err)
	}
	var resp peerResponse
	if err := json.Unmarshal(plain, &resp); err != nil {
		return nil, unavailable(err)
	}
	if err := decodeError(&resp); err != nil {
		return nil, err
	}
	if (req.Op == opGet || req.Op == opState || req.Op == opPoll) && resp.Session == nil {
		return nil, unavailable(errors.New("peer answered without a session"))
	}
	return &resp, nil
}

// PeerHandler serves the peer API. Mount it on its own listener (the
// --peer-listen-address), never on the public one: only replicas holding
// the shared key can use it, but it has no business being reachable from
// outside the cluster.
func (s *Store) PeerHandler() http.Handler {
	return http.HandlerFunc(s.servePeer)
}

func (s *Store) servePeer(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != PeerPath {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxPeerMessage()))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, "peer message too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "could not read the request", http.StatusBadRequest)
		return
	}
	nonce, plain, err := s.sealer.open(body, aadRequest)
	if err != nil {
		http.Error(w, "unauthenticated", http.StatusUnauthorized)
		return
	}
	var req peerRequest
	if err := json.Unmarshal(plain, &req); err != nil {
		http.Error(w, "malformed peer request", http.StatusBadRequest)
		return
	}
	if err := s.replays.accept(nonce, time.Unix(0, req.Sent), time.Now()); err != nil {
		http.Error(w, "stale or replayed request", http.StatusUnauthorized)
		return
	}
	resp, err := s.serveOp(r.Context(), &req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Write(s.sealer.seal(mustJSON(resp), responseAAD(nonce)))
}

var errBadOp = errors.New("malformed peer request")

// serveOp runs one operation. Session operations go where the session's
// token is (route): answered here if held, taken if this replica's ring
// names it owner, else forwarded (at most maxHops times, so requests
// never bounce between replicas whose rings briefly disagree).
func (s *Store) serveOp(ctx context.Context, req *peerRequest) (*peerResponse, error) {
	s.noteSender(req.From, req.Inc, req.Member)
	var (
		resp *peerResponse
		err  error
	)
	switch req.Op {
	case opCreate:
		if req.Session == nil {
			return nil, errBadOp
		}
		resp, err = s.route(ctx, req)
	case opGet, opState, opUseNonce, opPoll, opComplete, opDeny, opDelete:
		resp, err = s.route(ctx, req)
	case opStatic:
		// Straight from the local store (owned or a copy), not through
		// the group: a replica whose ring briefly disagrees must not pass
		// the request on.
		resp = &peerResponse{}
		if sess, ok := s.local.Peek(req.ID); ok {
			resp.Static = mustJSON(staticOf(sess))
		} else {
			err = sessions.ErrNotFound
		}
	case opJoin, opLeave: // noteSender did it
		resp = &peerResponse{}
	case opTransfer:
		resp = s.serveTransfer(req.ID)
	case opReplicate:
		resp = s.serveRecords(req, false)
	case opHandover:
		resp = s.serveRecords(req, true)
	case opDropCopy:
		s.local.Remove(req.ID)
		resp = &peerResponse{}
	default:
		return nil, errBadOp
	}
	if resp == nil {
		resp = &peerResponse{}
	}
	resp.Member, resp.Inc = s.isMember(), s.inc
	if err != nil {
		resp.Err = errorCode(err)
		var soon *sessions.TooSoonError
		if errors.As(err, &soon) {
			resp.RetryAfter = int64(soon.RetryAfter)
		}
		if resp.Err == "internal" {
			s.log.Error("session store failed", "op", req.Op, "error", err)
		}
	}
	return resp, nil
}
