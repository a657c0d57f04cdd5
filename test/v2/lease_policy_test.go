package v2

import (
	"context"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/testutil"
)

// installLeaseAccess makes on cp what the chart makes for v2 konnectors,
// with the chart's own admission policy, and waits until the policy
// refuses a Lease to a service account of no binding.
func installLeaseAccess(t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	ctx := context.Background()
	if err := exampleapis.InstallV2Leases(ctx, cp); err != nil {
		t.Fatal(err)
	}
	outsider := kubernetes.NewForConfigOrDie(serviceAccount(t, cp, "kb-lease-outsider", false)).CoordinationV1().Leases(binding.V2LeaseNamespace)
	probe := kubernetes.NewForConfigOrDie(serviceAccount(t, cp, "kb-lease-probe", true)).CoordinationV1().Leases(binding.V2LeaseNamespace)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	testutil.AwaitWithin(t, time.Minute, 200*time.Millisecond, "the Lease policies to be in force", func() (bool, error) {
		_, err := outsider.Create(ctx, lease(consumerLeaseName(), nil), dryRun)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only the konnector of a binding") {
			return false, nil
		}
		l, err := probe.Create(ctx, lease(consumerLeaseName(), nil), dryRun)
		return err == nil && l.Labels[binding.LabelLeaseConsumer] == "kb-lease-probe", nil
	})
}

// serviceAccount makes namespace ns with service account
// binding.ServiceAccountName, bound to the consumers' ClusterRole there
// when consumer (as Provision binds it), and returns a config with a
// token of it.
func serviceAccount(t *testing.T, cp *controlplane.ControlPlane, ns string, consumer bool) *rest.Config {
	t.Helper()
	ctx := context.Background()
	kube := kubernetes.NewForConfigOrDie(cp.AdminConfig())
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: binding.ServiceAccountName}}
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if consumer {
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: binding.ConsumerRoleBinding},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: binding.ConsumerClusterRole},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: binding.ServiceAccountName, Namespace: ns}},
		}
		if _, err := kube.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	tok, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, binding.ServiceAccountName,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cp.ConfigForToken(tok.Status.Token)
}

// consumerLeaseName is a Lease name as the v2 konnector makes it.
func consumerLeaseName() string { return "consumer-" + string(uuid.NewUUID()) }

// lease is a Lease in the Lease namespace as the v2 konnector writes it,
// with labels added.
func lease(name string, labels map[string]string) *coordinationv1.Lease {
	now := metav1.NowMicro()
	uid := strings.TrimPrefix(name, "consumer-")
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: binding.V2LeaseNamespace, Labels: labels,
			Annotations: map[string]string{"core.kbind.io/consumer-cluster-uid": uid}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(uid), LeaseDurationSeconds: ptr.To(int32(60)), AcquireTime: &now, RenewTime: &now},
	}
}

