package hashring

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// receivers are the streams this replica serves (stream.go).
type receivers struct {
	mu      sync.Mutex
	n       int // streams being upgraded or served
	streams map[*receiverStream]struct{}
	closed  bool
	wg      sync.WaitGroup // the streams being served
}

func newReceivers() *receivers {
	return &receivers{streams: map[*receiverStream]struct{}{}}
}

// receiverStream is one stream this replica serves.
type receiverStream struct {
	s    *Store
	conn net.Conn
	br   *bufio.Reader
	id   []byte

	wmu  sync.Mutex // orders the frames written, with their sequence numbers
	wseq uint64
	waad []byte

	slots chan struct{} // of requests served on workers (maxStreamWorkers)
	work  sync.WaitGroup
}

// serveStream upgrades a connection to a stream and serves it until it
// ends. The handler keeps the connection's goroutine: net/http forgets a
// connection once it is hijacked, so the receivers wait for it (Shutdown,
// Close).
func (s *Store) serveStream(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if !headerHasToken(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), streamProtocol) {
		w.Header().Set("Upgrade", streamProtocol)
		w.Header().Set("Connection", "Upgrade")
		http.Error(w, "this path serves "+streamProtocol+" only", http.StatusUpgradeRequired)
		return
	}
	nonce, err := base64.RawURLEncoding.DecodeString(r.Header.Get(headerStreamNonce))
	if err != nil || len(nonce) != streamNonceBytes {
		http.Error(w, "malformed "+headerStreamNonce, http.StatusBadRequest)
		return
	}
	rs := s.receivers
	rs.mu.Lock()
	if rs.closed || rs.n >= maxReceiverStreams {
		rs.mu.Unlock()
		w.Header().Set("Retry-After", "5")
		http.Error(w, "no stream now: send HTTP messages", http.StatusServiceUnavailable)
		return
	}
	rs.n++
	rs.wg.Add(1)
	rs.mu.Unlock()
	st := &receiverStream{s: s, slots: make(chan struct{}, maxStreamWorkers)}
	defer func() {
		rs.mu.Lock()
		rs.n--
		delete(rs.streams, st)
		rs.mu.Unlock()
		rs.wg.Done()
	}()

	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "no stream on this server", http.StatusNotImplemented)
		return
	}
	var challenge [streamNonceBytes]byte
	rand.Read(challenge[:])
	conn, brw, err := hj.Hijack()
	if err != nil {
		return
	}
	// The server's read and write deadlines stay on a hijacked connection.
	conn.SetDeadline(time.Now().Add(streamAuthTimeout))
	st.conn, st.br = conn, brw.Reader
	st.id = append(nonce, challenge[:]...)
	// Held until the upgrade's answer is written: a goaway (shutdown) that
	// finds the stream registered must not go before it.
	st.wmu.Lock()
	rs.mu.Lock()
	closed := rs.closed // shut down since the check
	if !closed {
		rs.streams[st] = struct{}{}
	}
	rs.mu.Unlock()
	if closed {
		st.wmu.Unlock()
		conn.Close()
		return
	}
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + streamProtocol + "\r\n" +
		headerStreamChallenge + ": " + base64.RawURLEncoding.EncodeToString(challenge[:]) + "\r\n\r\n")
	err = brw.Flush()
	conn.SetWriteDeadline(time.Time{})
	st.wmu.Unlock()
	if err != nil {
		conn.Close()
		return
	}
	st.serve()
}

// headerHasToken says whether a comma-separated header lists token
// (between optional spaces and tabs, RFC 9110's OWS).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for part := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.Trim(part, " \t"), token) {
				return true
			}
		}
	}
	return false
}

// serve reads batches until the sender closes the stream, a frame fails
// (the stream closes: a sender without the key learns nothing), or the
// stream is idle for streamReceiverIdle; then it waits for the requests
// still served on workers, whose answers are dropped if the stream is
// gone.
func (st *receiverStream) serve() {
	defer func() {
		st.work.Wait()
		st.conn.Close()
	}()
	var (
		aad []byte
		seq uint64
	)
	limit := st.s.maxPeerMessage()
	for {
		frame, err := readFrame(st.br, limit)
		if err != nil {
			return
		}
		aad = streamAAD(aad, st.id, dirToReceiver, seq)
		_, plain, err := st.s.sealer.open(frame, aad)
		if err != nil || len(plain) == 0 || plain[0] != frameBatch {
			return
		}
		batch, err := decodeBatch(plain[1:])
		if err != nil {
			return // a replica holding the key sent nonsense: not to be answered
		}
		st.conn.SetReadDeadline(time.Now().Add(streamReceiverIdle))
		st.serveBatch(seq, batch.Reqs)
		seq++
	}
}

// serveBatch answers the requests of batch seq: those that wait for
// nobody here, in one ack, and each of the others from a worker, when it
// is done (serveBatch in peer.go explains the split).
func (st *receiverStream) serveBatch(seq uint64, reqs []*peerRequest) {
	s := st.s
	ctx := context.Background() // each request is bounded by the peer timeouts of the calls it makes
	resps := s.serveAtOnce(ctx, reqs, func(i int) {
		st.slots <- struct{}{} // at most maxStreamWorkers: this reader waits for a slot
		st.work.Add(1)
		s.workers.Go(func() {
			defer st.work.Done()
			resp := s.serveOne(ctx, reqs[i])
			<-st.slots
			st.write(answerFrame(frameLater, seq, i, st.answer([]*peerResponse{resp})))
		})
	})
	st.write(answerFrame(frameAck, seq, 0, st.answer(resps)))
}

func (st *receiverStream) answer(resps []*peerResponse) *peerBatchResponse {
	return &peerBatchResponse{Sender: st.s.sender(), Resps: resps}
}

// write seals and writes one frame to the sender. A sender that does not
// read for the peer timeout is gone: the stream closes.
func (st *receiverStream) write(plain []byte) {
	st.wmu.Lock()
	defer st.wmu.Unlock()
	st.waad = streamAAD(st.waad, st.id, dirToSender, st.wseq)
	st.wseq++
	st.conn.SetWriteDeadline(time.Now().Add(st.s.peerTimeout))
	if _, err := st.conn.Write(st.s.sealer.sealFrame(plain, st.waad)); err != nil {
		st.conn.Close()
	}
}

// shutdown asks every sender to send nothing more (goaway) and waits,
// until ctx ends, for the senders to close their streams once their
// requests are answered; then it closes what is left. No stream is served
// after it.
func (rs *receivers) shutdown(ctx context.Context) error {
	rs.mu.Lock()
	rs.closed = true
	all := make([]*receiverStream, 0, len(rs.streams))
	for st := range rs.streams {
		all = append(all, st)
	}
	rs.mu.Unlock()
	for _, st := range all {
		st.write([]byte{frameGoaway})
	}
	done := make(chan struct{})
	go func() {
		rs.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		rs.close()
		<-done
		return ctx.Err()
	}
}

// close closes every stream at once and waits for them to end.
func (rs *receivers) close() {
	rs.mu.Lock()
	rs.closed = true
	for st := range rs.streams {
		st.conn.Close()
	}
	rs.mu.Unlock()
	rs.wg.Wait()
}
