package servingcert

import (
	"bytes"
	"crypto"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kbprovider/backend/internal/testutil/certs"
)

// FuzzReload: whatever certificate and key files a rotation leaves on
// disk, a reload either serves a pair whose key matches its leaf
// certificate, exactly the new files' content, or keeps serving the
// previous pair and says why, logging a bad content once however often it
// is read. Unchanged content is not reloaded.
func FuzzReload(f *testing.F) {
	a, b := certs.NewServingPair(f, "a"), certs.NewServingPair(f, "b")
	for _, s := range [][2][]byte{
		{a.CertPEM, a.KeyPEM},
		{b.CertPEM, b.KeyPEM},
		{b.CertPEM, b.SEC1(f).KeyPEM},
		{append(bytes.Clone(b.CertPEM), a.CertPEM...), b.KeyPEM}, // a chain
		{append(bytes.Clone(b.CertPEM), b.KeyPEM...), append(bytes.Clone(b.CertPEM), b.KeyPEM...)},
		{a.CertPEM, b.KeyPEM}, // mismatched
		{b.CertPEM[:len(b.CertPEM)/2], b.KeyPEM},
		{b.KeyPEM, b.CertPEM},
		{[]byte(strings.Replace(string(b.CertPEM), "CERTIFICATE", "PUBLIC KEY", 2)), b.KeyPEM},
		{nil, nil},
	} {
		f.Add(s[0], s[1])
	}
	dir := f.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	put := func(t testing.TB, path string, content []byte) {
		t.Helper()
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	put(f, certFile, a.CertPEM)
	put(f, keyFile, a.KeyPEM)
	logger, logs := newLogger()
	r, err := New(certFile, keyFile, logger)
	if err != nil {
		f.Fatal(err)
	}
	served := [2][]byte{a.CertPEM, a.KeyPEM}
	f.Fuzz(func(t *testing.T, certPEM, keyPEM []byte) {
		before := r.Certificate()
		put(t, certFile, certPEM)
		put(t, keyFile, keyPEM)
		changed, err := r.reload()
		now := r.Certificate()
		switch {
		case err != nil:
			if changed || now != before {
				t.Fatalf("a failed reload (%v) changed the served pair", err)
			}
			// Read again: the same bad content is not logged again.
			n := strings.Count(logs.String(), "keeping the previous")
			if _, err2 := r.reload(); err2 == nil || strings.Count(logs.String(), "keeping the previous") != n {
				t.Fatalf("the same bad content: %v, logged again", err2)
			}
		case !changed:
			if now != before || !bytes.Equal(certPEM, served[0]) || !bytes.Equal(keyPEM, served[1]) {
				t.Fatal("new content was not loaded, and no error said why")
			}
		default:
			if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
				t.Fatalf("served a pair that does not load: %v", err)
			}
			if now == before || now.Leaf == nil || !bytes.Equal(now.Leaf.Raw, now.Certificate[0]) {
				t.Fatal("served pair without its leaf")
			}
			signer, ok := now.PrivateKey.(crypto.Signer)
			pub, ok2 := now.Leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
			if !ok || !ok2 || !pub.Equal(signer.Public()) {
				t.Fatal("served a key that does not match the certificate")
			}
			served = [2][]byte{bytes.Clone(certPEM), bytes.Clone(keyPEM)}
			if again, err := r.reload(); again || err != nil {
				t.Fatalf("unchanged content reloaded: %v %v", again, err)
			}
		}
	})
}
