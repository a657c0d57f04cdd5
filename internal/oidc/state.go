package oidc

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"
)

// maxStateLen bounds the state parameter read from a callback URL before any
// decoding, so a huge forged value costs nothing.
const maxStateLen = 4096

// maxFlowState bounds the caller's opaque data carried in the state.
const maxFlowState = 1024

// statePayload travels to the identity provider and back in the OAuth2
// state parameter. It is signed, not encrypted: it must hold no secrets.
type statePayload struct {
	// ID is random per flow: the name of the browser-binding cookie and the
	// single-use key.
	ID string `json:"i"`
	// Bind is the SHA-256 of the browser-binding cookie's value. The cookie
	// value itself (also the PKCE verifier) never leaves the browser and
	// the backend, so seeing a state URL is not enough to complete a flow.
	Bind  string `json:"b"`
	Nonce string `json:"n"`
	Exp   int64  `json:"e"`
	Data  []byte `json:"d,omitempty"`
}

const stateContext = "kube-bind-backend oidc state v1\n"

func signState(key []byte, p statePayload) (string, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return "", err
	}
	enc := base64.RawURLEncoding.EncodeToString(body)
	return enc + "." + base64.RawURLEncoding.EncodeToString(stateMAC(key, enc)), nil
}

func stateMAC(key []byte, enc string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(stateContext))
	m.Write([]byte(enc))
	return m.Sum(nil)
}

// parseState checks the state's signature, made with any of keys (the
// current key and those of a rotation), and its expiry, and returns its
// payload. Every key is tried, so the time taken does not tell which
// one signed.
func parseState(keys [][]byte, state string, now time.Time) (statePayload, error) {
	var p statePayload
	if state == "" || len(state) > maxStateLen {
		return p, ErrInvalidState
	}
	enc, sig, ok := strings.Cut(state, ".")
	if !ok {
		return p, ErrInvalidState
	}
	// The decoder skips \r and \n; insisting on the canonical encoding
	// keeps one state from having several accepted spellings.
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || base64.RawURLEncoding.EncodeToString(got) != sig {
		return p, ErrInvalidState
	}
	signed := false
	for _, key := range keys {
		if hmac.Equal(got, stateMAC(key, enc)) {
			signed = true
		}
	}
	if !signed {
		return p, ErrInvalidState
	}
	body, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || json.Unmarshal(body, &p) != nil || p.ID == "" || p.Bind == "" || p.Nonce == "" {
		return statePayload{}, ErrInvalidState
	}
	if now.Unix() >= p.Exp {
		return statePayload{}, ErrStateExpired
	}
	return p, nil
}

// bindingOf is what the state records of a browser-binding cookie value.
func bindingOf(cookieValue string) string {
	sum := sha256.Sum256([]byte(cookieValue))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

func bindingMatches(p statePayload, cookieValue string) bool {
	return subtle.ConstantTimeCompare([]byte(bindingOf(cookieValue)), []byte(p.Bind)) == 1
}

var errFlowStateTooLarge = errors.New("oidc: flow state larger than 1 KiB")
