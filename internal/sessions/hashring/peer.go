package hashring

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
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

// maxPeerMessage bounds a sealed peer request (a batch): one request of
// the largest size (a response, base64 in JSON, and the rest of a
// session), or a batch of smaller ones that add up to no more. An answer
// may be as large for each request of its batch.
func (s *Store) maxPeerMessage() int64 {
	return int64(s.limits.MaxResponseBytes)*4/3 + 64<<10
}

// call sends req to peer and returns its answer, or the sessions error the
// owner answered, or an *OwnerUnavailableError. Requests to one peer are
// group-committed (pipe.go): sent at once when the pipe to the peer is
// idle, else together with the others that queued meanwhile, in one
// sealed message.
func (s *Store) call(ctx context.Context, peer string, req *peerRequest) (*peerResponse, error) {
	pc := &pendingCall{body: encodeRequestJSON(req), leaf: leafOp(req.Op), done: make(chan struct{})}
	// On a stream, leaf requests need no pipe of their own (stream.go).
	s.pipes.send(peer, pc.leaf && !s.senders.up(peer), pc)
	select {
	case <-pc.done:
	case <-ctx.Done():
		// The request may still reach the owner; its answer is dropped.
		return nil, s.unavailable(peer, req.Op, ctx.Err())
	}
	if pc.err != nil {
		return nil, s.unavailable(peer, req.Op, pc.err)
	}
	return s.checkAnswer(peer, req, pc.resp)
}

// callAlone sends req in a message of its own under ctx, not batched with
// others: for a request the owner may hold for long, which must not hold
// up the requests batched with it. client carries it (nil: the peer client,
// whose timeout is the peer timeout).
func (s *Store) callAlone(ctx context.Context, client *http.Client, peer string, req *peerRequest) (*peerResponse, error) {
	if client == nil {
		client = s.client
	}
	resps, err := s.roundTrip(ctx, client, peer, [][]byte{encodeRequestJSON(req)})
	if err != nil {
		return nil, s.unavailable(peer, req.Op, err)
	}
	return s.checkAnswer(peer, req, resps[0])
}

func (s *Store) unavailable(peer, op string, err error) error {
	s.log.Warn("session owner did not answer", "peer", peer, "op", op, "error", err)
	return &OwnerUnavailableError{Owner: peer, Op: op, Err: err}
}

// checkAnswer turns the owner's answer to req into the caller's result.
func (s *Store) checkAnswer(peer string, req *peerRequest, resp *peerResponse) (*peerResponse, error) {
	if err := decodeError(resp); err != nil {
		return nil, err
	}
	if (req.Op == opGet || req.Op == opState || req.Op == opPoll) && resp.Session == nil {
		return nil, s.unavailable(peer, req.Op, errors.New("peer answered without a session"))
	}
	return resp, nil
}

// roundTrip sends the encoded requests to peer in one sealed batch and
// returns the answers, in order.
func (s *Store) roundTrip(ctx context.Context, client *http.Client, peer string, reqs [][]byte) ([]*peerResponse, error) {
	s.pipes.messages.Add(1)
	s.pipes.requests.Add(uint64(len(reqs)))
	msg := s.sealer.seal(encodeBatch(time.Now().UnixNano(), s.sender(), reqs), aadRequest)
	reqNonce := msg[:gcmNonceSize]
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, peer+PeerPath, bytes.NewReader(msg))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/octet-stream")
	res, err := client.Do(hr)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := readMessage(res.Body, res.ContentLength, int64(len(reqs))*s.maxPeerMessage())
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, errors.New("peer answered " + res.Status)
	}
	_, plain, err := s.sealer.open(body, responseAAD(reqNonce))
	if err != nil {
		return nil, err
	}
	return decodeBatchResponse(plain, len(reqs))
}

// PeerHandler serves the peer API. Mount it on its own listener (the
// --peer-listen-address), never on the public one: only replicas holding
// the shared key can use it, but it has no business being reachable from
// outside the cluster. The streams it upgrades leave the http.Server
// (hijacked): they end with PeerServer.Shutdown or Close, or Store.Close,
// not with the http.Server's Close.
func (s *Store) PeerHandler() http.Handler {
	return http.HandlerFunc(s.servePeer)
}

