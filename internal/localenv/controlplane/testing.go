package controlplane

// What tests add: one control plane per test package, started on first
// use and stopped after the package's tests, and helpers that fail the
// test instead of returning an error.
//
//	func TestMain(m tb.Main) { os.Exit(controlplane.RunMain(m)) }
//
//	func TestX(t *testing.T) {
//		cp := controlplane.Get(t) // started on first use, ~3 s
//		cs := kubernetes.NewForConfigOrDie(cp.AdminConfig())
//		...
//	}
//
// Without the binaries the test fails, naming
// hack/install-test-binaries.sh (it never skips).

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/testutil/tb"
)

// KeepLogsEnv, when set, keeps the servers' logs also after tests that
// passed (they are always kept after a failure).
const KeepLogsEnv = "KUBE_BIND_TEST_KEEP_LOGS"

// Own starts a control plane of the test's own with opts (beside the
// package's shared ones), for a test that needs one apart, such as a
// competing backend's provider cluster. It is stopped when the test ends;
// its logs are kept (and their folder printed) when the test failed or
// KeepLogsEnv is set. It fails the test if it cannot start.
func Own(t tb.TB, opts Options) *ControlPlane {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cp, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("controlplane: %v", err)
	}
	t.Logf("controlplane: own one started in %v at %s (logs: %s)", cp.StartupDuration().Round(time.Millisecond), cp.Host(), cp.LogDir())
	t.Cleanup(func() {
		cp.Stop()
		if t.Failed() || os.Getenv(KeepLogsEnv) != "" {
			t.Logf("controlplane: logs of %s kept in %s", cp.Host(), cp.LogDir())
		} else {
			_ = os.RemoveAll(cp.LogDir())
		}
	})
	return cp
}

var (
	mu     sync.Mutex
	inMain bool
	shared = map[string]*sharedPlane{} // by role: "provider", "consumer"
)

// sharedPlane is one of the package's control planes, started on first use.
type sharedPlane struct {
	cp  *ControlPlane
	err error
}

// RunMain runs the package's tests (m.Run) and stops the control plane
// afterwards, if a test started one; it returns the exit code for os.Exit.
// On failure the logs of the servers are kept and their folder is printed.
// An interrupt (Ctrl-C, SIGTERM) also stops the servers; if the test binary
// dies otherwise (panic, timeout), Linux kills them (Pdeathsig).
func RunMain(m tb.Main) int {
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
func Get(t tb.TB) *ControlPlane {
	t.Helper()
	return get(t, "provider")
}

// Consumer returns a second control plane of the package, independent of
// Get's, that stands for a consumer's cluster; started on first use and
// stopped like Get's.
func Consumer(t tb.TB) *ControlPlane {
	t.Helper()
	return get(t, "consumer")
}

func get(t tb.TB, role string) *ControlPlane {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if !inMain {
		t.Fatal("controlplane.Get needs the package's TestMain to call os.Exit(controlplane.RunMain(m)), " +
			"which stops the control plane at the end")
	}
	p, ok := shared[role]
	if !ok {
		p = &sharedPlane{}
		shared[role] = p
		p.cp, p.err = Start(context.Background(), Options{})
		if p.err == nil {
			t.Logf("controlplane: %s started in %v (API server ready after %v) at %s (logs: %s)", role,
				p.cp.StartupDuration().Round(time.Millisecond), p.cp.APIServerReadyDuration().Round(time.Millisecond),
				p.cp.Host(), p.cp.LogDir())
		}
	}
	if p.err != nil {
		t.Fatalf("controlplane: %s: %v", role, p.err)
	}
	return p.cp
}

func stopShared(keepLogs bool) {
	mu.Lock()
	defer mu.Unlock()
	for role, p := range shared {
		if p.cp == nil {
			continue
		}
		p.cp.Stop()
		if keepLogs {
			fmt.Fprintf(os.Stderr, "controlplane: logs of the %s's etcd, kube-apiserver and kube-controller-manager kept in %s\n", role, p.cp.LogDir())
		} else {
			_ = os.RemoveAll(p.cp.LogDir())
		}
	}
	clear(shared)
}

// KubeconfigFile writes cfg as a kubeconfig file in t.TempDir and returns
// its path.
func KubeconfigFile(t tb.TB, cfg *rest.Config) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := WriteKubeconfig(path, cfg); err != nil {
		t.Fatalf("controlplane: %v", err)
	}
	return path
}

// ConfigForUser is cp.ConfigForUser, failing the test on an error.
func ConfigForUser(t tb.TB, cp *ControlPlane, name string, groups ...string) *rest.Config {
	t.Helper()
	cfg, err := cp.ConfigForUser(name, groups...)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
