package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil/certs"
)

// TestTLSRotation starts the built backend with TLS files, rotates them
// the way the kubelet does, and sees the new certificate on a new
// connection while a connection opened before keeps working.
func TestTLSRotation(t *testing.T) {
	bin := buildBackend(t)
	// Keys in SEC 1 form: the backend takes them as well as PKCS #8 ones.
	first, second := certs.NewServingPair(t, "first").SEC1(t), certs.NewServingPair(t, "second").SEC1(t)
	vol := certs.NewSecretVolume(t, first)

	addr := fmt.Sprintf("127.0.0.1:%d", procs.FreePort(t))
	cmd := exec.Command(bin, "--listen-address="+addr, "--diagnostics-address=127.0.0.1:0", "--log-format=text",
		"--tls-cert-file="+vol.CertFile(), "--tls-key-file="+vol.KeyFile())
	logs := startProcess(t, cmd)
	base := "https://" + addr

	// Trust exactly the two test certificates.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(first.CertPEM)
	pool.AppendCertsFromPEM(second.CertPEM)
	newClient := func(keepAlive bool) *http.Client {
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: pool},
			DisableKeepAlives: !keepAlive,
		}}
	}
	// served makes a request and returns the serial of the certificate the
	// connection presented and whether the connection was reused.
	served := func(c *http.Client, path string) (*big.Int, bool, error) {
		var reused bool
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		})
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		resp, err := c.Do(req)
		if err != nil {
			return nil, false, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return nil, false, fmt.Errorf("%s: %d %s", path, resp.StatusCode, body)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber, reused, nil
	}

	var serial *big.Int
	var err error
	kept := newClient(true)
	for deadline := time.Now().Add(20 * time.Second); ; {
		if serial, _, err = served(kept, "/healthz"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend not serving HTTPS: %v\n%s", err, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if serial.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("served serial %v, want the first certificate's %v", serial, first.Cert.SerialNumber)
	}
	// The derived external URL is https: the advertised URLs match.
	resp, err := kept.Get(base + "/export")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"`+base+`/poll"`) {
		t.Errorf("/export does not advertise %s/poll: %s", base, body)
	}

	vol.Publish(second)
	fresh := newClient(false)
	for deadline := time.Now().Add(15 * time.Second); ; {
		serial, _, err = served(fresh, "/healthz")
		if err == nil && serial.Cmp(second.Cert.SerialNumber) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("new connections still get serial %v (%v) 15s after the rotation, want %v\n%s", serial, err, second.Cert.SerialNumber, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The connection opened before the rotation was not dropped: it is
	// reused and still shows the certificate it negotiated.
	serial, reused, err := served(kept, "/healthz")
	if err != nil || !reused || serial.Cmp(first.Cert.SerialNumber) != 0 {
		t.Errorf("old connection after rotation: serial %v reused %v err %v; want the first certificate on the same connection", serial, reused, err)
	}
}

// startProcess starts cmd and stops it (SIGTERM, then kill) when the test
// ends; it returns the process's output so far at any time.
func startProcess(t *testing.T, cmd *exec.Cmd) *procs.Buffer {
	t.Helper()
	logs := &procs.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return logs
}
