// Package clusterkey is the backend's side of cluster-ID proofs
// (docs/protocol.md §3). Without storing anything it gives
//
//   - the cluster ID a session gets when it presents none, a function of
//     the session ID alone (no key):
//     lowercase-base32(first 16 bytes of SHA-256("kube-bind session cluster id\n" + sessionID));
//   - the cluster secret issued with it, derived from a key shared by all
//     replicas, and checked later through the client's proof (package
//     protocol):
//     base64url-without-padding(HMAC-SHA256(key, "kube-bind cluster secret\n" + clusterID)).
//
// Deriving the new ID from the session ID lets /authorize tell, from the
// session alone, whether the session's cluster ID was issued to it (no
// proof needed) or presented by the client (a proof is needed), so no
// session store format changes. Session IDs carry 128 random bits, so the
// new ID is as unpredictable as the session ID; a cluster ID is no secret
// anyway. Because no key enters it, a session created on a replica that
// has one key and bound on a replica that has another gets the same
// cluster ID.
//
// The key rotates: New takes the current key, which derives the secrets
// issued from now on, and previous keys, whose secrets are still proven.
// A key dropped from the list invalidates every cluster secret issued
// with it, and clients holding one get a new cluster ID (a new provider
// namespace) on their next bind; so keep a previous key as long as the
// clients it issued secrets to may come back.
package clusterkey

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"fmt"
	"slices"

	"github.com/kbprovider/backend/internal/flagvalue"
	"github.com/kbprovider/backend/pkg/protocol"
)

// KeyLengths are the key lengths New accepts (256, 384 or 512 bits);
// MinKeyLen is the shortest.
var KeyLengths = []int{MinKeyLen, 48, 64}

// MinKeyLen is the shortest key New accepts.
const MinKeyLen = 32

const (
	secretLabel    = "kube-bind cluster secret\n"
	newClusterSalt = "kube-bind session cluster id\n"
)

var lowerBase32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewClusterID is the cluster ID issued to session sessionID when it
// presents none: 26 characters of a-z and 2-7, the format of
// protocol.NewClusterID. It depends on the session ID only.
func NewClusterID(sessionID string) string {
	sum := sha256.Sum256([]byte(newClusterSalt + sessionID))
	return lowerBase32.EncodeToString(sum[:16])
}

// Key derives cluster secrets with the current key and proves them with
// the current and the previous keys. Safe for concurrent use.
type Key struct{ keys [][]byte } // keys[0] is current

// New returns a Key. current derives the secrets issued from now on;
// previous (during a rotation) still prove the secrets they issued. Every
// key has one of KeyLengths.
func New(current []byte, previous ...[]byte) (*Key, error) {
	k := &Key{}
	for i, key := range append([][]byte{current}, previous...) {
		if !slices.Contains(KeyLengths, len(key)) {
			if i == 0 {
				return nil, fmt.Errorf("clusterkey: the key has %d bytes, want %s", len(key), flagvalue.JoinInts(KeyLengths))
			}
			return nil, fmt.Errorf("clusterkey: previous key %d has %d bytes, want %s", i, len(key), flagvalue.JoinInts(KeyLengths))
		}
		k.keys = append(k.keys, append([]byte(nil), key...))
	}
	return k, nil
}

func secret(key []byte, clusterID string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(secretLabel))
	m.Write([]byte(clusterID))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Secret is the cluster secret of clusterID (43 characters, 256 bits),
// derived with the current key.
func (k *Key) Secret(clusterID string) string {
	return secret(k.keys[0], clusterID)
}

// Proven reports whether proof is the cluster proof of clusterID for
// sessionID, protocol.ClusterProof(secret, sessionID), with the secret
// of clusterID under any of the keys. Every key is tried, so the time
// taken does not tell which one matched.
func (k *Key) Proven(sessionID, clusterID, proof string) bool {
	if proof == "" {
		return false
	}
	ok := false
	for _, key := range k.keys {
		if protocol.VerifyClusterProof(secret(key, clusterID), sessionID, proof) {
			ok = true
		}
	}
	return ok
}
