package hashring

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// senders are the streams this replica sends its batches on, at most one
// per peer (stream.go).
type senders struct {
	sealer  *sealer
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	timeout time.Duration // the peer timeout: of a dial, an upgrade, an answer
	limit   int64         // of a frame to this replica
	log     *slog.Logger

	ctx    context.Context // ends at close: stops the dials
	cancel context.CancelFunc

	peers sync.Map // peer URL → *senderPeer; one per peer URL ever called, and those are few

	mu     sync.Mutex // of closed and of each senderPeer's dial state
	closed bool

	// frames counts the batches sent on streams (also counted in pipes'
	// messages).
	frames atomic.Uint64
	wg     sync.WaitGroup // the dials and the readers
}

// senderPeer is what a replica knows of its streams to one peer.
type senderPeer struct {
	cur atomic.Pointer[senderStream] // nil: none to send on

	// Under senders.mu.
	dialing bool
	retryAt time.Time // after a refused upgrade or a failed dial
}

func newSenders(sealer *sealer, dial func(ctx context.Context, network, addr string) (net.Conn, error), timeout time.Duration, limit int64, log *slog.Logger) *senders {
	ctx, cancel := context.WithCancel(context.Background())
	return &senders{sealer: sealer, dial: dial, timeout: timeout, limit: limit, log: log, ctx: ctx, cancel: cancel}
}

func (ss *senders) peer(peer string) *senderPeer {
	if p, ok := ss.peers.Load(peer); ok {
		return p.(*senderPeer)
	}
	p, _ := ss.peers.LoadOrStore(peer, &senderPeer{})
	return p.(*senderPeer)
}

// up says whether batches to peer go on a stream now.
func (ss *senders) up(peer string) bool {
	return ss != nil && ss.peer(peer).cur.Load() != nil
}

// get returns the stream to send on to peer, or nil: then the batch goes
// as an HTTP message, and a stream is dialed in the background unless one
// is being dialed or the peer refused one less than streamRetry ago.
func (ss *senders) get(peer string) *senderStream {
	if ss == nil {
		return nil
	}
	p := ss.peer(peer)
	if st := p.cur.Load(); st != nil {
		return st
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed || p.dialing || time.Now().Before(p.retryAt) {
		return nil
	}
	p.dialing = true
	ss.wg.Go(func() {
		st, err := ss.open(peer, p)
		ss.mu.Lock()
		defer ss.mu.Unlock()
		p.dialing = false
		if err != nil {
			p.retryAt = time.Now().Add(streamRetry)
			ss.log.Debug("no peer stream: sending HTTP messages", "peer", peer, "error", err)
			return
		}
		if ss.closed {
			st.close(errStreamClosed)
			return
		}
		p.cur.Store(st)
		ss.wg.Go(st.readLoop)
	})
	return nil
}

// close closes every stream (their unanswered requests fail) and waits
// for the dials and readers.
func (ss *senders) close() {
	if ss == nil {
		return
	}
	ss.mu.Lock()
	ss.closed = true
	ss.mu.Unlock()
	ss.cancel()
	// A dial that ends from now on closes its stream (closed).
	ss.peers.Range(func(_, p any) bool {
		if st := p.(*senderPeer).cur.Load(); st != nil {
			st.close(errStreamClosed)
		}
		return true
	})
	ss.wg.Wait()
}

// handshakeLimit bounds what the upgrade's answer may make the sender
// read, until it is lifted for the frames.
type handshakeLimit struct {
	r    io.Reader
	left int64
	off  bool
}

func (h *handshakeLimit) Read(p []byte) (int, error) {
	if h.off {
		return h.r.Read(p)
	}
	if h.left <= 0 {
		return 0, errors.New("peer stream: the upgrade's answer is too long")
	}
	if int64(len(p)) > h.left {
		p = p[:h.left]
	}
	n, err := h.r.Read(p)
	h.left -= int64(n)
	return n, err
}

// open dials peer and upgrades the connection to a stream.
func (ss *senders) open(peer string, p *senderPeer) (*senderStream, error) {
	u, err := url.Parse(peer)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, errNoStream // the peer API is plain HTTP; anything else is not ours to dial
	}
	ctx, cancel := context.WithTimeout(ss.ctx, ss.timeout)
	defer cancel()
	conn, err := ss.dial(ctx, "tcp", u.Host)
	if err != nil {
		return nil, err
	}
	st, err := ss.upgrade(conn, u.Host, p)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return st, nil
}

