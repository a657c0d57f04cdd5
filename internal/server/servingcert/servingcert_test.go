package servingcert

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/certs"
)

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// mustNew is New for a test whose files are good.
func mustNew(t *testing.T, certFile, keyFile string, logger *slog.Logger) *Reloader {
	t.Helper()
	r, err := New(certFile, keyFile, logger)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func newLogger() (*slog.Logger, *procs.Buffer) {
	b := &procs.Buffer{}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

// serve starts a real HTTPS server on loopback with the Reloader's config.
func serve(t *testing.T, r *Reloader) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
		TLSConfig:         r.TLSConfig(),
		ReadHeaderTimeout: 5 * time.Second,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.ServeTLS(ln, "", ""); err != http.ErrServerClosed {
			t.Errorf("serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return "https://" + ln.Addr().String() + "/"
}

func trusting(pairs ...certs.Pair) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, p := range pairs {
		pool.AddCert(p.Cert)
	}
	return pool
}

// get makes one request and returns the serial of the certificate the
// server presented on the connection used and whether it was reused.
func get(t *testing.T, c *http.Client, url string) (serial string, reused bool) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
	}))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != "ok" {
		t.Fatalf("GET %s: %d %q", url, resp.StatusCode, body)
	}
	return resp.TLS.PeerCertificates[0].SerialNumber.String(), reused
}

// handshakeSerial opens a new connection and returns the presented serial.
func handshakeSerial(t *testing.T, addr string, pool *x509.CertPool) string {
	t.Helper()
	conn, err := tls.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(addr, "https://"), "/"), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func startRun(t *testing.T, r *Reloader) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func TestSymlinkSwapServesNewCertificateAndKeepsConnections(t *testing.T) {
	a, b := certs.NewServingPair(t, "a"), certs.NewServingPair(t, "b")
	vol := certs.NewSecretVolume(t, a)
	logger, logs := newLogger()
	r := mustNew(t, vol.CertFile(), vol.KeyFile(), logger)
	r.interval = time.Hour // only the file watch can pick the change up
	startRun(t, r)
	url := serve(t, r)
	pool := trusting(a, b)

	// One keep-alive connection, established before the rotation.
	kept := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 1}}
	defer kept.CloseIdleConnections()
	if serial, _ := get(t, kept, url); serial != a.Cert.SerialNumber.String() {
		t.Fatalf("before rotation: served serial %s, want a's %s", serial, a.Cert.SerialNumber)
	}

	vol.Publish(b)

	testutil.Await(t, "a new connection to present certificate b", func() bool {
		return handshakeSerial(t, url, pool) == b.Cert.SerialNumber.String()
	})
	// The existing connection carries on: same connection, old handshake.
	serial, reused := get(t, kept, url)
	if !reused {
		t.Fatal("the keep-alive connection made before the rotation was not reused: it was dropped")
	}
	if serial != a.Cert.SerialNumber.String() {
		t.Fatalf("existing connection reports serial %s, want a's %s", serial, a.Cert.SerialNumber)
	}
	// A fresh client gets the new certificate over HTTP too.
	fresh := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer fresh.CloseIdleConnections()
	if serial, _ := get(t, fresh, url); serial != b.Cert.SerialNumber.String() {
		t.Fatalf("new client: served serial %s, want b's %s", serial, b.Cert.SerialNumber)
	}
	if !strings.Contains(logs.String(), "serving certificate reloaded") {
		t.Fatalf("no reload logged; logs:\n%s", logs)
	}
	if strings.Contains(logs.String(), "PRIVATE KEY") {
		t.Fatal("key material was logged")
	}
}

func TestInPlaceRewriteIsPickedUp(t *testing.T) {
	a, b := certs.NewServingPair(t, "a"), certs.NewServingPair(t, "b")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeFile(t, certFile, a.CertPEM)
	writeFile(t, keyFile, a.KeyPEM)
	r := mustNew(t, certFile, keyFile, nil)
	r.interval = time.Hour
	startRun(t, r)
	url := serve(t, r)

	// Written one after the other, as a naive tool would: in between the
	// pair is mismatched and must not be served.
	writeFile(t, certFile, b.CertPEM)
	writeFile(t, keyFile, b.KeyPEM)
	testutil.Await(t, "certificate b to be served", func() bool {
		return handshakeSerial(t, url, trusting(a, b)) == b.Cert.SerialNumber.String()
	})
}

