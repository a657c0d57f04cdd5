package clusterkey

import (
	"bytes"
	"testing"

	"github.com/kbprovider/backend/pkg/protocol"
)

func mustNew(t *testing.T, current []byte, previous ...[]byte) *Key {
	t.Helper()
	k, err := New(current, previous...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The vectors of docs/protocol.md §3, computed independently:
//
//	printf 'kube-bind session cluster id\nZr7Q2mWbX9kLp3Vt' | sha256sum | cut -c1-32 | xxd -r -p | base32 | tr A-Z a-z
//	printf 'kube-bind cluster secret\nzuxewjz2qep5ludy7lt5dld5ei' | openssl dgst -sha256 -mac HMAC -macopt hexkey:0707…07 -binary | base64 (url alphabet, no padding)
const (
	vectorSession = "Zr7Q2mWbX9kLp3Vt"
	vectorCluster = "zuxewjz2qep5ludy7lt5dld5ei"
	vectorSecret  = "5qqlBimfuoiDrpXpWP51qzGg_9XY16IZFZdJoQcwGAQ"
)

func TestVectors(t *testing.T) {
	k := mustNew(t, bytes.Repeat([]byte{7}, 32))
	const sid = vectorSession
	id := NewClusterID(sid)
	if id != vectorCluster {
		t.Fatalf("NewClusterID(%q) = %q, want %q", sid, id, vectorCluster)
	}
	if !protocol.IssuedClusterID(id) {
		t.Fatalf("new cluster ID %q is not of the issued format", id)
	}
	if id == NewClusterID(sid+"x") {
		t.Fatal("new cluster IDs are not a function of the session ID")
	}
	if got := k.Secret(id); got != vectorSecret {
		t.Fatalf("Secret(%q) = %q, want %q", id, got, vectorSecret)
	}
	if other := mustNew(t, bytes.Repeat([]byte{8}, 32)); other.Secret(id) == k.Secret(id) {
		t.Fatal("another key derives the same secret")
	}
	secret := k.Secret(id)
	if len(secret) != 43 || secret == k.Secret(id+"x") {
		t.Fatalf("secret %q", secret)
	}
	if !k.Proven(sid, id, protocol.ClusterProof(secret, sid)) {
		t.Fatal("a genuine proof is refused")
	}
	for name, proof := range map[string]string{
		"none":          "",
		"other session": protocol.ClusterProof(secret, sid+"x"),
		"other cluster": protocol.ClusterProof(k.Secret(id+"x"), sid),
		"forged":        protocol.ClusterProof("guessed", sid),
	} {
		if k.Proven(sid, id, proof) {
			t.Errorf("%s: proof accepted", name)
		}
	}
	if _, err := New(make([]byte, 31)); err == nil {
		t.Error("a 31-byte key is accepted")
	}
	if _, err := New(make([]byte, 32), make([]byte, 32), make([]byte, 31)); err == nil {
		t.Error("a 31-byte previous key is accepted")
	}
}

// A rotation: secrets are issued with the new key; proofs made with a
// secret of the old key are still proven while the old key is listed,
// and no longer once it is dropped; the new cluster ID of a session does
// not depend on the keys at all.
func TestRotation(t *testing.T) {
	oldKey, newKey := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 48)
	before := mustNew(t, oldKey)
	during := mustNew(t, newKey, oldKey)
	after := mustNew(t, newKey)

	const sid = "Qm4xT8vLz2Rk7WpN"
	id := NewClusterID(sid)
	oldSecret, newSecret := before.Secret(id), after.Secret(id)
	if oldSecret == newSecret {
		t.Fatal("both keys derive the same secret")
	}
	if during.Secret(id) != newSecret {
		t.Fatal("secrets are not issued with the current key")
	}
	oldProof, newProof := protocol.ClusterProof(oldSecret, sid), protocol.ClusterProof(newSecret, sid)
	if !during.Proven(sid, id, oldProof) || !during.Proven(sid, id, newProof) {
		t.Fatal("during the rotation a proof of either key is refused")
	}
	if before.Proven(sid, id, newProof) || after.Proven(sid, id, oldProof) {
		t.Fatal("a key proves another key's secret")
	}
	if during.Proven(sid+"x", id, oldProof) || during.Proven(sid, id+"x", oldProof) {
		t.Fatal("an old key's proof is good for another session or cluster")
	}
}
