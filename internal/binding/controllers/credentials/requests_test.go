package credentials_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/apirequests"
	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/credentials"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/testutil/backendcluster"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// A look at a consumer namespace reads its Secrets with one list, and the
// controller's own CredentialsValid condition and settled record wake no
// second look: a new bind costs the controller one read of Secrets and
// two writes. The next leadership term trusts the record: no read, no
// write.
func TestBindCostsOneSecretRead(t *testing.T) {
	ctx := context.Background()
	e := newCounted(t, "kbq-")
	provider, backend, provisioner, counted, counter, ctrl := e.provider, e.backend, e.binds, e.config, e.counter, e.ctrl
	stop := backendcluster.Run(t, "the credentials controller", func(ctx context.Context) error {
		kbmanager.Run(ctx, counted, kbmanager.Options{}, ctrl.Setup)
		return nil
	})

	consumer := binding.Consumer{Issuer: "https://idp.example.com", Subject: "counted"}
	if _, err := provisioner.Provision(ctx, consumer, "cluster1", []binding.Resource{{Group: "mangodb.com", Resource: "mangodbs"}}); err != nil {
		t.Fatal(err)
	}
	ns := provisioner.Namespace(consumer, "cluster1")
	dyn := dynamic.NewForConfigOrDie(provider.AdminConfig())
	poll(t, "the credentials are reported valid", 30*time.Second, func(ctx context.Context) (bool, error) {
		c := credentialsCondition(ctx, t, dyn, ns)
		return c != nil && c["status"] == "True", nil
	})
	// Room for a second look, which its own condition must not wake.
	time.Sleep(2 * time.Second)
	got := counter.Counts()
	for k, want := range map[apirequests.Key]int64{
		{Verb: "list", Resource: "secrets"}:                 1,
		{Verb: "get", Resource: "secrets"}:                  0,
		{Verb: "apply", Resource: "clusterbindings/status"}: 1,
		{Verb: "patch", Resource: "clusterbindings"}:        1,
	} {
		if got[k] != want {
			t.Errorf("%d %s %s, want %d (all: %v)", got[k], k.Verb, k.Resource, want, got)
		}
	}

	// The next term (a new leader, or this one again after a restart).
	stop()
	next := rest.CopyConfig(backend)
	nextCounter := apirequests.New("test", "the next term's requests")
	next.Wrap(nextCounter.Wrap)
	backendcluster.Run(t, "the credentials controller's next term", func(ctx context.Context) error {
		kbmanager.Run(ctx, next, kbmanager.Options{}, ctrl.Setup)
		return nil
	})
	poll(t, "the next term has synced its cache", 30*time.Second, func(context.Context) (bool, error) {
		return nextCounter.Counts()[apirequests.Key{Verb: "watch", Resource: "clusterbindings"}] > 0, nil
	})
	time.Sleep(2 * time.Second)
	got = nextCounter.Counts()
	for k, v := range got {
		ofConsumer := k.Resource != "" && k.Resource != "leases" // not discovery or leader election
		if v > 0 && ofConsumer && (k.Resource == "secrets" || (k.Verb != "list" && k.Verb != "watch")) {
			t.Errorf("the next term of a settled consumer: %d %s %s, want none (all: %v)", v, k.Verb, k.Resource, got)
		}
	}
}

