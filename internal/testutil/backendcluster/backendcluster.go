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

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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
// holds only binding.BackendClusterRole and, as the chart grants it,
// binding.BackendLeasesRole in binding.V2LeaseNamespace.
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
		if err := bindLeasesRole(ctx, cp, user); err != nil {
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

// bindLeasesRole makes the Lease namespace and grants user the backend's
// Role there, as the chart does.
func bindLeasesRole(ctx context.Context, cp *controlplane.ControlPlane, user string) error {
	if err := binding.InstallV2Access(ctx, cp.AdminConfig()); err != nil {
		return err
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: binding.BackendLeasesRole + "-" + user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: binding.BackendLeasesRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	_, err := kubernetes.NewForConfigOrDie(cp.AdminConfig()).RbacV1().RoleBindings(binding.V2LeaseNamespace).Create(ctx, rb, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
