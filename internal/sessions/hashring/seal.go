package hashring

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"sync"
	"time"
)

// MinKeyBytes is the shortest peer key accepted.
const MinKeyBytes = 32

// Peer messages are sealed with AES-256-GCM under a key derived from the
// shared peer key: GCM authenticates (its tag is compared in constant time
// by crypto/cipher) and encrypts, because session secrets and kubeconfigs
// cross the wire and nobody on the network may read them.
//
// A request is nonce || GCM(plaintext, aad="req"); its plaintext carries a
// timestamp, and each request nonce is accepted once (replayCache). A
// response is sealed with aad = "resp" || the request's nonce, so it
// answers that one request and cannot be replayed for another.
const gcmNonceSize = 12

var errSealed = errors.New("peer message failed authentication")

type sealer struct{ aead cipher.AEAD }

func newSealer(key []byte) (*sealer, error) {
	if len(key) < MinKeyBytes {
		return nil, errors.New("hashring: the peer key must be at least 32 bytes")
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("kube-bind-backend sessions peer AES-256-GCM v1"))
	block, err := aes.NewCipher(mac.Sum(nil))
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead}, nil
}

var (
	aadRequest  = []byte("req")
	aadResponse = []byte("resp")
)

// seal returns nonce || ciphertext of plaintext under aad.
func (s *sealer) seal(plaintext, aad []byte) []byte {
	return s.sealTo(make([]byte, 0, gcmNonceSize+len(plaintext)+s.aead.Overhead()), plaintext, aad)
}

// sealTo appends nonce || ciphertext of plaintext under aad to dst.
func (s *sealer) sealTo(dst, plaintext, aad []byte) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, gcmNonceSize)...)
	nonce := dst[start:]
	if _, err := rand.Read(nonce); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return s.aead.Seal(dst, nonce, plaintext, aad)
}

// open authenticates and decrypts msg, returning its nonce and plaintext.
// It decrypts in place: the plaintext overwrites msg after the nonce.
func (s *sealer) open(msg, aad []byte) (nonce, plaintext []byte, err error) {
	if len(msg) < gcmNonceSize+s.aead.Overhead() {
		return nil, nil, errSealed
	}
	nonce = msg[:gcmNonceSize]
	// The plaintext overwrites msg: additional data that shares its memory
	// would be overwritten as it is read (crypto/cipher panics), so it is
	// read from a copy (a few bytes per message).
	plaintext, err = s.aead.Open(msg[gcmNonceSize:gcmNonceSize], nonce, msg[gcmNonceSize:], bytes.Clone(aad))
	if err != nil {
		return nil, nil, errSealed
	}
	return nonce, plaintext, nil
}

func responseAAD(reqNonce []byte) []byte {
	return append(append(make([]byte, 0, len(aadResponse)+len(reqNonce)), aadResponse...), reqNonce...)
}

// replayWindow is how far a request's timestamp may be from the receiver's
// clock. Peers' clocks must agree within it (NTP does far better).
const replayWindow = 30 * time.Second

// maxRemembered bounds each generation of the replay cache: with two
// generations of replayWindow it admits about 8700 peer requests a second.
const maxRemembered = 1 << 18

var errReplay = errors.New("peer request replayed, too old, or too many")

// replayCache remembers the nonces of accepted requests for at least
// replayWindow, in two generations that rotate, so memory stays bounded.
type replayCache struct {
	mu        sync.Mutex
	cur, prev map[[gcmNonceSize]byte]struct{}
	rotated   time.Time
}

func newReplayCache() *replayCache {
	return &replayCache{cur: map[[gcmNonceSize]byte]struct{}{}, prev: map[[gcmNonceSize]byte]struct{}{}}
}

// accept reports whether a request with this nonce, sent at sent, is fresh
// and has not been seen, and remembers it.
func (c *replayCache) accept(nonce []byte, sent, now time.Time) error {
	if d := now.Sub(sent); d > replayWindow || d < -replayWindow {
		return errReplay
	}
	var k [gcmNonceSize]byte
	copy(k[:], nonce)
	c.mu.Lock()
	defer c.mu.Unlock()
	// Rotate every window: a nonce stays remembered for at least one full
	// window plus the clock skew allowance after it was accepted.
	if now.Sub(c.rotated) >= 2*replayWindow {
		c.prev, c.cur = c.cur, make(map[[gcmNonceSize]byte]struct{}, len(c.cur))
		c.rotated = now
	}
	if _, ok := c.cur[k]; ok {
		return errReplay
	}
	if _, ok := c.prev[k]; ok {
		return errReplay
	}
	if len(c.cur) >= maxRemembered {
		return errReplay
	}
	c.cur[k] = struct{}{}
	return nil
}
