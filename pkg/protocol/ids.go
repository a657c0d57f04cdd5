// Package protocol makes and checks the random identifiers of the poll protocol:
// session IDs, session secrets and cluster IDs (docs/protocol.md §3).
//
// Formats:
//   - session ID: 128 random bits, base64url without padding (22 characters);
//     NewExpiringSessionID appends the session's expiry (27 characters), so
//     that a link to a session that is gone can be told apart as expired
//     rather than unknown (protocol §3: 410 versus 404).
//   - session secret: 256 random bits, base64url without padding (43 characters).
//   - cluster ID issued by this backend: 128 random bits in lowercase
//     base32 (26 characters of a-z and 2-7), so it can appear in Kubernetes
//     names and label values as it is.
//   - cluster ID of released kube-bind CLIs (callback flow, parameter c):
//     6 characters of base62 (0-9a-zA-Z).
//
// crypto/rand never fails on supported platforms (Go 1.24+), so the
// generators return no error.
package protocol

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/base64"
	"encoding/binary"
	"time"
)

const (
	// SessionIDLen is the length of a session ID made by NewSessionID.
	SessionIDLen = 22
	// ExpiringSessionIDLen is the length of an ID made by NewExpiringSessionID.
	ExpiringSessionIDLen = 27
	// SessionSecretLen is the length of a secret made by NewSessionSecret.
	SessionSecretLen = 43
	// ClusterIDLen is the length of a cluster ID made by NewClusterID.
	ClusterIDLen = 26
	// CLIClusterIDLen is the length of the cluster IDs released kube-bind
	// CLIs derive from their cluster.
	CLIClusterIDLen = 6
)

var lowerBase32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewSessionID returns 128 random bits, base64url without padding.
func NewSessionID() string { return randomBase64(16) }

// NewExpiringSessionID returns 128 random bits followed by expiresAt in
// whole Unix seconds (32 bits, big-endian), base64url without padding. The
// expiry is not secret and not authenticated: it only chooses the words of
// an answer about a session the store no longer knows.
func NewExpiringSessionID(expiresAt time.Time) string {
	var b [20]byte
	rand.Read(b[:16])
	binary.BigEndian.PutUint32(b[16:], uint32(expiresAt.Unix()))
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// SessionIDExpiry returns the expiry NewExpiringSessionID put into id, and
// false for an ID of another shape.
func SessionIDExpiry(id string) (time.Time, bool) {
	if len(id) != ExpiringSessionIDLen {
		return time.Time{}, false
	}
	// Strict: one spelling per ID (the last character's two spare bits
	// must be zero), so that an ID re-encodes to itself.
	var b [20]byte
	if n, err := base64.RawURLEncoding.Strict().Decode(b[:], []byte(id)); err != nil || n != len(b) {
		return time.Time{}, false
	}
	return time.Unix(int64(binary.BigEndian.Uint32(b[16:])), 0), true
}

// NewSessionSecret returns 256 random bits, base64url without padding.
func NewSessionSecret() string { return randomBase64(32) }

// NewClusterID returns a new cluster ID of this backend's format.
func NewClusterID() string {
	var b [16]byte
	rand.Read(b[:])
	return lowerBase32.EncodeToString(b[:])
}

func randomBase64(n int) string {
	var b [32]byte
	rand.Read(b[:n])
	return base64.RawURLEncoding.EncodeToString(b[:n])
}

// ValidClusterID reports whether id is a cluster ID this backend accepts:
// one it issued (IssuedClusterID) or one of a released kube-bind CLI
// (CLIClusterID). Anything else, the empty string included, is not.
func ValidClusterID(id string) bool { return IssuedClusterID(id) || CLIClusterID(id) }

// IssuedClusterID reports whether id has the format of NewClusterID.
func IssuedClusterID(id string) bool {
	if len(id) != ClusterIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || '2' <= c && c <= '7') {
			return false
		}
	}
	return true
}

// CLIClusterID reports whether id has the format of the cluster IDs that
// released kube-bind CLIs send: 6 characters of base62.
func CLIClusterID(id string) bool {
	if len(id) != CLIClusterIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !isBase62(id[i]) {
			return false
		}
	}
	return true
}

// URLSafe reports whether s is 1 to max characters of the base64url
// alphabet (A-Z a-z 0-9 - _): the shape of session IDs and nonces.
func URLSafe(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isBase62(c) && c != '-' && c != '_' {
			return false
		}
	}
	return true
}

func isBase62(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}
