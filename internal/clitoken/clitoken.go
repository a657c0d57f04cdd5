// Package clitoken issues and verifies the bearer tokens that
// `kubectl bind login` (kubectl-bind v0.6+) stores and sends on every
// /api/* call (docs/v1alpha2.md §2.3).
//
// A token is
//
//	kbt1.<payload>.<mac>
//
// with both parts base64url without padding (one spelling each: the
// decoding is strict) and mac = HMAC-SHA256(key, "kube-bind cli token\n"
// || payload). The payload is, in this order:
//
//	version    1 byte (1)
//	key ID     4 bytes: the first bytes of SHA-256 of the signing key
//	issued at  8 bytes: Unix seconds, big-endian
//	expiry     8 bytes: Unix seconds, big-endian
//	token ID   16 random bytes (names the token in logs)
//	issuer     8 bytes: the first bytes of SHA-256 of the OIDC issuer URL
//	subject    1 byte length n (1..255), then n bytes: the OIDC subject
//
// Tokens are signed, not encrypted: whoever holds one holds the
// credential anyway. The signing keys are derived with HKDF-SHA256 from
// the session keys (info "kube-bind cli token key"), which every replica
// has across restarts; the first key signs, every key verifies, so a key
// rotation keeps the tokens of the old key until it is removed.
package clitoken

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Prefix starts every token.
const Prefix = "kbt1."

const (
	version     = 1
	macLabel    = "kube-bind cli token\n"
	hkdfInfo    = "kube-bind cli token key"
	fixedLen    = 1 + 4 + 8 + 8 + 16 + 8 + 1
	maxSubject  = 255
	macLen      = sha256.Size
	maxTokenLen = len(Prefix) + (fixedLen+maxSubject+2)/3*4 + 1 + (macLen+2)/3*4
	// clockSkew is how far in the future an issue time may lie (replicas'
	// clocks differ a little).
	clockSkew = 5 * time.Minute
)

// Lifetime bounds (--cli-token-ttl).
const (
	DefaultTTL = 8 * time.Hour
	MinTTL     = 15 * time.Minute
	MaxTTL     = 24 * time.Hour
)

// Errors of Verify. Every one means 401 to the client.
var (
	ErrMalformed    = errors.New("not a CLI token of this backend")
	ErrUnknownKey   = errors.New("the token's key is not known")
	ErrBadSignature = errors.New("the token's signature does not match")
	ErrExpired      = errors.New("the token expired")
	ErrRevoked      = errors.New("the token was issued before --cli-tokens-not-before")
	ErrNotYetValid  = errors.New("the token was issued in the future")
	ErrWrongIssuer  = errors.New("the token is of another identity provider")
)

// Config configures Tokens.
type Config struct {
	// SessionKeys are the session keys, the current one first (at least
	// one, each at least 32 bytes); the token keys are derived from them.
	SessionKeys [][]byte
	// Issuer is the configured OIDC issuer URL; a token names it (hashed)
	// and is accepted only under the same one.
	Issuer string
	// TTL is the life of an issued token (default DefaultTTL; MinTTL to
	// MaxTTL).
	TTL time.Duration
	// NotBefore: tokens issued before it are refused (zero: none).
	NotBefore time.Time
	// Now is the clock (default time.Now).
	Now func() time.Time
}

type key struct {
	id     [4]byte
	secret []byte
}

// Tokens issues and verifies tokens. Safe for concurrent use.
type Tokens struct {
	keys       []key
	issuer     string
	issuerHash [8]byte
	ttl        time.Duration
	notBefore  time.Time
	now        func() time.Time
}

// New checks cfg and derives the keys.
func New(cfg Config) (*Tokens, error) {
	if len(cfg.SessionKeys) == 0 {
		return nil, errors.New("clitoken: at least one session key is required")
	}
	if cfg.Issuer == "" {
		return nil, errors.New("clitoken: the OIDC issuer is required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if err := ValidateTTL(cfg.TTL); err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	t := &Tokens{issuer: cfg.Issuer, ttl: cfg.TTL, notBefore: cfg.NotBefore, now: cfg.Now}
	sum := sha256.Sum256([]byte(cfg.Issuer))
	copy(t.issuerHash[:], sum[:])
	for i, sk := range cfg.SessionKeys {
		if len(sk) < 32 {
			return nil, fmt.Errorf("clitoken: session key %d has fewer than 32 bytes", i+1)
		}
		k, err := hkdf.Key(sha256.New, sk, nil, hkdfInfo, 32)
		if err != nil {
			return nil, err
		}
		s := sha256.Sum256(k)
		var id [4]byte
		copy(id[:], s[:])
		t.keys = append(t.keys, key{id: id, secret: k})
	}
	return t, nil
}

// ValidateTTL checks a token lifetime (--cli-token-ttl).
func ValidateTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return fmt.Errorf("the CLI token lifetime %s must be from %s to %s", ttl, MinTTL, MaxTTL)
	}
	return nil
}

