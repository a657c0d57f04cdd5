package hashring

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// FuzzStreamReceiver: what a sender writes on a stream after the upgrade:
// plain, sealed as the stream's first frame, then raw bytes. Whatever
// they are, serve ends when the input does (no hang, no panic); a first
// frame that is no batch gets no answer; a batch gets one ack with an
// answer or a null for each request, and a later for each null, all
// sealed for this stream in order; the raw bytes (not sealed for the
// stream) get nothing more.
func FuzzStreamReceiver(f *testing.F) {
	for _, s := range []string{
		`{"op":"get","id":"known-session"}`, `{"op":"poll","id":"known-session","n":"n1","i":1000}`,
		`{"op":"complete","id":"known-session","b":"e30="}`, `{"op":"explode"}`, `{"op":"wait","id":"known-session","i":1}`,
		`{"op":"replicate","rs":[{"s":{"id":"copy","ea":4102444800000000000},"n":[1]}]}`,
	} {
		f.Add([]byte(`B{"q":[`+s+`]}`), []byte{})
	}
	f.Add([]byte(`B{"q":[{"op":"get","id":"known-session"},{"op":"usenonce","id":"known-session","n":"x"}]}`), []byte{0, 0, 0, 40, 1, 2})
	f.Add([]byte(`A{"q":[]}`), []byte{})
	f.Add([]byte(`B{"q":[]}`), []byte{})
	f.Add([]byte(``), []byte{0xff, 0xff, 0xff, 0xff})
	r, err := New(Options{Self: "http://127.0.0.1:1", Key: testKey, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(r.Close)
	id := bytes.Repeat([]byte{7}, 2*streamNonceBytes)
	f.Fuzz(func(t *testing.T, plain, raw []byte) {
		if _, err := r.local.Get(ctx, peerSessionID); err != nil {
			r.local.Remove(peerSessionID)
			if err := r.local.Create(ctx, testSession(peerSessionID, time.Now().Add(time.Hour))); err != nil {
				t.Fatal(err)
			}
		}
		// The input is read from memory; the answers go over a pipe.
		sender, receiver := net.Pipe()
		in := append(r.sealer.sealFrame(plain, streamAAD(nil, id, dirToReceiver, 0)), raw...)
		st := &receiverStream{s: r, conn: receiver, br: bufio.NewReader(bytes.NewReader(in)), id: id, slots: make(chan struct{}, maxStreamWorkers)}
		served := make(chan struct{})
		go func() {
			defer close(served)
			st.serve()
		}()
		var answers []parsedAnswer
		br := bufio.NewReader(sender)
		var aad []byte
		sender.SetReadDeadline(time.Now().Add(10 * time.Second))
		for seq := uint64(0); ; seq++ {
			frame, err := readFrame(br, 1<<30)
			if err != nil {
				break
			}
			aad = streamAAD(aad, id, dirToSender, seq)
			_, out, err := r.sealer.open(frame, aad)
			if err != nil {
				t.Fatalf("answer %d does not open for this stream: %v", seq, err)
			}
			p, err := parseAnswerFrame(out)
			if err != nil {
				t.Fatalf("answer %d: %v", seq, err)
			}
			answers = append(answers, p)
		}
		<-served
		sender.Close()
		batch, batchErr := decodeBatch(bytes.TrimPrefix(plain, []byte{frameBatch}))
		if len(plain) == 0 || plain[0] != frameBatch || batchErr != nil {
			if len(answers) != 0 {
				t.Fatalf("first frame %q is no batch, yet answered %d frames", plain, len(answers))
			}
			return
		}
		acks, laters := 0, map[int]bool{}
		nulls := 0
		for _, p := range answers {
			if p.seq != 0 {
				t.Fatalf("an answer to batch %d, of one batch", p.seq)
			}
			switch p.kind {
			case frameAck:
				acks++
				if len(p.resps) != len(batch.Reqs) {
					t.Fatalf("an ack of %d answers to %d requests", len(p.resps), len(batch.Reqs))
				}
				for _, resp := range p.resps {
					if resp == nil {
						nulls++
					}
				}
			case frameLater:
				if p.index >= len(batch.Reqs) || laters[p.index] {
					t.Fatalf("a later answer to request %d of %d, or twice", p.index, len(batch.Reqs))
				}
				laters[p.index] = true
			default:
				t.Fatalf("a frame of kind %q", p.kind)
			}
		}
		if acks != 1 || nulls != len(laters) {
			t.Fatalf("%d acks with %d nulls, and %d laters", acks, nulls, len(laters))
		}
	})
}

// FuzzStreamSender: what a sender reads from a peer. answer is the
// peer's answer to the upgrade: a stream comes of it only with a 101, the
// protocol's Upgrade and a well-formed challenge. frame is the plaintext
// of a frame to a sender with a batch of three requests in flight: each
// request gets at most one answer; a frame that is not an ack or later of
// the right form fails the stream, and then every request fails.
func FuzzStreamSender(f *testing.F) {
	ok := "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + streamProtocol + "\r\n" + headerStreamChallenge + ": AAAAAAAAAAAAAAAAAAAAAA\r\n\r\n"
	f.Add([]byte(ok), []byte("A\x00\x00\x00\x00\x00\x00\x00\x00"+`{"a":[{},null,{"e":"not_found"}]}`))
	f.Add([]byte(ok), []byte("L\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01"+`{"a":[{"s":{"id":"x"}}]}`))
	f.Add([]byte(ok), []byte("L\x00\x00\x00\x00\x00\x00\x00\x00\x00\x09"+`{"a":[{}]}`))
	f.Add([]byte(ok), []byte("A\x00\x00\x00\x00\x00\x00\x00\x00"+`{"a":[{}]}`))
	f.Add([]byte(ok), []byte("G"))
	f.Add([]byte("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"), []byte("X"))
	f.Add([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"), []byte{})
	f.Add([]byte("HTTP/1.1 101 OK\r\nUpgrade: "+streamProtocol+"\r\n"+headerStreamChallenge+": short\r\n\r\n"), []byte{})
	s, err := newSealer(testKey)
	if err != nil {
		f.Fatal(err)
	}
	ss := newSenders(s, nil, time.Second, 1<<20, slog.New(slog.DiscardHandler))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { ln.Close() })
	f.Fuzz(func(t *testing.T, answer, frame []byte) {
		// A loopback TCP connection: the peer's answer ends where it stops
		// writing (CloseWrite), and a short answer fails at once.
		local, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer local.Close()
		peer, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer peer.Close()
		go func() {
			// The upgrade request, then the answer.
			peer.SetDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(peer)
			for {
				line, err := br.ReadString('\n')
				if err != nil || line == "\r\n" {
					break
				}
			}
			peer.Write(answer)
			peer.(*net.TCPConn).CloseWrite()
			io.Copy(io.Discard, br)
		}()
		st, err := ss.upgrade(local, "peer:1", &senderPeer{})
		if err != nil {
			return
		}
		if !bytes.Contains(answer, []byte(" 101 ")) || !bytes.Contains(bytes.ToLower(answer), []byte(streamProtocol)) {
			t.Fatalf("a stream from the answer %q", answer)
		}
		calls := make([]*pendingCall, 3)
		for i := range calls {
			calls[i] = &pendingCall{done: make(chan struct{})}
		}
		sb := &streamBatch{calls: append([]*pendingCall(nil), calls...), left: 3, sent: time.Now(), acked: make(chan struct{})}
		st.batches[0] = sb
		if err := st.deliver(frame); err != nil {
			st.close(err)
			for i, pc := range calls {
				select {
				case <-pc.done:
				default:
					t.Fatalf("request %d neither answered nor failed after the stream failed", i)
				}
			}
		}
		answered := 0
		for _, pc := range calls {
			select {
			case <-pc.done:
				answered++
				if pc.resp == nil && pc.err == nil {
					t.Fatal("a request done without an answer or an error")
				}
			default:
			}
		}
		if answered != 3-sb.left {
			t.Fatalf("%d requests done, the batch counts %d", answered, 3-sb.left)
		}
		st.close(errStreamClosed)
	})
}

// FuzzStreamUpgradeRequest: any method and Connection, Upgrade and nonce
// headers on the stream path. Only a POST that asks for this protocol
// with a nonce of 16 bytes gets past the checks (to 501 here: a recorder
// cannot be hijacked); anything else is 405, 426 or 400. None keeps a
// stream slot.
func FuzzStreamUpgradeRequest(f *testing.F) {
	good := base64.RawURLEncoding.EncodeToString(make([]byte, streamNonceBytes))
	f.Add(http.MethodPost, "Upgrade", streamProtocol, good)
	f.Add(http.MethodPost, "keep-alive, UPGRADE", strings.ToUpper(streamProtocol), good)
	f.Add(http.MethodGet, "Upgrade", streamProtocol, good)
	f.Add(http.MethodPost, "upgrades", streamProtocol, good)
	f.Add(http.MethodPost, "Upgrade", "websocket", good)
	f.Add(http.MethodPost, "Upgrade", streamProtocol, good+"=")
	f.Add(http.MethodPost, "Upgrade", streamProtocol, "AAAA")
	r, err := New(Options{Self: "http://127.0.0.1:1", Key: testKey, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(r.Close)
	h := r.PeerHandler()
	f.Fuzz(func(t *testing.T, method, connection, upgrade, nonce string) {
		req, err := http.NewRequest(method, "http://peer"+PeerStreamPath, nil)
		if err != nil {
			return // not a method net/http would read
		}
		req.Header.Set("Connection", connection)
		req.Header.Set("Upgrade", upgrade)
		req.Header.Set(headerStreamNonce, nonce)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		asks := false
		for _, tok := range strings.Split(connection, ",") {
			asks = asks || strings.EqualFold(strings.Trim(tok, " \t"), "upgrade")
		}
		n, nerr := base64.RawURLEncoding.DecodeString(nonce)
		valid := method == http.MethodPost && asks && strings.EqualFold(upgrade, streamProtocol) && nerr == nil && len(n) == streamNonceBytes
		switch {
		case valid && w.Code != http.StatusNotImplemented:
			t.Fatalf("a well-formed upgrade (%q %q %q %q): %d", method, connection, upgrade, nonce, w.Code)
		case !valid && w.Code != http.StatusMethodNotAllowed && w.Code != http.StatusUpgradeRequired && w.Code != http.StatusBadRequest:
			t.Fatalf("a malformed upgrade (%q %q %q %q): %d", method, connection, upgrade, nonce, w.Code)
		}
		r.receivers.mu.Lock()
		held := r.receivers.n
		r.receivers.mu.Unlock()
		if held != 0 {
			t.Fatalf("%d stream slots held after the request", held)
		}
	})
}
