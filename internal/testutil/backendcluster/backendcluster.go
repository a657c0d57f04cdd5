// Package backendcluster prepares a test's provider cluster for the
// backend's in-process parts (catalog, provisioner, controllers) the same
// way in every package: the kube-bind CRDs, the consumer ClusterRoles, the
// example APIs, and a user holding only binding.BackendClusterRole to run
// them as, so every such test also proves that the documented RBAC is
// enough.
package backendcluster

import (
	"context"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/testutil"
)

var (
	preparedMu sync.Mutex
	prepared   = map[string]bool{} // control plane host + user
)

// Backend prepares cp (once per control plane and user: the preparation
// updates the CRDs and ClusterRoles, which a second run would do again
// under running tests) with apis and returns the config of user, which
// holds only binding.BackendClusterRole.
func Backend(t testing.TB, cp *controlplane.ControlPlane, user string, apis ...exampleapis.API) *rest.Config {
	t.Helper()
	preparedMu.Lock()
	defer preparedMu.Unlock()
	key := cp.Host() + " " + user
	if !prepared[key] {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := exampleapis.Prepare(ctx, cp, apis...); err != nil {
			t.Fatalf("preparing the control plane: %v", err)
		}
		if _, err := cp.UserWithClusterRole(ctx, user, binding.BackendClusterRole); err != nil {
			t.Fatalf("preparing the control plane: %v", err)
		}
		prepared[key] = true
	}
	return controlplane.ConfigForUser(t, cp, user)
}

// Catalog runs a catalog of namespaced APIs as rc until the test ends, and
// returns it once it has synced and offers every one of offers.
func Catalog(t testing.TB, rc *rest.Config, offers ...exampleapis.API) *binding.Catalog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cat, err := binding.NewCatalog(rc, binding.ScopeNamespaced)
	if err != nil {
		t.Fatal(err)
	}
	cat.Start(ctx)
	if !cat.WaitForSync(ctx) {
		t.Fatal("catalog never synced")
	}
	for _, a := range offers {
		testutil.Await(t, "the catalog offers "+a.Name(), func() bool { _, ok := cat.Lookup(a.Group, a.Plural); return ok })
	}
	return cat
}

// Run runs a controller's run until stop is called or the test ends; stop
// cancels run's context and waits for it, failing the test if run
// returned an error or did not stop within 10 s.
func Run(t testing.TB, what string, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: Run: %v", what, err)
				}
			case <-time.After(10 * time.Second):
				var stacks strings.Builder
				_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
				t.Errorf("%s did not stop within 10s; goroutines:\n%s", what, stacks.String())
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
