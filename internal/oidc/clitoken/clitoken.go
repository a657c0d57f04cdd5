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
//	version    1 byte (2)
//	key ID     4 bytes: the first bytes of SHA-256 of the signing key
//	issued at  8 bytes: Unix seconds, big-endian
//	expiry     8 bytes: Unix seconds, big-endian
//	token ID   16 random bytes (names the token in logs)
//	issuer     8 bytes: the first bytes of SHA-256 of the OIDC issuer URL
//	subject    1 byte length n (1..255), then n bytes: the OIDC subject
//	e-mail     1 byte length (0..255), then the address if verified
//	groups     1 byte count k (0..32, or 255: not known), then k times
//	           1 byte length (1..255) and the group; 1 KiB at most in all
//
// The e-mail and groups let a bind made with the token record whom the
// allow-lists admitted (internal/binding's BoundBy), and let the bind
// judge the user by the allow-lists of the moment. Version 1 tokens end
// at the subject; they verify with no e-mail and unknown groups.
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
	version        = 2
	versionSubject = 1 // tokens of the previous release: subject only
	macLabel       = "kube-bind cli token\n"
	hkdfInfo       = "kube-bind cli token key"
	fixedLen       = 1 + 4 + 8 + 8 + 16 + 8 + 1
	maxSubject     = 255
	maxEmail       = 255
	// MaxGroups and maxGroupBytes bound the groups a token carries; a
	// user with more gets a token with unknown groups.
	MaxGroups     = 32
	maxGroupBytes = 1024
	groupsUnknown = 255
	macLen        = sha256.Size
	maxPayloadLen = fixedLen + maxSubject + 1 + maxEmail + 1 + MaxGroups + maxGroupBytes
	maxTokenLen   = len(Prefix) + (maxPayloadLen+2)/3*4 + 1 + (macLen+2)/3*4
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

