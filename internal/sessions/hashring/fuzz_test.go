package hashring

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/sessions"
)

// FuzzSealOpen: open(seal(x)) == x under the same additional data, and
// the message is refused with any bit changed, cut short, under other
// additional data or another key. Any message not sealed here (msg) is
// refused.
func FuzzSealOpen(f *testing.F) {
	f.Add([]byte(`{"t":1,"op":"get","id":"s"}`), []byte("req"), uint16(0), []byte("hello"))
	f.Add([]byte{}, []byte{}, uint16(77), []byte{})
	f.Add(bytes.Repeat([]byte{0xff}, 300), []byte("resp\x00\x01\x02"), uint16(9999), make([]byte, 28))
	s, err := newSealer(testKey)
	if err != nil {
		f.Fatal(err)
	}
	other, err := newSealer(bytes.Repeat([]byte("x"), 32))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, plain, aad []byte, flip uint16, msg []byte) {
		if _, _, err := s.open(msg, aad); err == nil {
			t.Fatalf("a message not sealed here opened: %x", msg)
		}
		// open decrypts in place: each open below gets a copy.
		sealed := s.seal(plain, aad)
		nonce, got, err := s.open(bytes.Clone(sealed), aad)
		if err != nil || !bytes.Equal(got, plain) || !bytes.Equal(nonce, sealed[:gcmNonceSize]) {
			t.Fatalf("round trip: %q, %v", got, err)
		}
		// Additional data sharing the message's memory (as the fuzzer's
		// arguments can): an error, not crypto/cipher's overlap panic.
		shared := bytes.Clone(sealed)
		if _, _, err := s.open(shared, shared[gcmNonceSize:gcmNonceSize+3]); err == nil {
			t.Fatal("opened under additional data taken from the message itself")
		}
		if bytes.Contains(sealed, plain) && len(plain) >= 8 {
			t.Fatalf("plaintext visible in the sealed message")
		}
		if again := s.seal(plain, aad); bytes.Equal(again[:gcmNonceSize], sealed[:gcmNonceSize]) {
			t.Fatal("two seals share a nonce")
		}
		bit := int(flip) % (len(sealed) * 8)
		tampered := bytes.Clone(sealed)
		tampered[bit/8] ^= 1 << (bit % 8)
		if _, _, err := s.open(tampered, aad); err == nil {
			t.Fatalf("bit %d flipped: still opens", bit)
		}
		if _, _, err := s.open(bytes.Clone(sealed[:len(sealed)-1-int(flip)%len(sealed)]), aad); err == nil {
			t.Fatal("a shortened message opens")
		}
		if _, _, err := s.open(bytes.Clone(sealed), append(bytes.Clone(aad), 0)); err == nil {
			t.Fatal("opens under other additional data")
		}
		if _, _, err := other.open(bytes.Clone(sealed), aad); err == nil {
			t.Fatal("opens under another key")
		}
	})
}

// FuzzReplayCache drives the replay cache with a sequence of requests:
// each 4 bytes of ops are a nonce (1 byte: few distinct nonces, so they
// repeat), how far the clock moves on (0 to 255 s, and milliseconds) and
// how far the request's timestamp is from the clock (signed, up to
// ±63 s). A message (nonce and timestamp are sealed together) is accepted
// at most once; one outside the window never; a never-seen nonce inside
// it always.
//
// The clock only moves forward, as the cache's rotation does in
// production (time.Now's monotonic reading); the window check uses the
// wall clock, so a wall clock stepped back by more than about 90 s could
// let a recorded request be accepted again (docs/fuzzing.md).
func FuzzReplayCache(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 1, 0, 0, 0})                     // immediate replay
	f.Add([]byte{1, 0, 0, 0, 1, 20, 0xec, 0, 1, 40, 0xd8, 0}) // replays as the clock moves on
	f.Add([]byte{1, 0, 62, 0, 2, 0, 0xc2, 0, 3, 0x80, 0, 0})  // outside the window; a long pause
	f.Add([]byte{1, 0, 0, 0, 2, 59, 0, 0, 3, 61, 0, 0, 1, 121, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		c := newReplayCache()
		now := time.Unix(1_800_000_000, 0)
		type msg struct {
			nonce byte
			sent  time.Time
		}
		accepted := map[msg]bool{}
		seen := map[byte]bool{}
		for i := 0; i+3 < len(ops); i += 4 {
			now = now.Add(time.Duration(ops[i+1])*time.Second + time.Duration(ops[i+3])*time.Millisecond)
			m := msg{ops[i], now.Add(time.Duration(int8(ops[i+2])/2) * time.Second)}
			nonce := bytes.Repeat([]byte{m.nonce}, gcmNonceSize)
			err := c.accept(nonce, m.sent, now)
			skew := now.Sub(m.sent)
			inWindow := skew <= replayWindow && skew >= -replayWindow
			switch {
			case err == nil && accepted[m]:
				t.Fatalf("op %d: message %v replayed at %v and accepted again", i/4, m, now)
			case err == nil && !inWindow:
				t.Fatalf("op %d: accepted a message %v off by %v", i/4, m, skew)
			case err != nil && inWindow && !seen[m.nonce]:
				t.Fatalf("op %d: refused a fresh message: %v", i/4, err)
			}
			if err == nil {
				accepted[m] = true
				seen[m.nonce] = true
			}
		}
	})
}