// The admission policy of the Lease namespace, with service accounts that
// hold exactly the rights a consumer's has: a consumer's Lease is stamped
// with its namespace, and no other consumer (nor a service account of no
// binding) can write it, take it over, delete it or make one stamped
// with another's namespace; names and sizes are bounded.
func TestLeasePolicy(t *testing.T) {
	ctx := context.Background()
	cp := controlplane.Get(t)
	installLeaseAccess(t, cp)
	leasesAs := func(cfg *rest.Config) func() coordinationclient.LeaseInterface {
		c := kubernetes.NewForConfigOrDie(cfg).CoordinationV1().Leases(binding.V2LeaseNamespace)
		return func() coordinationclient.LeaseInterface { return c }
	}
	a := leasesAs(serviceAccount(t, cp, "kb-lease-a", true))
	b := leasesAs(serviceAccount(t, cp, "kb-lease-b", true))

	// A's konnector makes its Lease without the label: it is stamped A's.
	mine, err := a().Create(ctx, lease(consumerLeaseName(), nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a consumer's first Lease: %v", err)
	}
	if got := mine.Labels[binding.LabelLeaseConsumer]; got != "kb-lease-a" {
		t.Fatalf("the Lease is stamped %q, want kb-lease-a", got)
	}
	// It renews it, as the konnector does (get, update).
	renew := func(l *coordinationv1.Lease) *coordinationv1.Lease {
		l = l.DeepCopy()
		now := metav1.NowMicro()
		l.Spec.RenewTime = &now
		return l
	}
	if mine, err = a().Update(ctx, renew(mine), metav1.UpdateOptions{}); err != nil {
		t.Fatalf("renewing its own Lease: %v", err)
	}

	refused := func(what string, err error, forbidden bool) {
		t.Helper()
		switch {
		case err == nil:
			t.Errorf("%s: admitted", what)
		case forbidden && !apierrors.IsForbidden(err):
			t.Errorf("%s: %v, want Forbidden", what, err)
		case !forbidden && !apierrors.IsInvalid(err):
			t.Errorf("%s: %v, want Invalid", what, err)
		}
	}
	// B can read it (the konnector's get before its update), not list.
	if _, err := b().Get(ctx, mine.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("another consumer's get of a Lease by name: %v", err)
	}
	_, err = b().List(ctx, metav1.ListOptions{})
	refused("another consumer lists the Leases", err, true)
	// B cannot renew it, take it over, or delete or patch it.
	_, err = b().Update(ctx, renew(mine), metav1.UpdateOptions{})
	refused("another consumer renews a Lease", err, true)
	stolen := renew(mine)
	stolen.Labels[binding.LabelLeaseConsumer] = "kb-lease-b"
	_, err = b().Update(ctx, stolen, metav1.UpdateOptions{})
	refused("another consumer restamps a Lease its own", err, true)
	refused("another consumer deletes a Lease", b().Delete(ctx, mine.Name, metav1.DeleteOptions{}), true)
	_, err = b().Patch(ctx, mine.Name, types.MergePatchType, []byte(`{"spec":{"holderIdentity":"b"}}`), metav1.PatchOptions{})
	refused("another consumer patches a Lease", err, true)
	// A cannot unstamp or restamp its own, nor delete it.
	unstamped := renew(mine)
	delete(unstamped.Labels, binding.LabelLeaseConsumer)
	_, err = a().Update(ctx, unstamped, metav1.UpdateOptions{})
	refused("a consumer removes its Lease's stamp", err, true)
	restamped := renew(mine)
	restamped.Labels[binding.LabelLeaseConsumer] = "kb-lease-b"
	_, err = a().Update(ctx, restamped, metav1.UpdateOptions{})
	refused("a consumer stamps its Lease another's", err, true)
	refused("a consumer deletes its Lease", a().Delete(ctx, mine.Name, metav1.DeleteOptions{}), true)

	// B cannot make a Lease stamped A's (nor squat A's name: it exists).
	_, err = b().Create(ctx, lease(consumerLeaseName(), map[string]string{binding.LabelLeaseConsumer: "kb-lease-a"}), metav1.CreateOptions{})
	refused("a consumer creates a Lease stamped another's", err, true)
	if _, err = b().Create(ctx, lease(mine.Name, nil), metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Errorf("another consumer creates a Lease of an existing name: %v, want AlreadyExists", err)
	}
	// Names and sizes.
	_, err = b().Create(ctx, lease("consumer-mine", nil), metav1.CreateOptions{})
	refused("a Lease not named after a UID", err, false)
	big := lease(consumerLeaseName(), nil)
	big.Annotations["x"] = strings.Repeat("x", 100000)
	_, err = b().Create(ctx, big, metav1.CreateOptions{})
	refused("a Lease with a 100 kB annotation", err, false)
	many := lease(consumerLeaseName(), nil)
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		many.Annotations[k] = k
	}
	_, err = b().Create(ctx, many, metav1.CreateOptions{})
	refused("a Lease with 6 annotations", err, false)
	held := lease(consumerLeaseName(), nil)
	held.Spec.HolderIdentity = ptr.To(strings.Repeat("h", 65))
	_, err = b().Create(ctx, held, metav1.CreateOptions{})
	refused("a Lease with a holder of 65 characters", err, false)
	final := lease(consumerLeaseName(), nil)
	final.Finalizers = []string{"example.com/keep"}
	_, err = b().Create(ctx, final, metav1.CreateOptions{})
	refused("a Lease with a finalizer", err, false)
	// What the konnector writes passes, stamped B's.
	theirs, err := b().Create(ctx, lease(consumerLeaseName(), map[string]string{"core.kbind.io/managed": "true"}), metav1.CreateOptions{})
	if err != nil || theirs.Labels[binding.LabelLeaseConsumer] != "kb-lease-b" {
		t.Errorf("another consumer's own Lease: %v, labels %v", err, theirs.GetLabels())
	}

	// A Lease an admin made is nobody's: no consumer writes it.
	admin := kubernetes.NewForConfigOrDie(cp.AdminConfig()).CoordinationV1().Leases(binding.V2LeaseNamespace)
	adm, err := admin.Create(ctx, lease(consumerLeaseName(), nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := adm.Labels[binding.LabelLeaseConsumer]; ok {
		t.Errorf("an admin's Lease is stamped: %v", adm.Labels)
	}
	_, err = a().Update(ctx, renew(adm), metav1.UpdateOptions{})
	refused("a consumer renews an admin's Lease", err, true)

	// The rest of the cluster is as before: no Lease rights elsewhere.
	other := kubernetes.NewForConfigOrDie(serviceAccount(t, cp, "kb-lease-a", true)).CoordinationV1().Leases("kube-system")
	_, err = other.Create(ctx, lease(consumerLeaseName(), nil), metav1.CreateOptions{})
	refused("a consumer creates a Lease in kube-system", err, true)
}
