// Package protocol holds the two values that tie a poll-flow session to the
// client that created it, computed the same way by the backend and by every
// client:
//
//   - a cluster proof: a client that was issued a cluster ID and cluster
//     secret proves it holds the secret, for one session, by adding
//     ClusterProof(clusterSecret, sessionID) as query parameter ProofParam to
//     the signed authentication URL. Bound to the session ID, a proof cannot
//     be replayed for another session.
//   - a confirmation code: a short code derived from the session ID that the
//     client prints next to the URL and the backend shows on the page where
//     the user binds, so the user can tell their own session from someone
//     else's link. It is not a secret.
package protocol

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
)

// ProofParam is the query parameter of the authentication URL that carries
// the cluster proof. Like every other query parameter it is covered by the
// session signature.
const ProofParam = "cp"

const (
	proofLabel        = "kube-bind cluster proof\n"
	confirmationLabel = "kube-bind confirmation code\n"
)

// ClusterProof returns base64url-without-padding(HMAC-SHA256(key = UTF-8
// bytes of clusterSecret, "kube-bind cluster proof\n" + sessionID)).
func ClusterProof(clusterSecret, sessionID string) string {
	return base64.RawURLEncoding.EncodeToString(proofMAC(clusterSecret, sessionID))
}

// VerifyClusterProof reports whether proof is ClusterProof(clusterSecret,
// sessionID), comparing in constant time. An empty secret never verifies.
func VerifyClusterProof(clusterSecret, sessionID, proof string) bool {
	if clusterSecret == "" {
		return false
	}
	// Strict still skips \r and \n; insisting that the proof re-encodes to
	// itself keeps one spelling per proof.
	got, err := base64.RawURLEncoding.Strict().DecodeString(proof)
	if err != nil || base64.RawURLEncoding.EncodeToString(got) != proof {
		return false
	}
	return hmac.Equal(got, proofMAC(clusterSecret, sessionID))
}

func proofMAC(clusterSecret, sessionID string) []byte {
	m := hmac.New(sha256.New, []byte(clusterSecret))
	m.Write([]byte(proofLabel))
	m.Write([]byte(sessionID))
	return m.Sum(nil)
}

// ConfirmationCode returns the session's confirmation code: the first 40
// bits of SHA-256("kube-bind confirmation code\n" + sessionID) in RFC 4648
// base32 (upper case), written as two groups of four, e.g. "K7QF-2MXA".
func ConfirmationCode(sessionID string) string {
	sum := sha256.Sum256([]byte(confirmationLabel + sessionID))
	s := base32.StdEncoding.EncodeToString(sum[:5]) // 5 bytes = 8 characters, no padding
	return s[:4] + "-" + s[4:]
}