// peerSession is the session the fuzzed peer requests find on the owner.
const peerSessionID = "known-session"

// FuzzServePeer: the owner's side of the peer API, given any plaintext in
// a correctly sealed request (fresh=true stamps it with the current time
// when it is a JSON object, so that it passes the replay check). Never a
// 5xx; a 200 answer opens under this request's nonce and decodes into one
// answer per request of the batch; the owner's error codes are the known
// ones or malformed, never "internal"; an answer to get, state and poll
// carries a session, state's without its secrets; the same sealed request
// again is refused.
func FuzzServePeer(f *testing.F) {
	for _, s := range []string{
		`{"op":"get","id":"known-session"}`, `{"op":"state","id":"known-session"}`, `{"op":"static","id":"known-session"}`,
		`{"op":"usenonce","id":"known-session","n":"n1"}`, `{"op":"poll","id":"known-session","n":"n2","i":1000000000}`,
		`{"op":"poll","id":"known-session","n":"n3","i":-5}`, `{"op":"complete","id":"other","b":"e30="}`,
		`{"op":"poll","id":"known-session","n":"n4","sd":"AAAAAAAAAAAAAAAAAAAAAA=="}`,
		`{"op":"deny","id":"other","r":"no"}`, `{"op":"delete","id":"nobody"}`,
		`{"op":"create","s":{"id":"fresh","c":"c","k":"k","ca":1,"ea":4102444800000000000,"st":7}}`,
		`{"op":"create","s":{"id":"","ea":-1}}`, `{"op":"create"}`, `{"op":"explode"}`, `{"op":"get","id":"known-session","t":"x"}`,
		`[]`, `null`, ``, `{"op":"get","id":"known-session","s":{"id":1}}`,
		`{"op":"join","f":"http://127.0.0.1:1","inc":5,"m":true}`, `{"op":"join","f":"http://127.0.0.1:1","inc":5}`,
		`{"op":"leave","f":"http://127.0.0.1:1","inc":5,"l":true}`, `{"op":"transfer","id":"known-session"}`,
		`{"op":"transfer","id":"nobody"}`, `{"op":"dropcopy","id":"known-session"}`,
		`{"op":"replicate","rs":[{"s":{"id":"known-session","c":"x"},"n":[1,2]},{"s":null},{"p":true,"s":{"id":"nobody","ea":4102444800000000000}}]}`,
		`{"op":"handover","rs":[{"s":{"id":"moved","c":"c","k":"k","ca":1,"ea":4102444800000000000,"st":1,"r":"e30="},"n":[18446744073709551615,0]}]}`,
		`{"op":"get","id":"known-session","h":99}`, `{"op":"poll","id":"known-session","n":"n4","h":-1}`,
		`{"op":"wait","id":"known-session","i":1000000}`, `{"op":"wait","id":"nobody","i":-1}`,
	} {
		f.Add([]byte(`{"q":[`+s+`]}`), true)
	}
	f.Add([]byte(`{"q":[{"op":"get","id":"known-session"},{"op":"poll","id":"known-session","n":"m1"},{"op":"explode"}]}`), true)
	f.Add([]byte(`{"q":[]}`), true)
	f.Add([]byte(`{"q":null}`), true)
	f.Add([]byte(``), true)
	f.Add([]byte(`{"t":1,"q":[{"op":"get","id":"known-session"}]}`), false)
	r, err := New(Options{Self: "http://127.0.0.1:1", Key: testKey, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(r.Close)
	h := r.PeerHandler()
	f.Fuzz(func(t *testing.T, plain []byte, fresh bool) {
		// A long-lived session for the operations to find, made again
		// when an earlier input completed, denied or deleted it.
		// Fuzzed joins and leaves must not carry over: alone again.
		r.mu.Lock()
		r.m.members, r.m.down, r.m.left = map[string]uint64{}, map[string]uint64{}, map[string]uint64{}
		r.rebuildLocked()
		r.mu.Unlock()
		if s, err := r.local.Get(ctx, peerSessionID); err != nil || s.State != sessions.StatePending {
			r.local.Remove(peerSessionID) // a transfer may have left a copy
			if err := r.local.Create(ctx, testSession(peerSessionID, time.Now().Add(time.Hour))); err != nil {
				t.Fatal(err)
			}
		}
		var obj map[string]json.RawMessage
		if fresh && json.Unmarshal(plain, &obj) == nil && obj != nil {
			obj["t"], _ = json.Marshal(time.Now().UnixNano())
			plain, _ = json.Marshal(obj)
		}
		batch, batchErr := decodeBatch(plain)
		if batchErr == nil {
			for _, req := range batch.Reqs {
				if req.Op == opCreate && req.Session != nil && req.Session.ID != peerSessionID {
					defer r.local.Remove(req.Session.ID)
				}
			}
		}
		body := r.sealer.seal(plain, aadRequest)
		post := func() *httptest.ResponseRecorder {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, PeerPath, bytes.NewReader(body)))
			return w
		}
		w := post()
		switch w.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusUnauthorized:
		default:
			t.Fatalf("plaintext %q: status %d %s", plain, w.Code, w.Body)
		}
		if w.Code == http.StatusOK {
			if batchErr != nil {
				t.Fatalf("plaintext %q: served, but it is no batch: %v", plain, batchErr)
			}
			_, out, err := r.sealer.open(w.Body.Bytes(), responseAAD(body[:gcmNonceSize]))
			if err != nil {
				t.Fatalf("plaintext %q: the answer does not open for this request: %v", plain, err)
			}
			resps, err := decodeBatchResponse(out, len(batch.Reqs))
			if err != nil {
				t.Fatalf("answer %q: %v", out, err)
			}
			for i, resp := range resps {
				req := batch.Reqs[i]
				if _, known := wireErrors[resp.Err]; resp.Err != "" && resp.Err != codeMalformed && !known {
					t.Fatalf("plaintext %q: owner error %q", plain, resp.Err)
				}
				for _, code := range resp.Errs {
					if _, known := wireErrors[code]; code != "" && !known {
						t.Fatalf("plaintext %q: record error %q", plain, code)
					}
				}
				if resp.Err == "" && (req.Op == opReplicate || req.Op == opHandover) && len(resp.Errs) != len(req.Records) {
					t.Fatalf("plaintext %q: %d record answers for %d records", plain, len(resp.Errs), len(req.Records))
				}
				if resp.Err == "" && (req.Op == opGet || req.Op == opState || req.Op == opPoll || req.Op == opWait) && resp.Session == nil {
					t.Fatalf("plaintext %q: %s answered without a session", plain, req.Op)
				}
				if req.Op == opState && resp.Session != nil && (resp.Session.Secret != "" || resp.Session.ClusterID != "" || len(resp.Session.StaticDigest) == 0) {
					t.Fatalf("state answer %+v carries the static part", resp.Session)
				}
				if req.Op == opPoll && len(req.StaticDigest) > 0 && resp.Session != nil && resp.Session.Secret != "" {
					t.Fatalf("poll with a digest answered with the secret")
				}
				if resp.Err == "too_soon" && resp.RetryAfter <= 0 {
					t.Fatalf("too_soon without a positive retry-after: %d", resp.RetryAfter)
				}
			}
		}
		switch again := post(); {
		case w.Code == http.StatusOK && again.Code != http.StatusUnauthorized:
			t.Fatalf("plaintext %q: replay answered %d", plain, again.Code)
		case again.Code == http.StatusOK:
			t.Fatalf("plaintext %q: refused (%d), then served when replayed", plain, w.Code)
		}
	})
}