func (ss *senders) upgrade(conn net.Conn, host string, p *senderPeer) (*senderStream, error) {
	conn.SetDeadline(time.Now().Add(ss.timeout))
	var nonce [streamNonceBytes]byte
	rand.Read(nonce[:])
	req := "POST " + PeerStreamPath + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: Upgrade\r\nUpgrade: " + streamProtocol +
		"\r\n" + headerStreamNonce + ": " + base64.RawURLEncoding.EncodeToString(nonce[:]) + "\r\nContent-Length: 0\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return nil, err
	}
	limited := &handshakeLimit{r: conn, left: 16 << 10}
	br := bufio.NewReaderSize(limited, 64<<10)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, err
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSwitchingProtocols || !strings.EqualFold(res.Header.Get("Upgrade"), streamProtocol) {
		return nil, fmt.Errorf("%w: answered %s", errNoStream, res.Status)
	}
	challenge, err := base64.RawURLEncoding.DecodeString(res.Header.Get(headerStreamChallenge))
	if err != nil || len(challenge) != streamNonceBytes {
		return nil, fmt.Errorf("%w: a malformed challenge", errNoStream)
	}
	limited.off = true
	conn.SetWriteDeadline(time.Time{})
	// Idle until the first batch: closed by this side before the
	// receiver's idle timeout, as after any batch (armLocked).
	conn.SetReadDeadline(time.Now().Add(streamSenderIdle))
	return &senderStream{
		ss: ss, peer: p, conn: conn, br: br,
		id:      append(nonce[:], challenge...),
		batches: map[uint64]*streamBatch{},
		used:    time.Now(),
	}, nil
}

// senderStream is one stream to a peer.
type senderStream struct {
	ss   *senders
	peer *senderPeer
	conn net.Conn
	br   *bufio.Reader // the reader's
	id   []byte        // the connection's name: the sender's nonce, the receiver's challenge

	wmu  sync.Mutex // orders the frames written, with their sequence numbers
	wseq uint64
	waad []byte

	mu      sync.Mutex
	batches map[uint64]*streamBatch // sent, with requests not answered yet
	closing bool                    // goaway or idle: nothing more is sent
	err     error                   // once closed
	used    time.Time               // when the last batch was sent
}

// streamBatch is a batch sent on a stream whose answers are awaited.
type streamBatch struct {
	calls []*pendingCall // a call answered is set to nil
	left  int
	sent  time.Time
	acked chan struct{} // closed at the ack (or when the stream closes)
	ack   bool
}

// send writes batch and waits for its ack, which answers the requests
// the receiver served at once; the others are answered as they are done.
// It reports false if it wrote nothing: the stream was closing or closed,
// and the batch is the caller's to send otherwise.
func (st *senderStream) send(s *Store, batch []*pendingCall) bool {
	plain := appendBatch([]byte{frameBatch}, time.Now().UnixNano(), s.sender(), bodiesOf(batch))
	sb := &streamBatch{calls: batch, left: len(batch), acked: make(chan struct{})}

	st.wmu.Lock()
	st.mu.Lock()
	if st.closing || st.err != nil {
		st.mu.Unlock()
		st.wmu.Unlock()
		return false
	}
	seq := st.wseq
	st.wseq++
	sb.sent = time.Now()
	st.used = sb.sent
	// Registered before it is written: its answer may come before Write
	// returns.
	st.batches[seq] = sb
	if len(st.batches) == 1 { // from idle: the reader now waits for an answer
		st.conn.SetReadDeadline(sb.sent.Add(st.ss.timeout))
	}
	st.mu.Unlock()
	st.waad = streamAAD(st.waad, st.id, dirToReceiver, seq)
	frame := st.ss.sealer.sealFrame(plain, st.waad)
	st.conn.SetWriteDeadline(time.Now().Add(st.ss.timeout))
	_, err := st.conn.Write(frame)
	st.wmu.Unlock()
	if err != nil {
		st.close(err)
	} else {
		st.ss.frames.Add(1)
	}
	s.pipes.messages.Add(1)
	s.pipes.requests.Add(uint64(len(batch)))
	<-sb.acked
	return true
}