func (s *Store) servePeer(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == PeerStreamPath {
		s.serveStream(w, r)
		return
	}
	if r.URL.Path != PeerPath {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, err := readMessage(r.Body, r.ContentLength, s.maxPeerMessage())
	if err != nil {
		if errors.Is(err, errTooLarge) {
			http.Error(w, "peer message too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "could not read the request", http.StatusBadRequest)
		return
	}
	// One seal and one replay check for the whole batch.
	nonce, plain, err := s.sealer.open(body, aadRequest)
	if err != nil {
		http.Error(w, "unauthenticated", http.StatusUnauthorized)
		return
	}
	batch, err := decodeBatch(plain)
	if err != nil {
		http.Error(w, "malformed peer request", http.StatusBadRequest)
		return
	}
	if err := s.replays.accept(nonce, time.Unix(0, batch.Sent), time.Now()); err != nil {
		http.Error(w, "stale or replayed request", http.StatusUnauthorized)
		return
	}
	resps := s.serveBatch(r.Context(), batch.Reqs)
	answer := peerBatchResponse{Sender: s.sender(), Resps: resps}
	sealed := s.sealer.seal(mustJSON(answer), responseAAD(nonce))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(sealed)))
	w.Write(sealed)
}

var errTooLarge = errors.New("peer message too large")

// readMessage reads a peer message of at most limit bytes, to its end (so
// the connection is reused): into one buffer of its announced length when
// it has one, as io.ReadAll grows its buffer step by step (a fifth of the
// bytes a forwarded poll allocated).
func readMessage(r io.Reader, length, limit int64) ([]byte, error) {
	if length > limit {
		return nil, errTooLarge
	}
	if length >= 0 {
		buf := make([]byte, length)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return buf, nil
	}
	buf, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err == nil && int64(len(buf)) > limit {
		err = errTooLarge
	}
	return buf, err
}

// serveBatch answers the requests of a batch, in order. They come from
// independent callers, so a request that may wait for another replica
// runs on a goroutine of its own, so as not to hold up the rest; the
// others (answered from this replica's store alone) are served here, one
// after the other, which spares each a switch to another goroutine: with
// many requests to a batch, that was most of what scheduling cost the
// receiver.
func (s *Store) serveBatch(ctx context.Context, reqs []*peerRequest) []*peerResponse {
	later := make([]*peerResponse, len(reqs))
	var wg sync.WaitGroup
	resps := s.serveAtOnce(ctx, reqs, func(i int) {
		wg.Add(1)
		s.workers.Go(func() {
			defer wg.Done()
			later[i] = s.serveOne(ctx, reqs[i])
		})
	})
	wg.Wait()
	for i, resp := range later {
		if resp != nil {
			resps[i] = resp
		}
	}
	return resps
}

// serveAtOnce hands each request of a batch that may wait for another
// replica to elsewhere (which serves it on a worker), then serves the
// others here, in order. Their answers are in the slice it returns; the
// others' places in it are nil.
func (s *Store) serveAtOnce(ctx context.Context, reqs []*peerRequest, elsewhere func(i int)) []*peerResponse {
	resps := make([]*peerResponse, len(reqs))
	here := make([]bool, len(reqs))
	for i, req := range reqs {
		if here[i] = s.answersAtOnce(req); !here[i] {
			elsewhere(i)
		}
	}
	for i, req := range reqs {
		if here[i] {
			resps[i] = s.serveOne(ctx, req)
		}
	}
	return resps
}

// serveOne answers one request of a batch.
func (s *Store) serveOne(ctx context.Context, req *peerRequest) *peerResponse {
	resp, err := s.serveOp(ctx, req)
	if err != nil {
		// A request this replica cannot make sense of (malformed, or an op
		// of a newer version): that request fails, not its batch.
		return &peerResponse{Err: codeMalformed}
	}
	return resp
}

// answersAtOnce says whether req will be answered without waiting for
// another replica, as far as can be told before serving it: a leaf
// operation, or one on a session owned here whose change, if it makes
// one, goes back in the answer (replicateFor) or nowhere. Should the
// session move meanwhile, the request is still answered correctly, only
// after the wait.
func (s *Store) answersAtOnce(req *peerRequest) bool {
	switch req.Op {
	case opWait:
		return false
	case opGet, opState, opStatic, opPoll, opUseNonce, opComplete, opDeny:
		if owned, _ := s.local.Holds(req.ID); !owned {
			return false
		}
		switch req.Op {
		case opGet, opState, opStatic:
			return true
		}
		t := s.target(req.ID)
		return t == "" || t == req.From
	}
	return leafOp(req.Op)
}

var errBadOp = errors.New("malformed peer request")

// serveOp runs one operation. Session operations go where the session's
// token is (route): answered here if held, taken if this replica's ring
// names it owner, else forwarded (at most maxHops times, so requests
// never bounce between replicas whose rings briefly disagree).
func (s *Store) serveOp(ctx context.Context, req *peerRequest) (*peerResponse, error) {
	s.noteSender(req.From, req.Inc, req.Member, req.Left)
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
	case opGet, opState, opUseNonce, opPoll, opComplete, opDeny, opDelete, opStatic:
		resp, err = s.route(ctx, req)
	case opJoin, opLeave: // noteSender did it
		resp = &peerResponse{}
	case opTransfer:
		resp = s.serveTransfer(req.ID)
	case opExport:
		resp = s.serveExport(req.ID)
	case opReplicate:
		resp = s.serveRecords(req, false)
	case opHandover:
		resp = s.serveRecords(req, true)
	case opDropCopy:
		s.local.Remove(req.ID)
		resp = &peerResponse{}
	case opWait:
		resp = s.serveWait(ctx, req)
	default:
		return nil, errBadOp
	}
	if resp == nil {
		resp = &peerResponse{}
	}
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