// scriptedPeer is the transport of a non-owner whose owner answers every
// peer batch with the fuzzed plaintext, sealed for that request (or, with
// wrongNonce, for another one).
type scriptedPeer struct {
	s *sealer

	// A non-owner's Get asks for state and static part at once.
	mu         sync.Mutex
	plain      []byte
	status     int
	wrongNonce bool
}

func (p *scriptedPeer) set(plain []byte, status int, wrongNonce bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.plain, p.status, p.wrongNonce = plain, status, wrongNonce
}

func (p *scriptedPeer) RoundTrip(r *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(r.Body)
	nonce, plain, err := p.s.open(body, aadRequest)
	if err != nil {
		return nil, fmt.Errorf("request did not open: %v", err)
	}
	if _, err := decodeBatch(plain); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.wrongNonce {
		nonce = bytes.Repeat([]byte{1}, gcmNonceSize)
	}
	sealed := p.s.seal(p.plain, responseAAD(nonce))
	return &http.Response{
		StatusCode: p.status, Body: io.NopCloser(bytes.NewReader(sealed)), ContentLength: int64(len(sealed)),
		Header: http.Header{}, Request: r,
	}, nil
}

// FuzzPeerResponse: a non-owner decoding its owner's answers to a batch
// (of one request: each operation here makes one call). Whatever the
// (authenticated) answer says, every operation returns nil, a sessions
// error the wire code names (too_soon with its retry-after), an
// *OwnerUnavailableError, or the owner's failure; an answer sealed for
// another request, with a non-200 status, or with another number of
// answers than requests is an unavailable owner.
func FuzzPeerResponse(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"e":"not_found"}`, `{"e":"too_soon","ra":1500000000}`, `{"e":"internal"}`, `{"e":"exists"}`, `{"e":"full"}`,
		`{"e":"nonce_used"}`, `{"e":"too_many_nonces"}`, `{"e":"not_pending"}`, `{"e":"too_large"}`, `{"e":"what"}`,
		`{"s":{"id":"x","c":"c","k":"k","ca":1,"ea":2,"st":1,"r":"e30=","da":3,"lp":4,"sd":"AAAA"}}`,
		`{"s":{"id":"x","st":-9,"ea":-1}}`, `{"st":"eyJpZCI6IngifQ=="}`, `{"st":"bm90IGpzb24="}`, `null`, `[1]`, `{"e":1}`,
		`{"e":"malformed"}`, `{"e":"stale_static"}`,
		// A change's copy sent back in the answer (the non-owner is the
		// backup): mutable-only with the answer's session, whole, or odd.
		`{"s":{"id":"x","ea":4102444800000000000,"lp":4},"cp":{"s":null,"mu":true,"p":true,"n":[5],"ln":5,"lr":1}}`,
		`{"s":{"id":"x","ea":4102444800000000000},"cp":{"s":{"id":"x","k":"k","ea":4102444800000000000},"n":[1,2]}}`,
		`{"cp":{"s":null}}`, `{"cp":{"s":{"id":"other","ea":1},"mu":true}}`, `{"cp":null}`, `{"cp":[]}`,
	} {
		f.Add([]byte(`{"a":[`+s+`]}`), uint8(0), 200, false)
	}
	// A poll's answer carrying a whole copy of another session.
	f.Add([]byte(`{"a":[{"s":{"id":"x","ea":4102444800000000000},"cp":{"s":{"id":"x","k":"k","ea":4102444800000000000},"n":[1,2]}}]}`), uint8(3), 200, false)
	f.Add([]byte(`{"a":[{},{}]}`), uint8(1), 200, false)
	f.Add([]byte(`{"a":[]}`), uint8(1), 200, false)
	f.Add([]byte(`{}`), uint8(1), 200, false)
	f.Add([]byte(``), uint8(1), 200, false)
	f.Add([]byte(`{}`), uint8(3), 500, false)
	f.Add([]byte(`{}`), uint8(1), 200, true)
	s, err := newSealer(testKey)
	if err != nil {
		f.Fatal(err)
	}
	peer := &scriptedPeer{s: s}
	st, err := New(Options{Self: "http://self:1", Key: testKey, Transport: peer, NoStreams: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(st.Close)
	st.SetPeers([]string{"http://self:1", "http://owner:1"})
	n := 0
	f.Fuzz(func(t *testing.T, plain []byte, op uint8, status int, wrongNonce bool) {
		if status < 100 || status > 999 {
			return // net/http refuses to write such a status line
		}
		peer.set(plain, status, wrongNonce)
		// The scripted owner is a member, whatever earlier answers said
		// of it ("l" takes it out of the ring, as a leaving replica's
		// answer would).
		st.mu.Lock()
		st.m.members, st.m.down, st.m.left = map[string]uint64{"http://owner:1": 1}, map[string]uint64{}, map[string]uint64{}
		st.rebuildLocked()
		st.mu.Unlock()
		// A new ID each time, owned by the other replica: the non-owner
		// caches static parts it fetched.
		var id string
		for {
			n++
			if id = fmt.Sprintf("fuzz-%d", n); st.Owner(id) == "http://owner:1" {
				break
			}
		}
		var resp peerResponse
		resps, err := decodeBatchResponse(plain, 1)
		decoded := err == nil
		if decoded {
			resp = *resps[0]
		}

		var opErr error
		var got sessions.Session
		name := []string{"create", "get", "usenonce", "poll", "complete", "deny", "delete", "static"}[int(op)%8]
		switch name {
		case "create":
			opErr = st.Create(ctx, testSession(id, time.Now()))
		case "get":
			got, opErr = st.Get(ctx, id)
		case "usenonce":
			opErr = st.UseNonce(ctx, id, "n")
		case "poll":
			got, opErr = st.RecordPoll(ctx, id, "n", time.Second)
		case "complete":
			opErr = st.Complete(ctx, id, []byte(`{}`))
		case "deny":
			opErr = st.Deny(ctx, id, "r")
		case "delete":
			opErr = st.Delete(ctx, id)
		case "static":
			got, opErr = st.Static(ctx, id)
			if opErr == nil && got.ID != id {
				t.Fatalf("static: answer %q gave the static part of %q", plain, got.ID)
			}
		}
		// A copy in an answer is taken only for the session asked about.
		for _, other := range []string{"x", "other"} {
			if _, held := st.local.Holds(other); held {
				t.Fatalf("%s of %s: answer %q left a copy of %s", name, id, plain, other)
			}
		}
		var unavailable *OwnerUnavailableError
		isUnavailable := errors.As(opErr, &unavailable)
		if (status != 200 || wrongNonce || !decoded) && opErr != nil && !isUnavailable {
			t.Fatalf("%s: answer %q status %d: error %v, want an unavailable owner", name, plain, status, opErr)
		}
		if (status != 200 || wrongNonce || !decoded) && opErr == nil && name != "delete" {
			t.Fatalf("%s: answer %q status %d (wrong nonce %v) accepted", name, plain, status, wrongNonce)
		}
		if opErr == nil || isUnavailable {
			if opErr == nil && (name == "get" || name == "poll" || name == "static") && got.ID == "" && resp.Session == nil {
				t.Fatalf("%s: succeeded without a session: %+v", name, got)
			}
			return
		}
		switch code := resp.Err; {
		case code == "too_soon":
			var soon *sessions.TooSoonError
			if !errors.As(opErr, &soon) || soon.RetryAfter != time.Duration(resp.RetryAfter) {
				t.Fatalf("%s: too_soon became %v", name, opErr)
			}
		case wireErrors[code] != nil:
			if !errors.Is(opErr, wireErrors[code]) {
				t.Fatalf("%s: %q became %v", name, code, opErr)
			}
		case !strings.HasPrefix(opErr.Error(), "hashring: the owner failed: "):
			t.Fatalf("%s: answer %q gave %v", name, plain, opErr)
		}
	})
}
