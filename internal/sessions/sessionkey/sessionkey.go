// Package sessionkey issues session IDs and secrets that need no stored
// state: the ID carries what the session is (its flow, its expiry, the
// cluster ID its client presented) and names the key its secret is derived
// from, so that any replica, after any restart, checks any session's
// requests with nothing but the keys.
//
// A session ID is base64url without padding (strict: one spelling per ID) of
//
//	flow    (1 byte: see Flow; it also names the protocol generation)
//	key ID  (4 bytes: the first bytes of SHA-256 of the key)
//	expiry  (4 bytes: Unix seconds, big-endian)
//	random  (16 bytes)
//	cluster ID presented at creation (0 to 26 ASCII bytes)
//
// and its secret is base64url-without-padding(HMAC-SHA256(key,
// "kube-bind session secret\n" + ID)). The ID is not secret (it appears in
// the browser's address bar); whoever changes any byte of it gets an ID
// whose secret they do not know, so the expiry and the cluster ID are as
// authentic as the signatures made with the secret.
//
// Keys rotate without losing a session: the first key issues, every key
// opens. A rolling update adds the new key first, then removes the old
// one once the sessions it issued have expired.
package sessionkey

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"time"

	"github.com/kbprovider/backend/pkg/protocol"
)

// MinKeyLen is the shortest key accepted (256 bits).
const MinKeyLen = 32

// Flow says which flow a session belongs to.
type Flow byte

const (
	// FlowPoll: the client holds the secret and polls.
	FlowPoll Flow = 1
	// FlowCallback: a released CLI's callback flow; nobody outside holds
	// the secret and nothing polls.
	FlowCallback Flow = 2
	// FlowPollV1alpha2: the poll flow of a session created at
	// /api/sessions; it ends with a kube-bind.io/v1alpha2 response.
	FlowPollV1alpha2 Flow = 3
	// FlowBrowserV1alpha2: the browser flow of plain `kubectl bind`
	// (v0.6+): the response goes to the CLI's localhost callback.
	FlowBrowserV1alpha2 Flow = 4
	// FlowCLILogin: `kubectl bind login`; it ends with a CLI token, not
	// a binding.
	FlowCLILogin Flow = 5
	// FlowBrowserV2: the browser flow of a kbind v2 consumer, begun on
	// the provider's own page; its outcome, the v2 bundle, is recorded
	// and picked up once at the pickup URL the done page shows.
	FlowBrowserV2 Flow = 6
)

// Valid: a flow this backend issues.
func (f Flow) Valid() bool { return f >= FlowPoll && f <= FlowBrowserV2 }

// Recorded: the flow's outcome is recorded in the store, for a poll or a
// pickup to fetch (the other flows hand it to a CLI's callback at once).
func (f Flow) Recorded() bool { return f.Polled() || f == FlowBrowserV2 }

// Polled: the client holds the session secret and polls for the outcome,
// which is therefore recorded in the store.
func (f Flow) Polled() bool { return f == FlowPoll || f == FlowPollV1alpha2 }

// V1alpha2: the flow's responses are kube-bind.io/v1alpha2.
func (f Flow) V1alpha2() bool { return f >= FlowPollV1alpha2 && f <= FlowCLILogin }

const (
	headerLen    = 1 + 4 + 4 + 16
	maxClusterID = protocol.ClusterIDLen
	secretLabel  = "kube-bind session secret\n"
)

// MaxIDLen is the length of the longest ID Issue makes.
var MaxIDLen = base64.RawURLEncoding.EncodedLen(headerLen + maxClusterID)

var (
	// ErrMalformed: not an ID this backend issues.
	ErrMalformed = errors.New("not a session ID of this backend")
	// ErrUnknownKey: an ID of this backend's shape, from a key it no
	// longer has (rotated out after its sessions expired) or never had.
	ErrUnknownKey = errors.New("the session's key is not known")
)

type key struct {
	id     [4]byte
	secret []byte
}

// Keys issues and opens session IDs. Safe for concurrent use.
type Keys struct{ keys []key }

// New returns Keys that issue with current and open with current and every
// previous key. Each key has at least MinKeyLen bytes.
func New(current []byte, previous ...[]byte) (*Keys, error) {
	k := &Keys{}
	for _, secret := range append([][]byte{current}, previous...) {
		if len(secret) < MinKeyLen {
			return nil, errors.New("sessionkey: every key must have at least 32 bytes")
		}
		sum := sha256.Sum256(secret)
		var id [4]byte
		copy(id[:], sum[:])
		k.keys = append(k.keys, key{id: id, secret: append([]byte(nil), secret...)})
	}
	return k, nil
}

// Session is what an ID says, with its secret.
type Session struct {
	ID     string
	Flow   Flow
	Secret string
	// ExpiresAt is when the session ends (whole seconds).
	ExpiresAt time.Time
	// ClusterID is the cluster ID the client presented at creation, as
	// it was presented; "" when none was (or it was not one this backend
	// accepts, protocol.ValidClusterID).
	ClusterID string
}

// Issue makes a new session ID and its secret. A clusterID that is not
// valid (protocol.ValidClusterID) is left out.
func (k *Keys) Issue(flow Flow, clusterID string, expires time.Time) Session {
	if !protocol.ValidClusterID(clusterID) {
		clusterID = ""
	}
	b := make([]byte, headerLen, headerLen+len(clusterID))
	b[0] = byte(flow)
	copy(b[1:5], k.keys[0].id[:])
	binary.BigEndian.PutUint32(b[5:9], uint32(expires.Unix()))
	rand.Read(b[9:headerLen])
	b = append(b, clusterID...)
	id := base64.RawURLEncoding.EncodeToString(b)
	return Session{ID: id, Flow: flow, Secret: secretOf(k.keys[0].secret, id),
		ExpiresAt: time.Unix(int64(uint32(expires.Unix())), 0), ClusterID: clusterID}
}

// Open reads id and derives its secret: ErrMalformed for an ID of another
// shape, ErrUnknownKey for one issued with a key not in k. Whether the
// session has expired is the caller's to check (Session.ExpiresAt).
func (k *Keys) Open(id string) (Session, error) {
	if len(id) > MaxIDLen || len(id) < base64.RawURLEncoding.EncodedLen(headerLen) {
		return Session{}, ErrMalformed
	}
	var buf [headerLen + maxClusterID]byte
	n, err := base64.RawURLEncoding.Strict().Decode(buf[:], []byte(id))
	// The decoder skips line breaks: an ID is only its canonical spelling.
	if err != nil || n < headerLen || base64.RawURLEncoding.EncodedLen(n) != len(id) {
		return Session{}, ErrMalformed
	}
	b := buf[:n]
	flow := Flow(b[0])
	if !flow.Valid() {
		return Session{}, ErrMalformed
	}
	clusterID := string(b[headerLen:])
	if clusterID != "" && !protocol.ValidClusterID(clusterID) {
		return Session{}, ErrMalformed
	}
	for _, kk := range k.keys {
		if hmac.Equal(kk.id[:], b[1:5]) {
			return Session{ID: id, Flow: flow, Secret: secretOf(kk.secret, id),
				ExpiresAt: time.Unix(int64(binary.BigEndian.Uint32(b[5:9])), 0), ClusterID: clusterID}, nil
		}
	}
	return Session{}, ErrUnknownKey
}

func secretOf(key []byte, id string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(secretLabel))
	m.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}
