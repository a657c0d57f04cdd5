package credentials_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/credentials"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/oidc"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/backendcluster"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// thief holds every token it ever saw of one binding, and follows the
// rotations as the released konnector does: it reads the provider-side
// kubeconfig Secret with the newest token it has.
type thief struct {
	t      *testing.T
	cp     *controlplane.ControlPlane
	ns     string
	tokens [][]byte // kubeconfigs, oldest first
}

func (th *thief) client(kubeconfig []byte) kubernetes.Interface {
	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		th.t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(rc)
}

// follow reads the kubeconfig Secret with the newest token and keeps what
// it finds; it fails the test if the thief cannot.
func (th *thief) follow(ctx context.Context) {
	th.t.Helper()
	s, err := th.client(th.tokens[len(th.tokens)-1]).CoreV1().Secrets(th.ns).Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{})
	if err != nil {
		th.t.Fatalf("the thief cannot read the kubeconfig Secret: %v", err)
	}
	kc := s.Data[binding.KubeconfigSecretKey]
	if !slices.ContainsFunc(th.tokens, func(k []byte) bool { return string(k) == string(kc) }) {
		th.tokens = append(th.tokens, kc)
	}
}

// rejected waits until the API server refuses every token the thief holds
// (401), and returns how long that took.
func (th *thief) rejected(ctx context.Context, within time.Duration) time.Duration {
	th.t.Helper()
	start := time.Now()
	poll(th.t, fmt.Sprintf("all %d tokens the thief holds are rejected", len(th.tokens)), within, func(ctx context.Context) (bool, error) {
		for _, kc := range th.tokens {
			_, err := th.client(kc).CoreV1().Secrets(th.ns).Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{})
			if !apierrors.IsUnauthorized(err) {
				return false, nil
			}
		}
		return true, nil
	})
	return time.Since(start)
}

// credEnv runs the provisioner and the credentials controller on one
// clock with a binding lifetime and an allow-list the test changes; the
// controller is restarted (as the backend is, for new flags) by restart.
type credEnv struct {
	provider    *controlplane.ControlPlane
	provisioner *binding.Provisioner
	clock       *testutil.Clock
	dyn         dynamic.Interface

	mu        sync.Mutex
	allowList oidc.AllowList
	stop      func()
	start     func()
}

// The policy's shortest lifetimes; the tokens live longer (2 h), so that
// advancing the clock past the binding's lifetime leaves them valid and
// due for no rotation: only the binding's end may kill them.
const (
	testBindingLifetime = 2 * binding.MinTokenLifetime
	testTokenLifetime   = 2 * time.Hour
)

func startCredEnv(t *testing.T, allow oidc.AllowList) (context.Context, *credEnv) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &credEnv{provider: controlplane.Get(t), clock: testutil.RealClock(), allowList: allow}
	e.dyn = dynamic.NewForConfigOrDie(e.provider.AdminConfig())
	backend := backendcluster.Backend(t, e.provider, backendUser, exampleapis.MangoDB)
	catalog := backendcluster.Catalog(t, backend, exampleapis.MangoDB)
	var err error
	e.provisioner, err = binding.NewProvisioner(backend, catalog, binding.Config{
		NamespacePrefix: prefix, ProviderPrettyName: "Thief Test", TokenLifetime: testTokenLifetime, Now: e.clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.start = func() {
		e.mu.Lock()
		l := e.allowList
		e.mu.Unlock()
		ctrl, err := credentials.New(credentials.Config{
			Policy: credentials.Policy{Lifetime: binding.MinTokenLifetime, RotationPoint: 0.8, Overlap: time.Minute,
				BindingLifetime: testBindingLifetime},
			Issuer:          e.provisioner,
			NamespacePrefix: prefix,
			Allowed: func(b binding.BoundBy) bool {
				return l.AllowsRecorded(oidc.Identity{Subject: b.Subject, Email: b.Email, EmailVerified: b.Email != "", Groups: b.Groups}, b.GroupsKnown)
			},
			Now: e.clock.Now,
		})
		if err != nil {
			t.Fatal(err)
		}
		e.stop = backendcluster.Run(t, "the credentials controller", func(ctx context.Context) error {
			kbmanager.Run(ctx, backend, kbmanager.Options{}, ctrl.Setup)
			return nil
		})
	}
	e.start()
	return ctx, e
}

// restart stops the controller and starts it with allow-list l, as a
// backend restarted with new --oidc-allowed-* flags.
func (e *credEnv) restart(l oidc.AllowList) {
	e.stop()
	e.mu.Lock()
	e.allowList = l
	e.mu.Unlock()
	e.start()
}

// bind provisions consumer and returns the thief, holding a copy of the
// token of the BindingResponse.
func (e *credEnv) bind(ctx context.Context, t *testing.T, c binding.Consumer) *thief {
	t.Helper()
	resp, err := e.provisioner.Provision(ctx, c, "cluster1", []binding.Resource{{Group: "mangodb.com", Resource: "mangodbs"}})
	if err != nil {
		t.Fatal(err)
	}
	return &thief{t: t, cp: e.provider, ns: resp.Namespace, tokens: [][]byte{resp.Kubeconfig}}
}

// rotate asks for a rotation as an operator does, and waits for it.
func (e *credEnv) rotate(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	secrets := kubernetes.NewForConfigOrDie(e.provider.AdminConfig()).CoreV1().Secrets(ns)
	kc, err := secrets.Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := kc.Annotations[binding.AnnotationTokenSecret]
	issued, _ := time.Parse(time.RFC3339, kc.Annotations[binding.AnnotationIssuedAt])
	at := issued.Add(time.Second) // after the current token's issue, on the controller's clock
	e.clock.Advance(2 * time.Second)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, credentials.AnnotationRotate, at.UTC().Format(time.RFC3339))
	if _, err := e.dyn.Resource(kbresources.ClusterBindings).Namespace(ns).Patch(ctx, "cluster", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "the controller rotated the token", 30*time.Second, func(ctx context.Context) (bool, error) {
		kc, err := secrets.Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{})
		return err == nil && kc.Annotations[binding.AnnotationTokenSecret] != old, nil
	})
}