// Errors of Verify. Every one but ErrUnjudged means 401 to the client.
var (
	ErrMalformed    = errors.New("not a CLI token of this backend")
	ErrUnknownKey   = errors.New("the token's key is not known")
	ErrBadSignature = errors.New("the token's signature does not match")
	ErrExpired      = errors.New("the token expired")
	ErrRevoked      = errors.New("the token was issued before --cli-tokens-not-before")
	ErrUserRevoked  = errors.New("the provider revoked this user's tokens issued before a time, this one among them")
	// ErrUnjudged wraps an error of the Revocations: the token cannot be
	// judged now (503, not 401).
	ErrUnjudged    = errors.New("the token cannot be judged now")
	ErrNotYetValid = errors.New("the token was issued in the future")
	ErrWrongIssuer = errors.New("the token is of another identity provider")
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
	// Revocations, if set, refuse one subject's tokens issued before a
	// time (revocations.Watcher); an error of theirs fails Verify with it
	// (a 503: the token cannot be judged).
	Revocations Revocations
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Revocations say before when a subject's tokens are revoked (zero:
// none).
type Revocations interface {
	NotBefore(subject string) (time.Time, error)
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
	revs       Revocations
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
	t := &Tokens{issuer: cfg.Issuer, ttl: cfg.TTL, notBefore: cfg.NotBefore, revs: cfg.Revocations, now: cfg.Now}
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
	User
	IssuedAt  time.Time
	ExpiresAt time.Time
	// ID names the token in logs (32 hex digits); not a secret.
	ID string

	version byte
	keyID   [4]byte
	tokenID [16]byte
}

// Issuer is the OIDC issuer the tokens' subjects are of.
func (t *Tokens) Issuer() string { return t.issuer }

// User is whom a token was issued to, as the identity provider said at
// the login.
type User struct {
	// Subject is the OIDC subject (of the configured issuer).
	Subject string
	// Email is the address the ID token marked verified, or empty.
	Email string
	// Groups of the ID token, when GroupsKnown.
	Groups      []string
	GroupsKnown bool
}

// carried is u as a token carries it: an address too long for the token
// is left out, and groups beyond its bounds are not known (a partial list
// would judge the user by groups that may not be what admitted them).
func (u User) carried() User {
	if len(u.Email) > maxEmail || !utf8.ValidString(u.Email) {
		u.Email = ""
	}
	n := 0
	for _, g := range u.Groups {
		n += len(g)
		if g == "" || len(g) > 255 || !utf8.ValidString(g) {
			n = maxGroupBytes + 1
		}
	}
	if !u.GroupsKnown || len(u.Groups) > MaxGroups || n > maxGroupBytes {
		u.Groups, u.GroupsKnown = nil, false
	}
	return u
}

// Issue makes a token for user u of issuer (which must be the configured
// one), valid for the configured TTL.
func (t *Tokens) Issue(issuer string, u User) (token string, c Claims, err error) {
	if issuer != t.issuer {
		return "", Claims{}, ErrWrongIssuer
	}
	if u.Subject == "" || len(u.Subject) > maxSubject || !utf8.ValidString(u.Subject) {
		return "", Claims{}, fmt.Errorf("clitoken: the subject must be 1 to %d bytes of UTF-8", maxSubject)
	}
	now := t.now().Truncate(time.Second)
	c = Claims{User: u.carried(), IssuedAt: now, ExpiresAt: now.Add(t.ttl), version: version, keyID: t.keys[0].id}
	rand.Read(c.tokenID[:])
	c.ID = hex.EncodeToString(c.tokenID[:])
	return t.encode(t.keys[0].secret, c), c, nil
}

func (t *Tokens) encode(secret []byte, c Claims) string {
	p := make([]byte, fixedLen, fixedLen+len(c.Subject))
	p[0] = c.version
	copy(p[1:5], c.keyID[:])
	binary.BigEndian.PutUint64(p[5:13], uint64(c.IssuedAt.Unix()))
	binary.BigEndian.PutUint64(p[13:21], uint64(c.ExpiresAt.Unix()))
	copy(p[21:37], c.tokenID[:])
	copy(p[37:45], t.issuerHash[:])
	p[45] = byte(len(c.Subject))
	p = append(p, c.Subject...)
	switch {
	case c.version == versionSubject:
	case !c.GroupsKnown:
		p = append(p, byte(len(c.Email)))
		p = append(p, c.Email...)
		p = append(p, groupsUnknown)
	default:
		p = append(p, byte(len(c.Email)))
		p = append(p, c.Email...)
		p = append(p, byte(len(c.Groups)))
		for _, g := range c.Groups {
			p = append(p, byte(len(g)))
			p = append(p, g...)
		}
	}
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
	if !ok || len(p) < fixedLen+1 {
		return Claims{}, ErrMalformed
	}
	u, ok := decodeUser(p)
	if !ok {
		return Claims{}, ErrMalformed
	}
	got, ok := strictDecode(sig)
	if !ok || len(got) != macLen {
		return Claims{}, ErrMalformed
	}
	c := Claims{version: p[0]}
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
	c.User = u
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
	case !utf8.ValidString(c.Subject) || !utf8.ValidString(c.Email):
		return Claims{}, ErrMalformed
	}
	for _, g := range c.Groups {
		if !utf8.ValidString(g) {
			return Claims{}, ErrMalformed
		}
	}
	if t.revs != nil {
		nb, err := t.revs.NotBefore(c.Subject)
		switch {
		case err != nil:
			return Claims{}, fmt.Errorf("%w: %w", ErrUnjudged, err)
		case c.IssuedAt.Before(nb):
			return Claims{}, ErrUserRevoked
		}
	}
	return c, nil
}

// decodeUser reads the user part of a payload of either version; every
// byte must belong to a field.
func decodeUser(p []byte) (User, bool) {
	r := reader{b: p[fixedLen-1:]}
	subject, ok := r.field()
	if !ok || subject == "" {
		return User{}, false
	}
	u := User{Subject: subject}
	switch p[0] {
	case versionSubject:
		return u, r.done()
	case version:
	default:
		return User{}, false
	}
	if u.Email, ok = r.field(); !ok {
		return User{}, false
	}
	k, ok := r.byte()
	if !ok || (k > MaxGroups && k != groupsUnknown) {
		return User{}, false
	}
	if k == groupsUnknown {
		return u, r.done()
	}
	u.GroupsKnown = true
	n := 0
	for range k {
		g, ok := r.field()
		if !ok || g == "" {
			return User{}, false
		}
		n += len(g)
		u.Groups = append(u.Groups, g)
	}
	return u, n <= maxGroupBytes && r.done()
}

// reader reads length-prefixed fields of a payload.
type reader struct{ b []byte }

func (r *reader) byte() (byte, bool) {
	if len(r.b) == 0 {
		return 0, false
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c, true
}

func (r *reader) field() (string, bool) {
	n, ok := r.byte()
	if !ok || int(n) > len(r.b) {
		return "", false
	}
	f := string(r.b[:n])
	r.b = r.b[n:]
	return f, true
}

func (r *reader) done() bool { return len(r.b) == 0 }

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
