package hashring

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

// waitStream waits until r sends to peer on a stream (the first batch to a
// peer goes as an HTTP message and dials the stream in the background).
func waitStream(t *testing.T, r *replica, peer *replica, id string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !r.senders.up(peer.url) {
		if time.Now().After(deadline) {
			t.Fatalf("no stream from %s to %s", r.url, peer.url)
		}
		if _, err := r.Get(ctx, id); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// httpMessages is how many batches r sent as HTTP messages.
func httpMessages(r *replica) uint64 {
	m, _ := r.PeerMessages()
	return m - r.senders.frames.Load()
}

// TestStreamsCarryBatches: once a stream to the owner is up, a
// non-owner's operations (polls, nonces, completion, and the copies that
// come back to it as backup) all go on it, none as an HTTP message, with
// the answers HTTP gave.
func TestStreamsCarryBatches(t *testing.T) {
	rs := startRing(t, 2, sessions.DefaultLimits, time.Now)
	a, b := rs[0], rs[1]
	id := ownedBy(t, rs, b, "streamed")
	if err := a.Create(ctx, testSession(id, time.Now())); err != nil {
		t.Fatal(err)
	}
	waitStream(t, a, b, id)
	frames, msgs := a.senders.frames.Load(), httpMessages(a)
	for i := range 20 {
		got, err := a.RecordPoll(ctx, id, fmt.Sprint("p", i), 0)
		if err != nil || got.State != sessions.StatePending {
			t.Fatalf("poll %d: %v %v", i, got.State, err)
		}
	}
	if _, err := a.RecordPoll(ctx, id, "p3", 0); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("a nonce used again on a stream: %v, want ErrNonceUsed", err)
	}
	if err := a.Complete(ctx, id, []byte(`{"done":true}`)); err != nil {
		t.Fatal(err)
	}
	got, err := a.RecordPoll(ctx, id, "last", 0)
	if err != nil || got.State != sessions.StateCompleted || string(got.Response) != `{"done":true}` {
		t.Fatalf("the completed session on a stream: %+v %v", got, err)
	}
	if _, owned, ok := a.Local().Export(id); !ok || owned {
		t.Fatal("the non-owner, which is the backup, holds no copy")
	}
	if n := httpMessages(a) - msgs; n != 0 {
		t.Fatalf("%d batches went as HTTP messages with a stream up", n)
	}
	if n := a.senders.frames.Load() - frames; n < 23 {
		t.Fatalf("23 operations took %d frames", n)
	}
}

// refuseStreams serves the peer API as a replica of before streams did:
// the stream path is not found.
func refuseStreams(upgrades *atomic.Int64) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == PeerStreamPath {
				upgrades.Add(1)
				http.NotFound(w, r)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
}

// TestStreamRefusedFallsBackToHTTP: a peer of before streams answers the
// upgrade 404. Every operation still works, as HTTP messages, and the
// upgrade is not asked again before streamRetry: one try for many
// batches.
func TestStreamRefusedFallsBackToHTTP(t *testing.T) {
	var upgrades atomic.Int64
	start := time.Now()
	a := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	b := startReplicaServing(t, sessions.DefaultLimits, time.Now, Options{}, refuseStreams(&upgrades))
	rs := []*replica{a, b}
	joinRing(t, rs)
	var ids []string
	for i := range 30 {
		id := ownedBy(t, rs, b, fmt.Sprint("old-peer-", i))
		if err := a.Create(ctx, testSession(id, time.Now())); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			if _, err := a.RecordPoll(ctx, id, fmt.Sprint("n", i), 0); err != nil {
				t.Error(err)
			}
			if _, err := a.RecordPoll(ctx, id, fmt.Sprint("n", i), 0); !errors.Is(err, sessions.ErrNonceUsed) {
				t.Errorf("a nonce used again: %v", err)
			}
		})
	}
	wg.Wait()
	if a.senders.up(b.url) || a.senders.frames.Load() != 0 {
		t.Fatal("a stream to a peer that refuses them")
	}
	// One try, and one more each streamRetry (a slow machine may take
	// longer than one).
	if n, most := upgrades.Load(), 1+int64(time.Since(start)/streamRetry); n < 1 || n > most {
		t.Fatalf("%d upgrades asked in %v, want 1 to %d", n, time.Since(start), most)
	}
}