func TestBrokenPairKeepsServingThePreviousOne(t *testing.T) {
	a, b := certs.NewServingPair(t, "a"), certs.NewServingPair(t, "b")
	vol := certs.NewSecretVolume(t, a)
	logger, logs := newLogger()
	r := mustNew(t, vol.CertFile(), vol.KeyFile(), logger)
	r.interval = 50 * time.Millisecond // give the broken content many chances
	startRun(t, r)
	url := serve(t, r)
	pool := trusting(a, b)
	aSerial := a.Cert.SerialNumber.String()

	broken := []struct {
		name      string
		cert, key []byte
		wantLog   string
	}{
		{"certificate of b with the key of a", b.CertPEM, a.KeyPEM, "private key does not match public key"},
		{"half-written certificate", a.CertPEM[:len(a.CertPEM)/2], a.KeyPEM, "failed to find any PEM data in certificate input"},
		{"empty key", a.CertPEM, nil, "failed to find any PEM data in key input"},
	}
	for _, tc := range broken {
		t.Run(tc.name, func(t *testing.T) {
			vol.PublishPEM(tc.cert, tc.key)
			testutil.Await(t, "the failure to be logged", func() bool { return strings.Contains(logs.String(), tc.wantLog) })
			time.Sleep(150 * time.Millisecond) // several periodic checks
			if got := handshakeSerial(t, url, pool); got != aSerial {
				t.Fatalf("after publishing a %s the server presents serial %s, want a's %s", tc.name, got, aSerial)
			}
			if changed, err := r.reload(); changed || err == nil {
				t.Fatalf("reload of a %s: changed=%v err=%v, want an error and no change", tc.name, changed, err)
			}
		})
	}
	// Logged once per bad content, not on every periodic check.
	if n := strings.Count(logs.String(), "private key does not match public key"); n != 1 {
		t.Errorf("mismatch logged %d times, want 1", n)
	}

	// And a good pair afterwards is taken.
	vol.Publish(b)
	testutil.Await(t, "certificate b to be served after the broken ones", func() bool {
		return handshakeSerial(t, url, pool) == b.Cert.SerialNumber.String()
	})
}

func TestPeriodicCheckWithoutFileEvents(t *testing.T) {
	a, b := certs.NewServingPair(t, "a"), certs.NewServingPair(t, "b")
	vol := certs.NewSecretVolume(t, a)
	r := mustNew(t, vol.CertFile(), vol.KeyFile(), nil)
	r.noWatch = true
	r.interval = 50 * time.Millisecond
	startRun(t, r)

	vol.Publish(b)
	testutil.Await(t, "the periodic check to load b", func() bool {
		return r.Certificate().Leaf.SerialNumber.Cmp(b.Cert.SerialNumber) == 0
	})
}

func TestUnchangedContentIsNotReloaded(t *testing.T) {
	a := certs.NewServingPair(t, "a")
	vol := certs.NewSecretVolume(t, a)
	r := mustNew(t, vol.CertFile(), vol.KeyFile(), nil)
	before := r.Certificate()
	vol.Publish(a) // same bytes, new directory
	if changed, err := r.reload(); changed || err != nil {
		t.Fatalf("reload of identical content: changed=%v err=%v", changed, err)
	}
	if r.Certificate() != before {
		t.Fatal("identical content replaced the certificate")
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	a, b := certs.NewServingPair(t, "a"), certs.NewServingPair(t, "b")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeFile(t, certFile, a.CertPEM)
	writeFile(t, keyFile, b.KeyPEM)
	big := filepath.Join(dir, "big.crt")
	writeFile(t, big, bytes.Repeat([]byte("A"), maxFileSize+1))

	for _, tc := range []struct {
		name, cert, key, want string
	}{
		{"no files", "", "", "both a certificate file and a key file are required"},
		{"missing certificate", filepath.Join(dir, "nope.crt"), keyFile, "no such file or directory"},
		{"mismatched pair", certFile, keyFile, "private key does not match public key"},
		{"oversized file", big, keyFile, "is larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(tc.cert, tc.key, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, %v; want an error containing %q", r, err, tc.want)
			}
		})
	}
}

func TestRefusesTLSBelow12(t *testing.T) {
	a := certs.NewServingPair(t, "a")
	vol := certs.NewSecretVolume(t, a)
	r := mustNew(t, vol.CertFile(), vol.KeyFile(), nil)
	url := serve(t, r)
	addr := strings.TrimSuffix(strings.TrimPrefix(url, "https://"), "/")
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: trusting(a), MaxVersion: tls.VersionTLS11})
	if err == nil {
		conn.Close()
		t.Fatal("a TLS 1.1 handshake succeeded")
	}
	conn, err = tls.Dial("tcp", addr, &tls.Config{RootCAs: trusting(a), MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("TLS 1.2 handshake: %v", err)
	}
	conn.Close()
}
