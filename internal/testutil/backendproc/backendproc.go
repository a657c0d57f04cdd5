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
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
)

// Binary is the cmd/backend that Main built.
var Binary string

// Main builds cmd/backend into Binary, runs run (the tests, e.g.
// controlplane.RunMain(m)) and removes the build; it returns run's exit
// code, or 1 if the build failed. RunMain is the usual run.
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

// RunMain is Main with the package's tests run against its control
// planes:
//
//	func TestMain(m *testing.M) { os.Exit(backendproc.RunMain(m)) }
func RunMain(m *testing.M) int { return Main(func() int { return controlplane.RunMain(m) }) }

// Start runs Binary with args until the test ends (then SIGINT, and kill
// after 10s), and waits up to readyWithin until it is ready and every
// dependency answers (StartBinary). Without --diagnostics-address in args
// it gets one on a free loopback port. The test fails if the process
// exits or is not ready in time; its logs are shown when the test failed.
func Start(t testing.TB, base string, args []string, readyWithin time.Duration) *procs.Buffer {
	t.Helper()
	if diagnosticsAddress(args) == "" {
		args = slices.Concat(args, DiagnosticsArgs(t))
	}
	return StartBinary(t, Binary, base, args, readyWithin).Logs
}

// DiagnosticsArgs are the flags of a diagnostics listener on a free
// loopback port, for a backend of this build (earlier releases have no
// such flag).
func DiagnosticsArgs(t testing.TB) []string {
	return []string{"--diagnostics-address", fmt.Sprintf("127.0.0.1:%d", procs.FreePort(t))}
}

// diagnosticsAddress is the --diagnostics-address in args, "" if none.
func diagnosticsAddress(args []string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--diagnostics-address="); ok {
			return v
		}
		if a == "--diagnostics-address" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// Process is a backend started by StartBinary.
type Process struct {
	// Logs holds everything it wrote so far.
	Logs *procs.Buffer
	// PID is the process's id, e.g. to read /proc/<PID>/status.
	PID int
	// Diagnostics is the URL of its diagnostics listener ("" for a
	// release before it had one).
	Diagnostics string
	stop        func()
}

// Stop ends the backend (SIGINT, kill after 10s) and waits until it is
// gone; safe to call more than once, and called when the test ends.
func (p *Process) Stop() { p.stop() }

// UnsafeSkipScopeCheckEnv turns off the backend's start-up proof that an
// admission policy confines it (--unsafe-skip-admission-policy-check).
const UnsafeSkipScopeCheckEnv = "KUBE_BIND_UNSAFE_SKIP_ADMISSION_POLICY_CHECK=true"

// StartBinary is Start with another build of the backend (bin), e.g. a
// previous release, and args as they are; the Process can be stopped
// before the test ends. With --diagnostics-address in args it waits until
// the status page there says ready with every dependency answering;
// without (an earlier release), until base/readyz answers 200.
func StartBinary(t testing.TB, bin, base string, args []string, readyWithin time.Duration) *Process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	// The tests' backends run as the control plane's admin, where no
	// admission policy can confine them (test/chart runs one confined).
	// An environment variable, which earlier releases ignore, not a flag.
	cmd.Env = append(os.Environ(), UnsafeSkipScopeCheckEnv)
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
	ready := func() (bool, string, error) {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false, "", err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("%d %s", resp.StatusCode, body), nil
	}
	var diag string
	if addr := diagnosticsAddress(args); addr != "" {
		diag = "http://" + addr
		ready = func() (bool, string, error) {
			resp, err := http.Get(diag + "/statusz")
			if err != nil {
				return false, "", err
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			ok := resp.Header.Get("X-Ready") == "true" && !strings.Contains(string(body), "\n[-]") && !strings.Contains(string(body), "\n[?]")
			return ok, fmt.Sprintf("%d %s", resp.StatusCode, body), nil
		}
	}
	p := &Process{Logs: logs, PID: cmd.Process.Pid, Diagnostics: diag, stop: func() {
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
		ok, state, err := ready()
		if ok {
			return p
		}
		if err != nil {
			last = err.Error()
		} else {
			last = state
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
		"--cookie-signing-key", procs.RandomKey(32),
		"--cookie-encryption-key", procs.RandomKey(32),
		"--kubeconfig", kubeconfig,
		"--pretty-name", prettyName,
		"--namespace-prefix", namespacePrefix,
		"--consumer-scope", "Namespaced",
		"--poll-interval", "1s",
		"--log-format", "text",
	}
}

// ChartMemoryLimit is the chart's default resources.limits.memory in
// bytes: what a replica must stay under, as the chart runs it.
func ChartMemoryLimit(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(procs.RepoRoot(), "charts", "kube-bind-backend", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Resources struct {
			Limits struct {
				Memory string `json:"memory"`
			} `json:"limits"`
		} `json:"resources"`
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	q, err := resource.ParseQuantity(v.Resources.Limits.Memory)
	if err != nil || q.Value() <= 0 {
		t.Fatalf("chart memory limit %q: %v", v.Resources.Limits.Memory, err)
	}
	return q.Value()
}

// LiveHeap is the heap a backend started with --profiling holds after a
// collection (runtime.MemStats.HeapAlloc, from its /debug/pprof/heap with
// gc=1): what it keeps, without the collector's room that VmHWM adds.
func LiveHeap(t testing.TB, diagnostics string) int64 {
	t.Helper()
	resp, err := http.Get(diagnostics + "/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("heap profile: %d %v", resp.StatusCode, err)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "# HeapAlloc = "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("heap profile: HeapAlloc %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("heap profile without HeapAlloc: %.200s", body)
	return 0
}