// poke writes a heartbeat, as the konnector does, which wakes the
// controller.
func (e *credEnv) poke(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	patch := fmt.Sprintf(`{"status":{"lastHeartbeatTime":%q,"heartbeatInterval":"5m"}}`, time.Now().UTC().Format(time.RFC3339))
	if _, err := e.dyn.Resource(kbresources.ClusterBindings).Namespace(ns).Patch(ctx, "cluster", types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
}

func (e *credEnv) condition(ctx context.Context, t *testing.T, ns string) map[string]any {
	t.Helper()
	return credentialsCondition(ctx, t, e.dyn, ns)
}

// TestThiefLosesAccessAfterBindingLifetime: a thief who copied the token
// of a BindingResponse follows two rotations by reading the kubeconfig
// Secret, as the released konnector does; once the binding's lifetime
// since the user's bind is over, every token it holds is rejected by the
// API server within the documented time, nothing new is issued, and the
// condition says why. A rebind by the user starts a new lifetime.
func TestThiefLosesAccessAfterBindingLifetime(t *testing.T) {
	ctx, e := startCredEnv(t, oidc.AllowList{})
	consumer := binding.Consumer{Issuer: "https://idp.example.com", Subject: "victim", Claims: &binding.Claims{GroupsKnown: true}}
	th := e.bind(ctx, t, consumer)
	for range 2 {
		e.rotate(ctx, t, th.ns)
		th.follow(ctx)
	}
	if len(th.tokens) != 3 {
		t.Fatalf("the thief holds %d tokens, want 3 (the bind's and two rotations')", len(th.tokens))
	}
	// Before the lifetime ends the thief's newest token works.
	th.follow(ctx)

	e.clock.Advance(testBindingLifetime)
	e.poke(ctx, t, th.ns)
	took := th.rejected(ctx, 30*time.Second)
	t.Logf("past the binding lifetime, all %d tokens the thief held were rejected %s after the controller was woken", len(th.tokens), took.Round(10*time.Millisecond))
	poll(t, "the condition says the binding expired", 30*time.Second, func(ctx context.Context) (bool, error) {
		c := e.condition(ctx, t, th.ns)
		return c != nil && c["status"] == "False" && c["reason"] == credentials.ReasonBindingExpired, nil
	})
	kc, err := kubernetes.NewForConfigOrDie(e.provider.AdminConfig()).CoreV1().Secrets(th.ns).Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := kc.Data[binding.KubeconfigSecretKey]; string(got) != string(th.tokens[len(th.tokens)-1]) {
		t.Errorf("after the lifetime a new token was written into the kubeconfig Secret")
	}

	// The user binds again: a new lifetime, a token the controller keeps.
	resp, err := e.provisioner.Provision(ctx, consumer, "cluster1", []binding.Resource{{Group: "mangodb.com", Resource: "mangodbs"}})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(resp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	e.poke(ctx, t, th.ns)
	poll(t, "the condition is True again after the rebind", 30*time.Second, func(ctx context.Context) (bool, error) {
		c := e.condition(ctx, t, th.ns)
		return c != nil && c["status"] == "True", nil
	})
	time.Sleep(11 * time.Second) // past the API server's token cache
	if _, err := kubernetes.NewForConfigOrDie(rc).CoreV1().Secrets(th.ns).Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{}); err != nil {
		t.Fatalf("the rebind's token: %v", err)
	}
}

// TestThiefLosesAccessWhenUserRemoved: the user who bound is taken off
// the allow-list (by subject, or their group is); once the backend runs
// with the new list, every token a thief copied and followed is rejected,
// and the condition says why. A user of another, still listed group keeps
// access.
func TestThiefLosesAccessWhenUserRemoved(t *testing.T) {
	ctx, e := startCredEnv(t, oidc.AllowList{Users: []string{"bob"}, Groups: []string{"team-a", "team-b"}})
	bob := e.bind(ctx, t, binding.Consumer{Issuer: "https://idp.example.com", Subject: "bob", Claims: &binding.Claims{GroupsKnown: true}})
	carol := e.bind(ctx, t, binding.Consumer{Issuer: "https://idp.example.com", Subject: "carol", Claims: &binding.Claims{Groups: []string{"team-a"}, GroupsKnown: true}})
	dave := e.bind(ctx, t, binding.Consumer{Issuer: "https://idp.example.com", Subject: "dave", Claims: &binding.Claims{Groups: []string{"team-b"}, GroupsKnown: true}})
	for _, th := range []*thief{bob, carol, dave} {
		e.rotate(ctx, t, th.ns)
		th.follow(ctx)
	}

	e.restart(oidc.AllowList{Groups: []string{"team-b"}})
	for _, th := range []*thief{bob, carol} {
		took := th.rejected(ctx, 30*time.Second)
		t.Logf("%s: all %d tokens rejected %s after the restart with the new allow-list", th.ns, len(th.tokens), took.Round(10*time.Millisecond))
		poll(t, "the condition says the user is not allowed", 30*time.Second, func(ctx context.Context) (bool, error) {
			c := e.condition(ctx, t, th.ns)
			return c != nil && c["status"] == "False" && c["reason"] == credentials.ReasonUserNotAllowed, nil
		})
	}
	dave.follow(ctx) // still allowed: still works
}
