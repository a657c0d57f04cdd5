// Package clusterkey is the backend's side of cluster-ID proofs
// (docs/protocol.md §3): from one key shared by all replicas it derives,
// without storing anything,
//
//   - the cluster ID a session gets when it presents none:
//     lowercase-base32(first 16 bytes of HMAC-SHA256(key, "kube-bind session cluster id\n" + sessionID));
//   - the cluster secret issued with it, and checked later through the
//     client's proof (package bindproof):
//     base64url-without-padding(HMAC-SHA256(key, "kube-bind cluster secret\n" + clusterID)).
//
// Deriving the new ID from the session ID lets /authorize tell, from the
// session alone, whether the session's cluster ID was issued to it (no
// proof needed) or presented by the client (a proof is needed), so no
// session store format changes. The key must be stable across restarts and
// upgrades: a new key invalidates every cluster secret issued before, and
// clients holding one get a new cluster ID (a new provider namespace) on
// their next bind.
package clusterkey

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"errors"

	"github.com/kbprovider/backend/pkg/bindproof"
)

// MinKeyLen is the shortest key New accepts (256 bits).
const MinKeyLen = 32

const (
	secretLabel    = "kube-bind cluster secret\n"
	newClusterSalt = "kube-bind session cluster id\n"
)

var lowerBase32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Key derives cluster IDs and cluster secrets. Safe for concurrent use.
type Key struct{ key []byte }

// New returns a Key; key must have at least MinKeyLen bytes.
func New(key []byte) (*Key, error) {
	if len(key) < MinKeyLen {
		return nil, errors.New("clusterkey: the key must have at least 32 bytes")
	}
	return &Key{key: append([]byte(nil), key...)}, nil
}

func (k *Key) mac(label, s string) []byte {
	m := hmac.New(sha256.New, k.key)
	m.Write([]byte(label))
	m.Write([]byte(s))
	return m.Sum(nil)
}

// NewClusterID is the cluster ID issued to session sessionID when it
// presents none: 26 characters of a-z and 2-7, the format of
// ids.NewClusterID.
func (k *Key) NewClusterID(sessionID string) string {
	return lowerBase32.EncodeToString(k.mac(newClusterSalt, sessionID)[:16])
}

// Issued reports whether clusterID is the one NewClusterID issued to
// sessionID, i.e. the session did not present it.
func (k *Key) Issued(sessionID, clusterID string) bool {
	return hmac.Equal([]byte(k.NewClusterID(sessionID)), []byte(clusterID))
}

// Secret is the cluster secret of clusterID (43 characters, 256 bits).
func (k *Key) Secret(clusterID string) string {
	return base64.RawURLEncoding.EncodeToString(k.mac(secretLabel, clusterID))
}

// Proven reports whether proof is the cluster proof of clusterID for
// sessionID: bindproof.ClusterProof(Secret(clusterID), sessionID).
func (k *Key) Proven(sessionID, clusterID, proof string) bool {
	if proof == "" {
		return false
	}
	return bindproof.VerifyClusterProof(k.Secret(clusterID), sessionID, proof)
}
