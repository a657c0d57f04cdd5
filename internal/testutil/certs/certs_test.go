package certs

import (
	"bytes"
	"crypto/tls"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
)

func TestPairLoadsInBothKeyEncodings(t *testing.T) {
	p := NewServingPair(t, "a")
	for _, tc := range []struct {
		name, blockType string
		pair            Pair
	}{
		{"PKCS #8", "PRIVATE KEY", p},
		{"SEC 1", "EC PRIVATE KEY", p.SEC1(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if b, _ := pem.Decode(tc.pair.KeyPEM); b == nil || b.Type != tc.blockType {
				t.Fatalf("key PEM %q, want a %s block", tc.pair.KeyPEM, tc.blockType)
			}
			c, err := tls.X509KeyPair(tc.pair.CertPEM, tc.pair.KeyPEM)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(c.Certificate[0], p.Cert.Raw) {
				t.Fatal("the loaded certificate is not Cert")
			}
		})
	}
	if q := NewServingPair(t, "a"); q.Cert.SerialNumber.Cmp(p.Cert.SerialNumber) == 0 {
		t.Fatal("two pairs share a serial")
	}
	if err := p.Cert.VerifyHostname("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
}

func TestSecretVolumePublishSwapsContent(t *testing.T) {
	a, b := NewServingPair(t, "a"), NewServingPair(t, "b")
	v := NewSecretVolume(t, a)
	read := func(path string) []byte {
		t.Helper()
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if !bytes.Equal(read(v.CertFile()), a.CertPEM) || !bytes.Equal(read(v.KeyFile()), a.KeyPEM) {
		t.Fatal("the volume does not hold a")
	}
	if v.CertFile() != filepath.Join(v.Dir(), "tls.crt") || v.KeyFile() != filepath.Join(v.Dir(), "tls.key") {
		t.Fatalf("files %s and %s are not tls.crt and tls.key in %s", v.CertFile(), v.KeyFile(), v.Dir())
	}
	before, err := os.Readlink(filepath.Join(v.Dir(), "..data"))
	if err != nil {
		t.Fatal(err)
	}

	v.Publish(b)
	if !bytes.Equal(read(v.CertFile()), b.CertPEM) || !bytes.Equal(read(v.KeyFile()), b.KeyPEM) {
		t.Fatal("after Publish the volume does not hold b")
	}
	if link, err := os.Readlink(v.CertFile()); err != nil || link != filepath.Join("..data", "tls.crt") {
		t.Fatalf("tls.crt links to %q (%v), want ..data/tls.crt", link, err)
	}
	if _, err := os.Stat(filepath.Join(v.Dir(), before)); !os.IsNotExist(err) {
		t.Fatalf("the previous version %s is still there: %v", before, err)
	}

	v.PublishPEM(b.CertPEM, nil)
	if got := read(v.KeyFile()); len(got) != 0 {
		t.Fatalf("key file holds %q after publishing an empty key", got)
	}
}
