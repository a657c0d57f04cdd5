// Package protocol signs and verifies requests of the poll protocol
// (docs/protocol.md §4): HMAC-SHA256 over a canonical form of scheme, host,
// method, path, query and body, keyed with the session secret.
package protocol

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/url"
	"sort"
	"strconv"
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
	return appendPayload(make([]byte, 0, len(r.Host)+len(r.Path)+160), r)
}

func appendPayload(b []byte, r Request) []byte {
	scheme := strings.ToLower(r.Scheme)
	b = append(b, scheme...)
	b = append(b, '\n')
	b = append(b, CanonicalHost(scheme, r.Host)...)
	b = append(b, '\n')
	b = append(b, strings.ToUpper(r.Method)...)
	b = append(b, '\n')
	if r.Path == "" {
		b = append(b, '/')
	} else {
		b = append(b, r.Path...)
	}
	b = append(b, '\n')
	b = appendCanonicalQuery(b, r.Query)
	b = append(b, '\n')
	sum := sha256.Sum256(r.Body)
	return hex.AppendEncode(b, sum[:])
}

// Sign returns the signature h of r under secret.
func Sign(secret string, r Request) string {
	var sum [sha256.Size]byte
	return base64.RawURLEncoding.EncodeToString(mac(sum[:0], secret, r))
}

// sigEncoding is the one spelling of a signature: base64url without
// padding, strict (the unused low bits of the last character must be
// zero), so that a MAC has exactly one accepted spelling.
var sigEncoding = base64.RawURLEncoding.Strict()

// sigLen is the length of a signature: 32 bytes in unpadded base64.
var sigLen = base64.RawURLEncoding.EncodedLen(sha256.Size)

// Verify reports whether sig is the signature of r under secret, spelled
// exactly as Sign spells it: 43 characters of base64url without padding,
// canonical. Padding ('='), the standard alphabet ('+', '/'), non-zero
// unused bits in the last character and line breaks (which decoders
// otherwise skip) are refused. The comparison takes constant time in the
// signature's content.
func Verify(secret string, r Request, sig string) bool {
	var got [sha256.Size + 3]byte // room for a decoder that overshoots
	if len(sig) != sigLen {
		return false
	}
	n, err := sigEncoding.Decode(got[:], []byte(sig))
	if err != nil || n != sha256.Size {
		return false
	}
	var want [sha256.Size]byte
	return hmac.Equal(got[:n], mac(want[:0], secret, r))
}

func mac(dst []byte, secret string, r Request) []byte {
	var buf [512]byte
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(appendPayload(buf[:0], r))
	return m.Sum(dst)
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
	return string(appendCanonicalQuery(nil, q))
}

func appendCanonicalQuery(b []byte, q url.Values) []byte {
	var keyBuf [8]string // a signed link has three or four parameters
	keys := keyBuf[:0]
	for k := range q {
		if k != ParamSignature {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	first := true
	for _, k := range keys {
		vs := q[k]
		if len(vs) > 1 && !sort.StringsAreSorted(vs) {
			vs = append([]string(nil), vs...)
			sort.Strings(vs)
		}
		for _, v := range vs {
			if !first {
				b = append(b, '&')
			}
			first = false
			b = escape(b, k)
			b = append(b, '=')
			b = escape(b, v)
		}
	}
	return b
}

const upperHex = "0123456789ABCDEF"

// escape percent-encodes every byte but RFC 3986's unreserved characters.
func escape(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unreserved(c) {
			b = append(b, c)
			continue
		}
		b = append(b, '%', upperHex[c>>4], upperHex[c&15])
	}
	return b
}

func unreserved(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// Request input is read strictly: one spelling of each value, so that what
// is checked is what is used.

// Single returns the only value of key in q, and false when it is
// missing, empty or repeated (a repeated parameter is a tampered link,
// not a choice).
func Single(q url.Values, key string) (string, bool) {
	vs := q[key]
	if len(vs) != 1 || vs[0] == "" {
		return "", false
	}
	return vs[0], true
}

// Port reads a TCP port as released CLIs write it: 1 to 65535 in ASCII
// digits, no sign, no leading zero. strconv.Atoi alone would take
// "+41234", which net/url refuses later, after the binding was made.
func Port(p string) (int, bool) {
	if p == "" || p[0] == '0' {
		return 0, false
	}
	n, err := strconv.ParseUint(p, 10, 16)
	return int(n), err == nil
}
