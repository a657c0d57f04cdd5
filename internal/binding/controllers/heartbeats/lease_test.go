package heartbeats_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/heartbeats"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/backendcluster"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// A kbind v2 konnector's Lease, written with the binding's issued
// credentials through the chart's admission policy, is that binding's
// heartbeat: healthy while renewed, HeartbeatMissing once the tolerance
// passed; a renewTime in the future earns nothing beyond the moment the
// backend saw it; another binding's Lease never counts for it.
func TestLeaseRenewalsAreTheBindingsHeartbeat(t *testing.T) {
	cp := controlplane.Get(t)
	ctx := context.Background()
	backend := backendcluster.Backend(t, cp, backendUser, exampleapis.MangoDB)
	if err := exampleapis.InstallV2Leases(ctx, cp); err != nil {
		t.Fatal(err)
	}
	cat := backendcluster.Catalog(t, backend, exampleapis.MangoDB)
	prov, err := binding.NewProvisioner(backend, cat, binding.Config{NamespacePrefix: "kbl-", ProviderPrettyName: "Lease Test"})
	if err != nil {
		t.Fatal(err)
	}
	bind := func() (coordinationclient.LeaseInterface, string) {
		r, err := prov.Provision(ctx, binding.Consumer{Issuer: "https://idp.example.com", Subject: fmt.Sprint("lease-", time.Now().UnixNano())},
			"cluster1", []binding.Resource{exampleapis.MangoDB.Resource()})
		if err != nil {
			t.Fatal(err)
		}
		rc, ns := testutil.IssuedConfig(t, r.Kubeconfig)
		return kubernetes.NewForConfigOrDie(rc).CoordinationV1().Leases(binding.V2LeaseNamespace), ns
	}
	leasesA, nsA := bind()
	leasesB, nsB := bind()

	const tolerance = 5 * time.Second
	ctrl, err := heartbeats.New(heartbeats.Config{LeaseTolerance: tolerance})
	if err != nil {
		t.Fatal(err)
	}
	backendcluster.Run(t, "the heartbeats controller", func(ctx context.Context) error {
		kbmanager.Run(ctx, backend, kbmanager.Options{}, ctrl.Setup)
		return nil
	})
	cond := func(ns string) map[string]any {
		cb, err := dynamic.NewForConfigOrDie(cp.AdminConfig()).Resource(kbresources.ClusterBindings).Namespace(ns).Get(ctx, binding.ClusterBindingName, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return healthyCondition(cb)
	}
	healthy := func(ns string) bool { c := cond(ns); return c != nil && c["status"] == "True" }
	missing := func(ns string) bool {
		c := cond(ns)
		return c != nil && c["reason"] == heartbeats.ReasonHeartbeatMissing
	}
	testutil.Await(t, "A's binding has no heartbeat", func() bool { c := cond(nsA); return c != nil && c["reason"] == heartbeats.ReasonNoHeartbeat })

	// A's konnector makes its Lease, once the policies are in force (they
	// take effect a moment after they are made): a dry run comes back
	// stamped.
	name := "consumer-" + string(uuid.NewUUID())
	newLease := func() *coordinationv1.Lease {
		now := metav1.NowMicro()
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To(int32(60)), RenewTime: &now}}
	}
	testutil.AwaitWithin(t, time.Minute, 200*time.Millisecond, "the Lease policies to be in force", func() (bool, error) {
		l, err := leasesA.Create(ctx, newLease(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) {
			return false, nil
		}
		return err == nil && l.Labels[binding.LabelLeaseConsumer] == nsA, err
	})
	mine, err := leasesA.Create(ctx, newLease(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mine.Labels[binding.LabelLeaseConsumer] != nsA {
		t.Fatalf("A's Lease is stamped %v, want %s", mine.Labels, nsA)
	}
	// Renewed every second, as the konnector does every 30 s, until seen
	// healthy (however slow the machine), then no more.
	renew := func(at time.Time) {
		t.Helper()
		mt := metav1.NewMicroTime(at)
		mine.Spec.RenewTime = &mt
		if mine, err = leasesA.Update(ctx, mine, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.AwaitWithin(t, time.Minute, time.Second, "A's binding to turn healthy", func() (bool, error) {
		if healthy(nsA) {
			return true, nil
		}
		renew(time.Now())
		return false, nil
	})
	if c := cond(nsB); c == nil || c["status"] != "False" {
		t.Errorf("B's binding, which has no Lease: %v", c)
	}
	// Not renewed: missing once the tolerance passed.
	testutil.Await(t, "A's binding turns HeartbeatMissing", func() bool { return missing(nsA) })

	// A renewal dated an hour ahead counts from when the backend saw it:
	// missing again, since a moment after the renewal, not since the hour
	// it claims.
	before := time.Now().Add(-time.Second).UTC().Truncate(time.Second)
	renew(time.Now().Add(time.Hour))
	testutil.Await(t, "A's binding, renewed an hour ahead, turns HeartbeatMissing again", func() bool {
		c := cond(nsA)
		if c == nil || c["reason"] != heartbeats.ReasonHeartbeatMissing {
			return false
		}
		var since string
		if _, err := fmt.Sscanf(c["message"].(string), "no heartbeat since %s", &since); err != nil {
			return false
		}
		at, err := time.Parse(time.RFC3339+";", since)
		return err == nil && !at.Before(before) && at.Before(time.Now().Add(time.Minute))
	})

	// B renews a Lease of its own; A's binding stays missing.
	now := metav1.NowMicro()
	if _, err := leasesB.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "consumer-" + string(uuid.NewUUID())},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To(int32(60)), RenewTime: &now}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "B's binding turns healthy", func() bool { return healthy(nsB) })
	if !missing(nsA) {
		t.Errorf("A's binding after B's renewal: %v", cond(nsA))
	}
}
