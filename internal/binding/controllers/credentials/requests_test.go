package credentials_test

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/apirequests"
	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/credentials"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/testutil/backendcluster"
)

// A look at a consumer namespace reads its Secrets with one list, and the
// controller's own CredentialsValid condition and settled record wake no
// second look: a new bind costs the controller one read of Secrets and
// two writes. The next leadership term trusts the record: no read, no
// write.
func TestBindCostsOneSecretRead(t *testing.T) {
	const ownPrefix = "kbq-" // no other test's namespaces
	ctx := context.Background()
	provider := controlplane.Get(t)
	backend := backendcluster.Backend(t, provider, backendUser, exampleapis.MangoDB)
	catalog := backendcluster.Catalog(t, backend, exampleapis.MangoDB)
	provisioner, err := binding.NewProvisioner(backend, catalog, binding.Config{NamespacePrefix: ownPrefix, ProviderPrettyName: "Requests Test"})
	if err != nil {
		t.Fatal(err)
	}
	counted := rest.CopyConfig(backend)
	counter := apirequests.New("test", "the controller's requests")
	counted.Wrap(counter.Wrap)
	ctrl, err := credentials.New(credentials.Config{
		Policy:          credentials.Policy{Lifetime: binding.MinTokenLifetime, RotationPoint: 0.8, Overlap: time.Minute},
		Issuer:          provisioner,
		NamespacePrefix: ownPrefix,
	})
	if err != nil {
		t.Fatal(err)
	}
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
