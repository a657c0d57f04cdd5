package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/sessions"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

// storeUser is the identity the stores run as: it holds only storeRules in
// the test's namespace, so every test also proves that this RBAC is enough.
const storeUser = "kube-bind-backend-sessions"

// storeRules is the RBAC the store needs in its namespace.
var storeRules = []rbacv1.PolicyRule{{
	APIGroups: []string{""},
	Resources: []string{"secrets"},
	Verbs:     []string{"get", "list", "watch", "create", "delete", "deletecollection"},
}}

type env struct {
	cp    *controlplane.ControlPlane
	admin kubernetes.Interface
	ns    string
	user  *rest.Config // storeUser's
}

var nsSeq atomic.Int32

// newEnv makes a namespace where storeUser may do what storeRules allow.
func newEnv(t testing.TB) env {
	t.Helper()
	cp := controlplane.Get(t)
	admin := kubernetes.NewForConfigOrDie(cp.AdminConfig())
	ctx := context.Background()
	ns := fmt.Sprintf("sessions-%d-%d", time.Now().UnixNano()%1e6, nsSeq.Add(1))
	must(t, create(ctx, admin.CoreV1().Namespaces(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	must(t, create(ctx, admin.RbacV1().Roles(ns), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "sessions"}, Rules: storeRules}))
	must(t, create(ctx, admin.RbacV1().RoleBindings(ns), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "sessions"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "sessions"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: storeUser}},
	}))
	return env{cp: cp, admin: admin, ns: ns, user: controlplane.ConfigForUser(t, cp, storeUser)}
}

func create[T any](ctx context.Context, c interface {
	Create(context.Context, T, metav1.CreateOptions) (T, error)
}, obj T) error {
	_, err := c.Create(ctx, obj, metav1.CreateOptions{})
	return err
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// storeOpts tune startStore.
type storeOpts struct {
	cfg    *rest.Config // nil: the env's user
	limits sessions.Limits
	now    func() time.Time
	log    *slog.Logger
}

// startStore runs a synced store in the env's namespace until the test ends.
func (e env) startStore(t testing.TB, o storeOpts) *Store {
	t.Helper()
	cfg := o.cfg
	if cfg == nil {
		cfg = rest.CopyConfig(e.user)
	}
	s, err := New(Options{Config: cfg, Namespace: e.ns, Limits: o.limits, Logger: o.log, Now: o.now})
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	syncCtx, syncDone := context.WithTimeout(ctx, 2*time.Minute)
	defer syncDone()
	must(t, s.WaitForSync(syncCtx))
	return s
}

// counting counts the requests a client sends.
type counting struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c counting) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}