// hangFor makes the dials and HTTP messages of a replica to peer hang
// until they time out, as to a replica that stopped answering, once on.
type hangFor struct {
	peer string
	on   atomic.Bool
}

func (h *hangFor) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if h.on.Load() && "http://"+addr == h.peer {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

func (h *hangFor) RoundTrip(r *http.Request) (*http.Response, error) {
	if h.on.Load() && h.peer == "http://"+r.URL.Host {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestStreamSlowRequestHoldsUpNoOther: b owns sessions whose backup, c,
// hangs; a completion a sends b waits on b for the copy to c. The
// requests a sends b meanwhile, on the same stream, are answered at once:
// b acks a batch without waiting for what it serves on workers.
func TestStreamSlowRequestHoldsUpNoOther(t *testing.T) {
	a := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	c := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	hang := &hangFor{peer: c.url}
	b := startReplica(t, sessions.DefaultLimits, time.Now, Options{Dial: hang.dial, Transport: hang})
	rs := []*replica{a, b, c}
	joinRing(t, rs)
	var slow, fast string
	for i := 0; slow == "" || fast == ""; i++ {
		id := fmt.Sprint("hol-", i)
		switch {
		case a.Owner(id) != b.url:
		case a.view().backup(id) == c.url && slow == "":
			slow = id
		case a.view().backup(id) == a.url && fast == "":
			fast = id
		}
	}
	for _, id := range []string{slow, fast} {
		if err := a.Create(ctx, testSession(id, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	waitStream(t, a, b, fast)
	// From now on b's calls to c hang (for the peer timeout, 3s).
	hang.on.Store(true)
	if st := b.senders.peer(c.url).cur.Load(); st != nil {
		st.close(errStreamClosed)
	}

	done := make(chan error, 1)
	go func() { done <- a.Complete(ctx, slow, []byte(`{}`)) }()
	time.Sleep(50 * time.Millisecond) // the completion is at b, waiting for c
	start := time.Now()
	for i := range 10 {
		if _, err := a.RecordPoll(ctx, fast, fmt.Sprint("f", i), 0); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("ten polls behind a request waiting for a hung replica took %v", d)
	}
	select {
	case err := <-done:
		t.Fatalf("the completion returned (%v) before the copy to the hung backup timed out", err)
	default:
	}
	if err := <-done; err != nil {
		t.Fatalf("the completion: %v (the owner answers once the copy failed)", err)
	}
	if got, err := a.Get(ctx, slow); err != nil || got.State != sessions.StateCompleted {
		t.Fatalf("the slow session: %v %v", got.State, err)
	}
}

// TestStreamShutdownAnswersFirst: a peer API shutting down asks its
// senders to stop; requests in flight are answered, the sender closes the
// stream, and Shutdown returns well before its deadline.
func TestStreamShutdownAnswersFirst(t *testing.T) {
	a := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	// b serves on a PeerServer, as the backend does.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bURL := "http://" + ln.Addr().String()
	ln.Close()
	bs, err := New(Options{Self: bURL, Key: testKey, PeerTimeout: 3 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bs.Close)
	ps, err := bs.ListenPeers(ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- ps.Serve() }()
	b := &replica{Store: bs, url: bURL}
	rs := []*replica{a, b}
	a.SetPeers([]string{bURL})
	b.SetPeers([]string{a.url})
	for _, r := range rs {
		if err := r.Join(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	for i := range 40 {
		id := ownedBy(t, rs, b, fmt.Sprint("drain-", i))
		if err := a.Create(ctx, testSession(id, time.Now())); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	waitStream(t, a, b, ids[0])

	var wg sync.WaitGroup
	var answered, unavailable atomic.Int64
	stop := make(chan struct{})
	for i, id := range ids {
		wg.Go(func() {
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				time.Sleep(time.Millisecond) // well below the nonces a session may use
				_, err := a.RecordPoll(ctx, id, fmt.Sprint(i, "-", j), 0)
				switch {
				case err == nil:
					answered.Add(1)
				case errors.Is(err, sessions.ErrUnavailable):
					unavailable.Add(1)
				default:
					t.Errorf("a poll while the owner's peer API stops: %v", err)
				}
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	framesBefore := a.senders.frames.Load()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := ps.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Shutdown took %v", d)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	answeredBefore := answered.Load()
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	if answeredBefore == 0 || framesBefore == 0 {
		t.Fatalf("%d polls answered and %d frames sent before the shutdown", answeredBefore, framesBefore)
	}

	if a.senders.up(b.url) {
		t.Fatal("the sender still sends on the stream of a peer API that stopped")
	}
	// After it, a finds b's peer API refusing connections and serves b's
	// sessions from its copies (or answers unavailable meanwhile).
	t.Logf("%d polls answered before the shutdown, %d in all, %d unavailable", answeredBefore, answered.Load(), unavailable.Load())
}

// recordingDial records the bytes of every stream connection, both ways.
type recordingDial struct {
	mu   sync.Mutex
	out  []*bytes.Buffer // what the sender wrote
	in   []*bytes.Buffer // what it read
	conn []net.Conn
}

type recordedConn struct {
	net.Conn
	mu      *sync.Mutex
	out, in *bytes.Buffer
}

func (c recordedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.out.Write(p)
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c recordedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.in.Write(p[:n])
	c.mu.Unlock()
	return n, err
}

func (d *recordingDial) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	out, in := &bytes.Buffer{}, &bytes.Buffer{}
	d.out, d.in, d.conn = append(d.out, out), append(d.in, in), append(d.conn, c)
	return recordedConn{Conn: c, mu: &d.mu, out: out, in: in}, nil
}

// upgradeRaw opens a stream to r by hand and returns the connection and
// the reader after the upgrade's answer.
func upgradeRaw(t *testing.T, r *replica) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: %s\r\n%s: %s\r\nContent-Length: 0\r\n\r\n",
		PeerStreamPath, streamProtocol, headerStreamNonce, base64.RawURLEncoding.EncodeToString(make([]byte, streamNonceBytes)))
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return conn, br, res
}

// closedByPeer says whether the peer closes conn within a few seconds.
func closedByPeer(conn net.Conn, br *bufio.Reader) bool {
	conn.SetReadDeadline(time.Now().Add(4 * time.Second))
	_, err := io.Copy(io.Discard, br)
	return err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "reset")
}

// TestStreamTrafficSealedAndBound: nothing of a session is readable on a
// stream, either way; a frame recorded on one stream is refused on
// another (the receiver closes it, and the request it carried does
// nothing), as are frames sealed under another key and a frame cut
// short.
func TestStreamTrafficSealedAndBound(t *testing.T) {
	rec := &recordingDial{}
	a := startReplica(t, sessions.DefaultLimits, time.Now, Options{Dial: rec.dial})
	b := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	rs := []*replica{a, b}
	joinRing(t, rs)
	warm := ownedBy(t, rs, b, "warm")
	if err := a.Create(ctx, testSession(warm, time.Now())); err != nil {
		t.Fatal(err)
	}
	waitStream(t, a, b, warm)
	id, secrets := sendSecrets(t, rs, a, b, "sealed-stream")
	rec.mu.Lock()
	var out, in []byte
	for i := range rec.out {
		out, in = append(out, rec.out[i].Bytes()...), append(in, rec.in[i].Bytes()...)
	}
	first := bytes.Clone(rec.out[0].Bytes())
	rec.mu.Unlock()
	if len(out) < 500 || len(in) < 500 {
		t.Fatalf("only %d bytes out and %d in recorded", len(out), len(in))
	}
	for _, secret := range secrets {
		if bytes.Contains(out, []byte(secret)) || bytes.Contains(in, []byte(secret)) {
			t.Fatalf("stream traffic shows %q in clear", secret)
		}
	}

	// The frames a sent on its stream, replayed on a stream of their own
	// after a deletes the session: refused, and the session stays gone.
	head := bytes.Index(first, []byte("\r\n\r\n")) + 4
	frames := first[head:]
	if err := a.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	conn, br, res := upgradeRaw(t, b)
	if res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", res.Status)
	}
	conn.Write(frames)
	if !closedByPeer(conn, br) {
		t.Fatal("a replayed stream was not closed")
	}
	if _, err := b.Local().Get(ctx, id); !errors.Is(err, sessions.ErrNotFound) {
		t.Fatalf("the replayed frames brought the session back: %v", err)
	}

	other, err := newSealer(bytes.Repeat([]byte("x"), 32))
	if err != nil {
		t.Fatal(err)
	}
	for name, frame := range map[string][]byte{
		"another key": other.sealFrame([]byte(`B{"q":[{"op":"get","id":"x"}]}`), streamAAD(nil, make([]byte, 32), dirToReceiver, 0)),
		"cut short":   {0, 0, 1, 0, 1, 2, 3},
		"too long":    {0xff, 0xff, 0xff, 0xff},
		"too short":   {0, 0, 0, 3, 1, 2, 3},
	} {
		conn, br, _ := upgradeRaw(t, b)
		conn.Write(frame)
		if name == "cut short" {
			conn.(*net.TCPConn).CloseWrite()
		}
		if !closedByPeer(conn, br) {
			t.Fatalf("%s: the stream was not closed", name)
		}
	}
}

// TestStreamUpgradeRefusals: the stream path answers what is not an
// upgrade to it with a clear status, and refuses streams beyond
// maxReceiverStreams (503: the sender uses HTTP messages).
func TestStreamUpgradeRefusals(t *testing.T) {
	b := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	for name, tc := range map[string]struct {
		method string
		header http.Header
		want   int
	}{
		"GET":          {http.MethodGet, nil, http.StatusMethodNotAllowed},
		"no upgrade":   {http.MethodPost, nil, http.StatusUpgradeRequired},
		"another":      {http.MethodPost, http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}}, http.StatusUpgradeRequired},
		"no nonce":     {http.MethodPost, http.Header{"Connection": {"keep-alive, Upgrade"}, "Upgrade": {streamProtocol}}, http.StatusBadRequest},
		"short nonce":  {http.MethodPost, http.Header{"Connection": {"Upgrade"}, "Upgrade": {streamProtocol}, headerStreamNonce: {"AAAA"}}, http.StatusBadRequest},
		"padded nonce": {http.MethodPost, http.Header{"Connection": {"Upgrade"}, "Upgrade": {streamProtocol}, headerStreamNonce: {base64.StdEncoding.EncodeToString(make([]byte, 16))}}, http.StatusBadRequest},
	} {
		req, _ := http.NewRequest(tc.method, b.url+PeerStreamPath, nil)
		for k, v := range tc.header {
			req.Header[k] = v
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		res.Body.Close()
		if res.StatusCode != tc.want {
			t.Errorf("%s: %s, want %d", name, res.Status, tc.want)
		}
	}
	for i := range maxReceiverStreams {
		if _, _, res := upgradeRaw(t, b); res.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("stream %d: %s", i, res.Status)
		}
	}
	if _, _, res := upgradeRaw(t, b); res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") == "" {
		t.Fatalf("a stream beyond the bound: %s", res.Status)
	}
}

// silentReceiver accepts stream upgrades and then reads without ever
// answering, as a replica that hangs after the upgrade.
func silentReceiver(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		conns.Wait()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n%s: %s\r\n\r\n",
					streamProtocol, headerStreamChallenge, base64.RawURLEncoding.EncodeToString(make([]byte, streamNonceBytes)))
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				io.Copy(io.Discard, br)
			})
		}
	}()
	return ln.Addr().String()
}

