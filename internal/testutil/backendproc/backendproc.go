// Package backendproc runs cmd/backend as a separate process in tests:
// Main builds it once in a test binary's TestMain, Start runs it for one
// test and waits until it is ready.
package backendproc

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil/oidcprovider"
	"github.com/kbprovider/backend/internal/testutil/procs"
)

// Binary is the cmd/backend that Main built.
var Binary string

// Main builds cmd/backend into Binary, runs run (the tests, e.g.
// controlplane.RunMain(m)) and removes the build; it returns run's exit
// code, or 1 if the build failed. Use it as
//
//	func TestMain(m *testing.M) { os.Exit(backendproc.Main(func() int { return controlplane.RunMain(m) })) }
func Main(run func() int) int {
	bin, cleanup, err := procs.Build("./cmd/backend")
	if err != nil {
		fmt.Fprintln(os.Stderr, "building the backend:", err)
		return 1
	}
	defer cleanup()
	Binary = bin
	return run()
}

// Start runs Binary with args until the test ends (then SIGINT, and kill
// after 10s), and waits up to readyWithin until base/readyz answers 200:
// every dependency is there. The test fails if the process exits or is
// not ready in time; its logs are shown when the test failed.
func Start(t testing.TB, base string, args []string, readyWithin time.Duration) *procs.Buffer {
	t.Helper()
	return StartBinary(t, Binary, base, args, readyWithin).Logs
}

// Process is a backend started by StartBinary.
type Process struct {
	// Logs holds everything it wrote so far.
	Logs *procs.Buffer
	stop func()
}

// Stop ends the backend (SIGINT, kill after 10s) and waits until it is
// gone; safe to call more than once, and called when the test ends.
func (p *Process) Stop() { p.stop() }

// StartBinary is Start with another build of the backend (bin), e.g. a
// previous release; the Process can be stopped before the test ends.
func StartBinary(t testing.TB, bin, base string, args []string, readyWithin time.Duration) *Process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	logs := &procs.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the backend: %v", err)
	}
	// exited is closed when the process is gone; waitErr says how it ended.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	var once sync.Once
	p := &Process{Logs: logs, stop: func() {
		once.Do(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		})
	}}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("backend %s logs:\n%s", bin, logs.String())
		}
	})
	deadline := time.Now().Add(readyWithin)
	var last string
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		select {
		case <-exited:
			t.Fatalf("backend exited: %v\nlogs:\n%s", waitErr, logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend not ready after %s: %s\nlogs:\n%s", readyWithin, last, logs.String())
		}
	}
}

// BrowserArgs are the flags of a backend at 127.0.0.1:port (base is its
// URL) that logs users in at idp (members of group "binders" may bind),
// provisions into the cluster of kubeconfig with namespacePrefix and
// offers namespaced APIs, polled every second, logging text: what the
// end-to-end suites that drive the browser part share. Append more.
func BrowserArgs(t testing.TB, port int, base string, idp *oidcprovider.Provider, kubeconfig, prettyName, namespacePrefix string) []string {
	t.Helper()
	return []string{
		"--listen-address", fmt.Sprintf("127.0.0.1:%d", port),
		"--external-url", base,
		"--oidc-issuer-url", idp.IssuerURL,
		"--oidc-issuer-client-id", idp.ClientID,
		"--oidc-issuer-client-secret", idp.ClientSecret,
		"--oidc-allowed-groups", "binders",
		"--cookie-signing-key", procs.RandomKey(t, 32),
		"--cookie-encryption-key", procs.RandomKey(t, 32),
		"--kubeconfig", kubeconfig,
		"--pretty-name", prettyName,
		"--namespace-prefix", namespacePrefix,
		"--consumer-scope", "Namespaced",
		"--poll-interval", "1s",
		"--log-format", "text",
	}
}
