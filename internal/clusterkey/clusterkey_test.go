package clusterkey

import (
	"bytes"
	"testing"

	"github.com/kbprovider/backend/internal/ids"
	"github.com/kbprovider/backend/pkg/bindproof"
)

func mustNew(t *testing.T, key []byte) *Key {
	t.Helper()
	k, err := New(key)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestVectors(t *testing.T) {
	k := mustNew(t, bytes.Repeat([]byte{7}, 32))
	const sid = "Zr7Q2mWbX9kLp3Vt"
	id := k.NewClusterID(sid)
	if !ids.IssuedClusterID(id) {
		t.Fatalf("new cluster ID %q is not of the issued format", id)
	}
	if id != k.NewClusterID(sid) || id == k.NewClusterID(sid+"x") {
		t.Fatal("new cluster IDs are not a function of the session ID")
	}
	if other := mustNew(t, bytes.Repeat([]byte{8}, 32)); other.NewClusterID(sid) == id || other.Secret(id) == k.Secret(id) {
		t.Fatal("another key derives the same values")
	}
	if !k.Issued(sid, id) || k.Issued(sid+"x", id) || k.Issued(sid, ids.NewClusterID()) {
		t.Fatal("Issued does not tell issued from presented IDs")
	}
	secret := k.Secret(id)
	if len(secret) != 43 || secret == k.Secret(id+"x") {
		t.Fatalf("secret %q", secret)
	}
	if !k.Proven(sid, id, bindproof.ClusterProof(secret, sid)) {
		t.Fatal("a genuine proof is refused")
	}
	for name, proof := range map[string]string{
		"none":          "",
		"other session": bindproof.ClusterProof(secret, sid+"x"),
		"other cluster": bindproof.ClusterProof(k.Secret(id+"x"), sid),
		"forged":        bindproof.ClusterProof("guessed", sid),
	} {
		if k.Proven(sid, id, proof) {
			t.Errorf("%s: proof accepted", name)
		}
	}
	if _, err := New(make([]byte, 31)); err == nil {
		t.Error("a 31-byte key is accepted")
	}
}