// TestStreamSilentReceiverTimesOut: a receiver that takes the upgrade and
// then never answers costs a request the peer timeout, not more: it fails
// as unavailable, and the stream closes (the next batches go as HTTP
// messages until a new stream is up).
func TestStreamSilentReceiverTimesOut(t *testing.T) {
	silent := silentReceiver(t)
	var toSilent atomic.Bool
	b := startReplica(t, sessions.DefaultLimits, time.Now, Options{})
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if toSilent.Load() && "http://"+addr == b.url {
			addr = silent
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	a := startReplica(t, sessions.DefaultLimits, time.Now, Options{Dial: dial, PeerTimeout: 500 * time.Millisecond})
	rs := []*replica{a, b}
	joinRing(t, rs)
	id := ownedBy(t, rs, b, "silent")
	if err := a.Create(ctx, testSession(id, time.Now())); err != nil {
		t.Fatal(err)
	}
	toSilent.Store(true)
	if st := a.senders.peer(b.url).cur.Load(); st != nil {
		st.close(errStreamClosed) // the stream to b itself, dialed in the joins
	}
	deadline := time.Now().Add(5 * time.Second)
	for !a.senders.up(b.url) {
		if time.Now().After(deadline) {
			t.Fatal("no stream to the silent receiver")
		}
		// As HTTP messages to b meanwhile; the last one may go on the
		// silent stream as it comes up, and fail.
		if _, err := a.Get(ctx, id); err != nil && !errors.Is(err, sessions.ErrUnavailable) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	err := a.UseNonce(ctx, id, "lost?")
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("a request on a silent stream took %v", d)
	}
	if !errors.Is(err, sessions.ErrUnavailable) {
		t.Fatalf("a request on a silent stream: %v, want unavailable", err)
	}
	if a.senders.up(b.url) {
		t.Fatal("the stream to a silent receiver is still used")
	}
}

// TestMixedBatchGoesAsTwoMessages: a batch made for a stream (leaf and
// session requests together) that must go as HTTP messages goes as two,
// its leaf requests apart, and every request gets its own answer.
func TestMixedBatchGoesAsTwoMessages(t *testing.T) {
	rt := &recordingTransport{}
	a := startReplica(t, sessions.DefaultLimits, time.Now, Options{NoStreams: true, Transport: rt})
	b := startReplica(t, sessions.DefaultLimits, time.Now, Options{NoStreams: true})
	rs := []*replica{a, b}
	joinRing(t, rs)
	id := ownedBy(t, rs, b, "mixed")
	if err := a.Create(ctx, testSession(id, time.Now())); err != nil {
		t.Fatal(err)
	}
	reqs := []*peerRequest{
		{Op: opGet, ID: id},
		{Op: opJoin, From: a.url},
		{Op: opUseNonce, ID: id, Nonce: "mixed-1"},
		{Op: opExport, ID: id},
	}
	batch := make([]*pendingCall, len(reqs))
	for i, req := range reqs {
		batch[i] = &pendingCall{body: encodeRequestJSON(req), leaf: leafOp(req.Op), done: make(chan struct{})}
	}
	rt.mu.Lock()
	rt.bodies = nil
	rt.mu.Unlock()
	a.sendBatch(b.url, batch)
	// The messages a sent (other traffic may go meanwhile): one held the
	// two session requests alone, another the two leaf ones alone.
	rt.mu.Lock()
	var sent []string
	for i := 0; i < len(rt.bodies); i += 2 {
		_, plain, err := a.sealer.open(bytes.Clone(rt.bodies[i]), aadRequest)
		if err != nil {
			t.Fatal(err)
		}
		msg, err := decodeBatch(plain)
		if err != nil {
			t.Fatal(err)
		}
		var ops []string
		for _, r := range msg.Reqs {
			ops = append(ops, r.Op)
		}
		sent = append(sent, strings.Join(ops, ","))
	}
	rt.mu.Unlock()
	if !slices.Contains(sent, opGet+","+opUseNonce) || !slices.Contains(sent, opJoin+","+opExport) {
		t.Fatalf("a mixed batch went as the messages %q, want %q and %q apart", sent, opGet+","+opUseNonce, opJoin+","+opExport)
	}
	for i, pc := range batch {
		<-pc.done
		if pc.err != nil || pc.resp == nil || pc.resp.Err != "" {
			t.Fatalf("request %d (%s): %+v %v", i, reqs[i].Op, pc.resp, pc.err)
		}
	}
	if batch[0].resp.Session == nil || batch[0].resp.Session.ID != id || batch[3].resp.Record == nil {
		t.Fatalf("the answers are not each request's own: get %+v, export %+v", batch[0].resp.Session, batch[3].resp)
	}
	if err := b.Local().UseNonce(ctx, id, "mixed-1"); !errors.Is(err, sessions.ErrNonceUsed) {
		t.Fatalf("the nonce of the mixed batch at the owner: %v", err)
	}
}
