// Package hmac signs and verifies requests of the poll protocol
// (docs/protocol.md §2): HMAC-SHA256 over a canonical form of scheme, host,
// method, path, query and body, keyed with the session secret.
package hmac

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/url"
	"sort"
	"strings"
)

// Query parameter names of a signed request.
const (
	ParamSession   = "s"
	ParamNonce     = "n"
	ParamSignature = "h"
)

// Request is what a signature covers. Query holds decoded values; the
// signature parameter h, if present, is ignored.
type Request struct {
	Scheme string
	Host   string
	Method string
	// Path is the escaped path as sent; empty means "/".
	Path  string
	Query url.Values
	Body  []byte
}

// RequestFromURL describes a request to u. Scheme, host and path are taken
// from u; the query is parsed from u.RawQuery.
func RequestFromURL(method string, u *url.URL, body []byte) (Request, error) {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return Request{}, err
	}
	return Request{Scheme: u.Scheme, Host: u.Host, Method: method, Path: u.EscapedPath(), Query: q, Body: body}, nil
}

// Payload returns the canonical bytes that are signed.
func Payload(r Request) []byte {
	var b strings.Builder
	b.Grow(len(r.Host) + len(r.Path) + 160)
	scheme := strings.ToLower(r.Scheme)
	b.WriteString(scheme)
	b.WriteByte('\n')
	b.WriteString(CanonicalHost(scheme, r.Host))
	b.WriteByte('\n')
	b.WriteString(strings.ToUpper(r.Method))
	b.WriteByte('\n')
	if r.Path == "" {
		b.WriteByte('/')
	} else {
		b.WriteString(r.Path)
	}
	b.WriteByte('\n')
	writeCanonicalQuery(&b, r.Query)
	b.WriteByte('\n')
	sum := sha256.Sum256(r.Body)
	var hexSum [sha256.Size * 2]byte
	hex.Encode(hexSum[:], sum[:])
	b.Write(hexSum[:])
	return []byte(b.String())
}

// Sign returns the signature h of r under secret.
func Sign(secret string, r Request) string {
	return base64.RawURLEncoding.EncodeToString(mac(secret, r))
}

// Verify reports whether sig is the signature of r under secret. The
// comparison takes constant time in the signature's content.
func Verify(secret string, r Request, sig string) bool {
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return false
	}
	return hmac.Equal(got, mac(secret, r))
}

func mac(secret string, r Request) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(Payload(r))
	return m.Sum(nil)
}

// SignURL adds s, a fresh nonce n and the signature h to u's query, keeping
// the parameters u already has, and returns the signed URL.
func SignURL(secret, sessionID, method string, u *url.URL, body []byte) (*url.URL, error) {
	nonce, err := NewNonce()
	if err != nil {
		return nil, err
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, err
	}
	q.Del(ParamSignature)
	q.Set(ParamSession, sessionID)
	q.Set(ParamNonce, nonce)
	signed := *u
	signed.RawQuery = CanonicalQuery(q)
	r := Request{Scheme: u.Scheme, Host: u.Host, Method: method, Path: u.EscapedPath(), Query: q, Body: body}
	signed.RawQuery += "&" + ParamSignature + "=" + Sign(secret, r)
	return &signed, nil
}

// NewNonce returns 128 random bits, base64url without padding.
func NewNonce() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// CanonicalHost lowercases host and drops the scheme's default port.
func CanonicalHost(scheme, host string) string {
	host = strings.ToLower(host)
	switch {
	case scheme == "https" && strings.HasSuffix(host, ":443"):
		return strings.TrimSuffix(host, ":443")
	case scheme == "http" && strings.HasSuffix(host, ":80"):
		return strings.TrimSuffix(host, ":80")
	}
	return host
}

// CanonicalQuery returns every parameter of q but h, sorted by key and then
// by value (byte-wise, on the decoded strings), RFC 3986-encoded and joined
// as key=value pairs with '&'.
func CanonicalQuery(q url.Values) string {
	var b strings.Builder
	writeCanonicalQuery(&b, q)
	return b.String()
}

func writeCanonicalQuery(b *strings.Builder, q url.Values) {
	keys := make([]string, 0, len(q))
	for k := range q {
		if k != ParamSignature {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	first := true
	for _, k := range keys {
		vs := q[k]
		if len(vs) > 1 {
			vs = append([]string(nil), vs...)
			sort.Strings(vs)
		}
		for _, v := range vs {
			if !first {
				b.WriteByte('&')
			}
			first = false
			escape(b, k)
			b.WriteByte('=')
			escape(b, v)
		}
	}
}

const upperHex = "0123456789ABCDEF"

// escape percent-encodes every byte but RFC 3986's unreserved characters.
func escape(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unreserved(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&15])
	}
}

func unreserved(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}
