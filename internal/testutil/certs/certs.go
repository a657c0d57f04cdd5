// Package certs makes what tests of the backend's TLS serving need: a
// self-signed serving certificate for 127.0.0.1, and a folder laid out as
// the kubelet mounts a Secret, whose content can be renewed the way the
// kubelet does it.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Pair is a self-signed serving certificate for 127.0.0.1 and its key, PEM
// encoded. A client trusts it by adding Cert to its pool.
type Pair struct {
	CertPEM, KeyPEM []byte
	Cert            *x509.Certificate
	Key             *ecdsa.PrivateKey
}

// NewServingPair makes a P-256 certificate valid for an hour with name as
// its common name and a random serial, so tests can tell pairs apart by the
// serial a server presents. The key is PKCS #8 ("PRIVATE KEY").
func NewServingPair(t testing.TB, name string) Pair {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		Cert:    cert,
		Key:     key,
	}
}

// TLS is the pair as a server presents it and a pool of a client that
// trusts it.
func (p Pair) TLS(t testing.TB) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	cert, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.Cert)
	return cert, pool
}

// SEC1 returns the pair with its key in SEC 1 form ("EC PRIVATE KEY"), the
// other encoding an ECDSA key comes in (cert-manager's default one).
func (p Pair) SEC1(t testing.TB) Pair {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(p.Key)
	if err != nil {
		t.Fatal(err)
	}
	p.KeyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	return p
}

// SecretVolume is a folder laid out as the kubelet mounts a Secret:
// tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>/. A new version is
// published by an atomic rename of a new ..data link, after which the
// previous version's folder is removed.
type SecretVolume struct {
	t   testing.TB
	dir string
	gen int
}

// NewSecretVolume makes the folder in a temporary directory of t, holding p.
func NewSecretVolume(t testing.TB, p Pair) *SecretVolume {
	t.Helper()
	v := &SecretVolume{t: t, dir: t.TempDir()}
	v.Publish(p)
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(v.dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// Dir is the mount point, the folder holding tls.crt and tls.key.
func (v *SecretVolume) Dir() string { return v.dir }

// CertFile is the path of tls.crt.
func (v *SecretVolume) CertFile() string { return filepath.Join(v.dir, "tls.crt") }

// KeyFile is the path of tls.key.
func (v *SecretVolume) KeyFile() string { return filepath.Join(v.dir, "tls.key") }

// Publish swaps p in, as the kubelet does when the Secret changes.
func (v *SecretVolume) Publish(p Pair) { v.PublishPEM(p.CertPEM, p.KeyPEM) }

// PublishPEM swaps in any content, a broken or mismatched pair too.
func (v *SecretVolume) PublishPEM(certPEM, keyPEM []byte) {
	t := v.t
	t.Helper()
	v.gen++
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	version := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", v.gen, v.gen)
	if err := os.Mkdir(filepath.Join(v.dir, version), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(v.dir, version, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}