// A rotation costs the list of the look that decides it and the four
// writes that carry it out (the token's Secret, the TokenRequest, the
// kubeconfig Secret, the replaced token marked retired), all on the
// controllers' own request budget; the kubeconfig Secret the look listed
// is not read again. Then the look a second later lists and reports the
// new token's expiry in the condition, and the look that change wakes
// lists and writes nothing.
func TestRotationCostsThreeListsAndFiveWrites(t *testing.T) {
	ctx := context.Background()
	e := newCounted(t, "kbw-")
	provider, binds, counted, counter, ctrl := e.provider, e.binds, e.config, e.counter, e.ctrl
	backendcluster.Run(t, "the credentials controller", func(ctx context.Context) error {
		kbmanager.Run(ctx, counted, kbmanager.Options{}, ctrl.Setup)
		return nil
	})

	consumer := binding.Consumer{Issuer: "https://idp.example.com", Subject: "rotated"}
	if _, err := binds.Provision(ctx, consumer, "cluster1", []binding.Resource{{Group: "mangodb.com", Resource: "mangodbs"}}); err != nil {
		t.Fatal(err)
	}
	ns := binds.Namespace(consumer, "cluster1")
	admin := kubernetes.NewForConfigOrDie(provider.AdminConfig())
	dyn := dynamic.NewForConfigOrDie(provider.AdminConfig())
	poll(t, "the credentials are reported valid", 30*time.Second, func(ctx context.Context) (bool, error) {
		c := credentialsCondition(ctx, t, dyn, ns)
		return c != nil && c["status"] == "True", nil
	})
	// The bind's last look writes the settled record (which wakes none).
	poll(t, "the bind's looks are over", 30*time.Second, func(context.Context) (bool, error) {
		return counter.Counts()[apirequests.Key{Verb: "patch", Resource: "clusterbindings"}] >= 1, nil
	})
	time.Sleep(time.Second)
	before := counter.Counts()

	kc, err := admin.CoreV1().Secrets(ns).Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := kc.Annotations[binding.AnnotationTokenSecret]
	rotateAt := time.Now().UTC().Truncate(time.Second).Add(time.Second) // after the token's issue, second-exact
	time.Sleep(time.Until(rotateAt))
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, credentials.AnnotationRotate, rotateAt.Format(time.RFC3339))
	if _, err := dyn.Resource(kbresources.ClusterBindings).Namespace(ns).Patch(ctx, binding.ClusterBindingName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "the controller rotated the token", 30*time.Second, func(ctx context.Context) (bool, error) {
		kc, err := admin.CoreV1().Secrets(ns).Get(ctx, binding.KubeconfigSecretName, metav1.GetOptions{})
		return err == nil && kc.Annotations[binding.AnnotationTokenSecret] != old, nil
	})
	retired, err := admin.CoreV1().Secrets(ns).Get(ctx, old, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the replaced token's Secret: %v", err)
	}
	if retired.Annotations[binding.AnnotationRetiredAt] == "" {
		t.Errorf("the replaced token's Secret %s is not marked retired: %v", old, retired.Annotations)
	}
	spentSince := func() map[apirequests.Key]int64 {
		spent := map[apirequests.Key]int64{}
		for k, v := range counter.Counts() {
			if d := v - before[k]; d != 0 && k.Resource != "leases" {
				spent[k] = d
			}
		}
		return spent
	}
	// The look a second after the rotation, then the one its condition
	// wakes (on a busy machine later than that), then room for any more.
	lists := apirequests.Key{Verb: "list", Resource: "secrets"}
	poll(t, "the looks after the rotation", 30*time.Second, func(context.Context) (bool, error) {
		return spentSince()[lists] >= 3, nil
	})
	time.Sleep(2 * time.Second)
	spent := spentSince()
	for k, want := range map[apirequests.Key]int64{
		{Verb: "list", Resource: "secrets"}:                 3,
		{Verb: "get", Resource: "secrets"}:                  0,
		{Verb: "create", Resource: "secrets"}:               1,
		{Verb: "create", Resource: "serviceaccounts/token"}: 1,
		{Verb: "apply", Resource: "secrets"}:                1,
		{Verb: "patch", Resource: "secrets"}:                1,
		{Verb: "apply", Resource: "clusterbindings/status"}: 1,
	} {
		if spent[k] != want {
			t.Errorf("a rotation: %d %s %s, want %d (all: %v)", spent[k], k.Verb, k.Resource, want, spent)
		}
	}
}

// countedEnv is a credentials controller whose requests, its rotations'
// included, are counted, and a provisioner for binds.
type countedEnv struct {
	provider *controlplane.ControlPlane
	backend  *rest.Config
	// binds provisions consumers, uncounted; config is the counted
	// configuration the controller runs with.
	binds   *binding.Provisioner
	config  *rest.Config
	counter *apirequests.Counter
	ctrl    *credentials.Controller
}

// newCounted builds it for the namespaces of ownPrefix (no other test's).
func newCounted(t *testing.T, ownPrefix string) countedEnv {
	t.Helper()
	e := countedEnv{provider: controlplane.Get(t)}
	e.backend = backendcluster.Backend(t, e.provider, backendUser, exampleapis.MangoDB)
	catalog := backendcluster.Catalog(t, e.backend, exampleapis.MangoDB)
	var err error
	e.binds, err = binding.NewProvisioner(e.backend, catalog, binding.Config{NamespacePrefix: ownPrefix, ProviderPrettyName: "Requests Test"})
	if err != nil {
		t.Fatal(err)
	}
	e.config = rest.CopyConfig(e.backend)
	e.counter = apirequests.New("test", "the controller's requests")
	e.config.Wrap(e.counter.Wrap)
	rotations, err := e.binds.WithClientsOf(e.config)
	if err != nil {
		t.Fatal(err)
	}
	e.ctrl, err = credentials.New(credentials.Config{
		Policy:          credentials.Policy{Lifetime: binding.MinTokenLifetime, RotationPoint: 0.8, Overlap: time.Minute},
		Issuer:          rotations,
		NamespacePrefix: ownPrefix,
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}
