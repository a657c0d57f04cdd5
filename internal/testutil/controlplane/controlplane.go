// Package controlplane gives the tests of one package one real control
// plane (internal/localenv/controlplane: etcd, kube-apiserver,
// kube-controller-manager), started on first use and stopped at the end.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }
//
//	func TestX(t *testing.T) {
//		cp := controlplane.Get(t) // started on first use, ~3 s
//		cs := kubernetes.NewForConfigOrDie(cp.AdminConfig())
//		...
//	}
//
// Without the binaries the test fails, naming
// hack/install-test-binaries.sh (it never skips).
package controlplane

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
)

// KeepLogsEnv, when set, keeps the servers' logs also after tests that
// passed (they are always kept after a failure).
const KeepLogsEnv = "KUBE_BIND_TEST_KEEP_LOGS"

// BinariesEnv names the folder of the test binaries (see
// internal/localenv/controlplane).
const BinariesEnv = controlplane.BinariesEnv

type (
	// ControlPlane is a running control plane.
	ControlPlane = controlplane.ControlPlane
	// Options configure Start.
	Options = controlplane.Options
)

// Start starts a control plane of the test's own (beside the package's
// shared one); the caller must call Stop.
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	return controlplane.Start(ctx, opts)
}

var (
	mu       sync.Mutex
	inMain   bool
	started  bool
	shared   *ControlPlane
	startErr error
)

// RunMain runs the package's tests (m.Run) and stops the control plane
// afterwards, if a test started one; it returns the exit code for os.Exit.
// On failure the logs of the servers are kept and their folder is printed.
// An interrupt (Ctrl-C, SIGTERM) also stops the servers; if the test binary
// dies otherwise (panic, timeout), Linux kills them (Pdeathsig).
func RunMain(m *testing.M) int {
	mu.Lock()
	inMain = true
	mu.Unlock()

	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig, ok := <-sigc
		if !ok {
			return
		}
		fmt.Fprintf(os.Stderr, "controlplane: %v: stopping the control plane\n", sig)
		stopShared(true)
		os.Exit(1)
	}()

	code := m.Run()
	signal.Stop(sigc)
	close(sigc)
	stopShared(code != 0 || os.Getenv(KeepLogsEnv) != "")
	return code
}

// Get returns the package's control plane, starting it on first use. It
// fails the test if the control plane cannot start (the message says why:
// missing binaries name hack/install-test-binaries.sh) or if TestMain does
// not call RunMain.
func Get(t testing.TB) *ControlPlane {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if !inMain {
		t.Fatal("controlplane.Get needs the package's TestMain to call os.Exit(controlplane.RunMain(m)), " +
			"which stops the control plane at the end")
	}
	if !started {
		started = true
		shared, startErr = controlplane.Start(context.Background(), Options{})
		if startErr == nil {
			t.Logf("controlplane: started in %v (API server ready after %v) at %s (logs: %s)",
				shared.StartupDuration().Round(time.Millisecond), shared.APIServerReadyDuration().Round(time.Millisecond),
				shared.Host(), shared.LogDir())
		}
	}
	if startErr != nil {
		t.Fatalf("controlplane: %v", startErr)
	}
	return shared
}

func stopShared(keepLogs bool) {
	mu.Lock()
	defer mu.Unlock()
	if shared == nil {
		return
	}
	shared.Stop()
	if keepLogs {
		fmt.Fprintf(os.Stderr, "controlplane: logs of etcd, kube-apiserver and kube-controller-manager kept in %s\n", shared.LogDir())
	} else {
		_ = os.RemoveAll(shared.LogDir())
	}
	shared = nil
}

// WriteKubeconfig writes cfg as a kubeconfig file in t.TempDir and returns
// its path.
func WriteKubeconfig(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := controlplane.WriteKubeconfig(path, cfg); err != nil {
		t.Fatalf("controlplane: %v", err)
	}
	return path
}

// ConfigForUser is cp.ConfigForUser, failing the test on an error.
func ConfigForUser(t testing.TB, cp *ControlPlane, name string, groups ...string) *rest.Config {
	t.Helper()
	cfg, err := cp.ConfigForUser(name, groups...)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