// TTL is the life of the tokens Issue makes.
func (t *Tokens) TTL() time.Duration { return t.ttl }

// Claims are what a verified token says.
type Claims struct {
	// Subject is the OIDC subject the token was issued to (of the
	// configured issuer).
	Subject   string
	IssuedAt  time.Time
	ExpiresAt time.Time
	// ID names the token in logs (32 hex digits); not a secret.
	ID string

	keyID   [4]byte
	tokenID [16]byte
}

// Issuer is the OIDC issuer the tokens' subjects are of.
func (t *Tokens) Issuer() string { return t.issuer }

// Issue makes a token for subject of issuer (which must be the
// configured one), valid for the configured TTL.
func (t *Tokens) Issue(issuer, subject string) (token string, c Claims, err error) {
	if issuer != t.issuer {
		return "", Claims{}, ErrWrongIssuer
	}
	if subject == "" || len(subject) > maxSubject || !utf8.ValidString(subject) {
		return "", Claims{}, fmt.Errorf("clitoken: the subject must be 1 to %d bytes of UTF-8", maxSubject)
	}
	now := t.now().Truncate(time.Second)
	c = Claims{Subject: subject, IssuedAt: now, ExpiresAt: now.Add(t.ttl), keyID: t.keys[0].id}
	rand.Read(c.tokenID[:])
	c.ID = hex.EncodeToString(c.tokenID[:])
	return t.encode(t.keys[0].secret, c), c, nil
}

func (t *Tokens) encode(secret []byte, c Claims) string {
	p := make([]byte, fixedLen, fixedLen+len(c.Subject))
	p[0] = version
	copy(p[1:5], c.keyID[:])
	binary.BigEndian.PutUint64(p[5:13], uint64(c.IssuedAt.Unix()))
	binary.BigEndian.PutUint64(p[13:21], uint64(c.ExpiresAt.Unix()))
	copy(p[21:37], c.tokenID[:])
	copy(p[37:45], t.issuerHash[:])
	p[45] = byte(len(c.Subject))
	p = append(p, c.Subject...)
	payload := base64.RawURLEncoding.EncodeToString(p)
	return Prefix + payload + "." + base64.RawURLEncoding.EncodeToString(mac(secret, payload))
}

// mac is over the payload as it is spelled in the token (its only
// spelling).
func mac(secret []byte, payload string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(macLabel))
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// Verify checks a token: its shape, its key, its MAC (in constant time),
// then its times and issuer. It returns the claims or one of the errors
// above.
func (t *Tokens) Verify(token string) (Claims, error) {
	if len(token) > maxTokenLen || !strings.HasPrefix(token, Prefix) {
		return Claims{}, ErrMalformed
	}
	payload, sig, ok := strings.Cut(token[len(Prefix):], ".")
	if !ok {
		return Claims{}, ErrMalformed
	}
	p, ok := strictDecode(payload)
	if !ok || len(p) < fixedLen+1 || p[0] != version || int(p[45]) != len(p)-fixedLen {
		return Claims{}, ErrMalformed
	}
	got, ok := strictDecode(sig)
	if !ok || len(got) != macLen {
		return Claims{}, ErrMalformed
	}
	var c Claims
	copy(c.keyID[:], p[1:5])
	var secret []byte
	for _, k := range t.keys {
		if k.id == c.keyID {
			secret = k.secret
			break
		}
	}
	if secret == nil {
		return Claims{}, ErrUnknownKey
	}
	if !hmac.Equal(mac(secret, payload), got) {
		return Claims{}, ErrBadSignature
	}
	iat, exp := binary.BigEndian.Uint64(p[5:13]), binary.BigEndian.Uint64(p[13:21])
	if iat > 1<<40 || exp > 1<<40 || exp <= iat {
		// Only a key holder makes a token, so this is a bug, not an attack.
		return Claims{}, ErrMalformed
	}
	c.IssuedAt, c.ExpiresAt = time.Unix(int64(iat), 0), time.Unix(int64(exp), 0)
	copy(c.tokenID[:], p[21:37])
	c.ID = hex.EncodeToString(c.tokenID[:])
	c.Subject = string(p[fixedLen:])
	now := t.now()
	switch {
	case !hmac.Equal(p[37:45], t.issuerHash[:]):
		return Claims{}, ErrWrongIssuer
	case !now.Before(c.ExpiresAt):
		return Claims{}, ErrExpired
	case c.IssuedAt.After(now.Add(clockSkew)):
		return Claims{}, ErrNotYetValid
	case !t.notBefore.IsZero() && c.IssuedAt.Before(t.notBefore):
		return Claims{}, ErrRevoked
	case !utf8.ValidString(c.Subject):
		return Claims{}, ErrMalformed
	}
	return c, nil
}

// strictDecode decodes base64url without padding in its one canonical
// spelling (no padding, no line breaks, zero unused bits).
func strictDecode(s string) ([]byte, bool) {
	if s == "" || strings.ContainsAny(s, "\r\n") {
		return nil, false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, false
	}
	return b, true
}