// readLoop reads the answers until the stream closes. While requests
// await answers it waits at most the peer timeout for a frame, and fails
// the requests that waited longer (the receiver may be gone); while none
// does, it closes the stream after streamSenderIdle.
func (st *senderStream) readLoop() {
	var (
		aad       []byte
		seq       uint64
		lastSweep = time.Now()
	)
	for {
		frame, err := readFrame(st.br, maxBatch*st.ss.limit)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && st.expire() {
				continue
			}
			st.close(err)
			return
		}
		aad = streamAAD(aad, st.id, dirToSender, seq)
		seq++
		_, plain, err := st.ss.sealer.open(frame, aad)
		if err == nil {
			err = st.deliver(plain)
		}
		if err != nil {
			st.ss.log.Warn("peer stream closed: a frame failed", "error", err)
			st.close(err)
			return
		}
		if now := time.Now(); now.Sub(lastSweep) > st.ss.timeout/2 {
			lastSweep = now
			if !st.sweep(now) {
				st.close(os.ErrDeadlineExceeded)
				return
			}
		}
		if st.idleDone() {
			return
		}
	}
}

// deliver hands the answers of a frame to their callers.
func (st *senderStream) deliver(plain []byte) error {
	p, err := parseAnswerFrame(plain)
	if err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if p.kind == frameGoaway {
		st.closing = true
		st.peer.cur.CompareAndSwap(st, nil)
		return nil
	}
	sb := st.batches[p.seq]
	if sb == nil {
		return nil // its requests failed already (timed out)
	}
	switch p.kind {
	case frameAck:
		if len(p.resps) != len(sb.calls) || sb.ack {
			return errFrame
		}
		for i, r := range p.resps {
			if r != nil {
				sb.answer(i, r, nil)
			}
		}
		sb.ack = true
		close(sb.acked)
	case frameLater:
		if p.index >= len(sb.calls) {
			return errFrame
		}
		sb.answer(p.index, p.resps[0], nil)
	}
	if sb.left == 0 && sb.ack {
		delete(st.batches, p.seq)
	}
	st.armLocked(time.Now())
	return nil
}

// answer sets the answer or the error of request i, unless it has one.
func (sb *streamBatch) answer(i int, resp *peerResponse, err error) {
	pc := sb.calls[i]
	if pc == nil {
		return
	}
	sb.calls[i] = nil
	sb.left--
	pc.resp, pc.err = resp, err
	close(pc.done)
}

// fail fails every request of sb not answered yet, and releases its
// sender.
func (sb *streamBatch) fail(err error) {
	for i := range sb.calls {
		sb.answer(i, nil, err)
	}
	if !sb.ack {
		sb.ack = true
		close(sb.acked)
	}
}

// armLocked sets the reader's deadline: the peer timeout while requests
// await answers, else the idle timeout.
func (st *senderStream) armLocked(now time.Time) {
	if len(st.batches) > 0 {
		st.conn.SetReadDeadline(now.Add(st.ss.timeout))
	} else {
		st.conn.SetReadDeadline(st.used.Add(streamSenderIdle))
	}
}

// expire handles a read that timed out: requests waiting longer than the
// peer timeout fail, and the stream closes if a batch was not acked in
// time (the receiver reads no more) or it was idle. It reports whether
// the stream goes on.
func (st *senderStream) expire() bool {
	now := time.Now()
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.batches) == 0 || !st.sweepLocked(now) {
		return false // idle, or the receiver reads no more
	}
	st.armLocked(now)
	return true
}

// sweep fails the requests that waited longer than the peer timeout:
// served on a worker of the receiver, they may wait for a replica that is
// gone; their callers get what an HTTP message's timeout gave them. It
// reports false if a batch waited that long for its ack: the receiver
// acks in order, as it reads, so it reads no more, and the stream must
// close.
func (st *senderStream) sweep(now time.Time) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.sweepLocked(now)
}

func (st *senderStream) sweepLocked(now time.Time) bool {
	for seq, sb := range st.batches {
		if now.Sub(sb.sent) < st.ss.timeout {
			continue
		}
		if !sb.ack {
			return false
		}
		sb.fail(os.ErrDeadlineExceeded)
		delete(st.batches, seq)
	}
	return true
}

// idleDone closes the stream once it is closing (goaway) and every
// request is answered; it reports whether it did.
func (st *senderStream) idleDone() bool {
	st.mu.Lock()
	done := st.closing && len(st.batches) == 0
	st.mu.Unlock()
	if done {
		st.close(errStreamClosed)
	}
	return done
}

// close closes the stream: its requests not answered yet fail with err.
func (st *senderStream) close(err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.err != nil {
		return
	}
	st.err = err
	st.closing = true
	st.peer.cur.CompareAndSwap(st, nil)
	for seq, sb := range st.batches {
		sb.fail(err)
		delete(st.batches, seq)
	}
	st.conn.Close()
}
