package v2

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/heartbeats"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
	"github.com/kbprovider/backend/internal/testutil/chromium"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// leaseTolerance is the backend's --heartbeat-lease-tolerance here: more
// than the konnector's 30 s between renewals, less than the default 2m30s.
const leaseTolerance = 50 * time.Second

// v2Bind binds alice in the browser from /v2/bind, picking apis, and
// returns the bundle the pickup URL gives as a v1/List.
func v2Bind(t *testing.T, base string, apis ...string) []byte {
	t.Helper()
	b := chromium.OpenBindPage(t, base+"/v2/bind", base+"/bind", oidcprovider.Alice)
	chromium.PressBind(t, b, apis...)
	m := curlCommand.FindStringSubmatch(strings.TrimSpace(b.Text("#pickup-command")))
	if m == nil {
		t.Fatalf("the done page shows no pickup command:\n%s", b.Text("body"))
	}
	status, _, bundle := post(t, http.MethodPost, m[1]+"&format=json")
	if status != http.StatusOK {
		t.Fatalf("pickup: %d\n%s", status, bundle)
	}
	return bundle
}

// bundleCredentials returns the issued kubeconfig in a bundle.
func bundleCredentials(t *testing.T, bundle []byte) []byte {
	t.Helper()
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(bundle, &list); err != nil {
		t.Fatal(err)
	}
	for _, raw := range list.Items {
		var s corev1.Secret
		if err := json.Unmarshal(raw, &s); err == nil && s.Kind == "Secret" {
			return s.Data["kubeconfig"]
		}
	}
	t.Fatalf("no Secret in the bundle:\n%s", bundle)
	return nil
}

// healthOf returns the Healthy condition of the ClusterBinding in ns.
func healthOf(ctx context.Context, provider *controlplane.ControlPlane, ns string) map[string]any {
	cb, err := dynamic.NewForConfigOrDie(provider.AdminConfig()).Resource(kbresources.ClusterBindings).Namespace(ns).
		Get(ctx, binding.ClusterBindingName, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	list, _, _ := unstructured.NestedSlice(cb.Object, "status", "conditions")
	for _, c := range list {
		if m, ok := c.(map[string]any); ok && m["type"] == heartbeats.ConditionHealthy {
			return m
		}
	}
	return nil
}

// The released v2 konnector, as a process against the bundle the backend
// issued, keeps its Lease on the provider, stamped with its binding's
// namespace, and that binding turns healthy; a v0.8.2 consumer (released
// CLI and konnector) bound to the same provider at the same time is
// healthy too, and neither may read the other's namespace. Another v2
// consumer's credentials cannot renew, take over or delete that Lease,
// nor make one stamped as the first's. Once the konnector stops, the
// binding turns HeartbeatMissing after the tolerance.
func TestV2KonnectorLeaseMakesItsBindingHealthy(t *testing.T) {
	ctx := context.Background()
	provider := controlplane.Get(t)
	if err := exampleapis.Prepare(ctx, provider, exampleapis.MangoDB, exampleapis.Redis); err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"metadata":{"labels":{"` + binding.ExportedLabelV2 + `":"true"}}}`)
	crds := dynamic.NewForConfigOrDie(provider.AdminConfig()).Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if _, err := crds.Patch(ctx, exampleapis.MangoDB.Name(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	installLeaseAccess(t, provider)
	kube := kubernetes.NewForConfigOrDie(provider.AdminConfig())

	port := procs.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	idp := oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{base + "/callback"}, Users: []oidcprovider.User{oidcprovider.Alice}})
	args := append(backendproc.BrowserArgs(t, port, base, idp, provider.AdminKubeconfigPath(), "V2 provider", namespacePrefix),
		"--heartbeat-lease-tolerance", leaseTolerance.String())
	backendproc.Start(t, base, args, 90*time.Second)

	consumer := controlplane.Consumer(t)
	if err := konnector.InstallV2CRDs(ctx, consumer.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	consumerKube := kubernetes.NewForConfigOrDie(consumer.AdminConfig())
	kubeSystem, err := consumerKube.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// A: the v2 bundle applied, the released konnector running.
	bundle := v2Bind(t, base, exampleapis.MangoDB.Name())
	apply := exec.Command(filepath.Join(consumer.BinDir(), "kubectl"), "--kubeconfig", consumer.AdminKubeconfigPath(), "apply", "-f", "-")
	apply.Stdin = bytes.NewReader(bundle)
	if out, err := apply.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	credsA, nsA := testutil.IssuedConfig(t, bundleCredentials(t, bundle))
	v2 := procs.Start(t, t.TempDir(), konnector.ReleasedBinaryOf(t, konnector.ReleasedV2, "konnector"), []string{
		"-kubeconfig", consumer.AdminKubeconfigPath(),
		"-metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", procs.FreePort(t)),
		"-health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", procs.FreePort(t)),
		"-zap-log-level", "2",
	})

	// Its Lease: consumer-<the consumer's kube-system UID> in kbind,
	// stamped with A's namespace, renewed.
	leaseName := "consumer-" + string(kubeSystem.UID)
	leases := kube.CoordinationV1().Leases(binding.V2LeaseNamespace)
	var first *coordinationv1.Lease
	testutil.AwaitWithin(t, 3*time.Minute, 500*time.Millisecond, "the v2 konnector's Lease on the provider", func() (bool, error) {
		l, err := leases.Get(ctx, leaseName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		first = l
		return err == nil, err
	})
	if got := first.Labels[binding.LabelLeaseConsumer]; got != nsA {
		t.Fatalf("the konnector's Lease is stamped %q, want %s: %v", got, nsA, first.Labels)
	}
	if first.Spec.LeaseDurationSeconds == nil || first.Spec.RenewTime == nil {
		t.Fatalf("the konnector's Lease has no duration or renewal: %+v", first.Spec)
	}
	// Renewed: the first renewals follow the Connection's own status
	// changes; the period is the gap between later ones. They are
	// watched for while B and C bind, and awaited before A stops.
	renewed := make(chan []time.Time, 1)
	watchCtx, stopWatching := context.WithCancel(ctx)
	var watching sync.WaitGroup
	t.Cleanup(func() { stopWatching(); watching.Wait() })
	watching.Go(func() {
		renewals := []time.Time{first.Spec.RenewTime.Time}
		for len(renewals) < 4 && watchCtx.Err() == nil {
			if l, err := leases.Get(watchCtx, leaseName, metav1.GetOptions{}); err == nil && l.Spec.RenewTime != nil &&
				l.Spec.RenewTime.After(renewals[len(renewals)-1]) {
				renewals = append(renewals, l.Spec.RenewTime.Time)
			}
			select {
			case <-watchCtx.Done():
			case <-time.After(time.Second):
			}
		}
		renewed <- renewals
	})

	// B: a v0.8.2 consumer of the same provider, bound from the same
	// cluster with the released CLI, its konnector running.
	old := konnector.StartReleased(t, konnector.ReleasedV1alpha2, consumer.AdminKubeconfigPath(), provider.Host())
	home := t.TempDir()
	chromium.LoginCLI(t, konnector.ReleasedV1alpha2, home, base, oidcprovider.Alice)
	cli := konnector.RunCLI(t, konnector.ReleasedV1alpha2, home, "--kubeconfig", consumer.AdminKubeconfigPath(), "--skip-browser", "--skip-konnector")
	line := cli.Line(t, func(s string) bool { return strings.Contains(s, "Please manually open: ") })
	chromium.PressBind(t, chromium.OpenBindPage(t, line[strings.Index(line, "http"):], base, oidcprovider.Alice), exampleapis.Redis.Name())
	if code := cli.Wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("kubectl-bind v0.8.2: exit %d", code)
	}
	credsB, nsB := v082Credentials(t, consumerKube)
	if nsB == nsA {
		t.Fatalf("both consumers in provider namespace %s", nsA)
	}

	// Both healthy at once.
	testutil.AwaitWithin(t, 3*time.Minute, time.Second, "both bindings healthy at once", func() (bool, error) {
		a, b := healthOf(ctx, provider, nsA), healthOf(ctx, provider, nsB)
		return a != nil && a["status"] == "True" && b != nil && b["status"] == "True", nil
	})
	// Neither reads the other's namespace.
	for _, c := range []struct {
		who   string
		creds *rest.Config
		other string
	}{{"the v2 consumer", credsA, nsB}, {"the v0.8.2 consumer", credsB, nsA}} {
		for _, attr := range []authzv1.ResourceAttributes{
			{Verb: "get", Resource: "secrets"}, {Verb: "list", Resource: "secrets"},
			{Verb: "get", Group: "kube-bind.io", Resource: "clusterbindings"},
			{Verb: "list", Group: exampleapis.MangoDB.Group, Resource: exampleapis.MangoDB.Plural},
			{Verb: "list", Group: exampleapis.Redis.Group, Resource: exampleapis.Redis.Plural},
		} {
			attr.Namespace = c.other
			r, err := kubernetes.NewForConfigOrDie(c.creds).AuthorizationV1().SelfSubjectAccessReviews().Create(ctx,
				&authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attr}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Status.Allowed {
				t.Errorf("%s may %s %s.%s in the other's namespace %s", c.who, attr.Verb, attr.Resource, attr.Group, c.other)
			}
		}
		if _, err := dynamic.NewForConfigOrDie(c.creds).Resource(kbresources.ClusterBindings).Namespace(c.other).
			Get(ctx, binding.ClusterBindingName, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("%s reads the other's ClusterBinding: %v, want Forbidden", c.who, err)
		}
	}

	// C: another v2 consumer's credentials, against A's Lease.
	credsC, nsC := testutil.IssuedConfig(t, bundleCredentials(t, v2Bind(t, base, exampleapis.MangoDB.Name())))
	asC := kubernetes.NewForConfigOrDie(credsC).CoordinationV1().Leases(binding.V2LeaseNamespace)
	theirs, err := asC.Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("C's get of A's Lease (the konnector gets before it updates): %v", err)
	}
	now := metav1.NowMicro()
	theirs.Spec.RenewTime = &now
	if _, err := asC.Update(ctx, theirs, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("C renews A's Lease: %v, want Forbidden", err)
	}
	theirs.Labels[binding.LabelLeaseConsumer] = nsC
	if _, err := asC.Update(ctx, theirs, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("C stamps A's Lease its own: %v, want Forbidden", err)
	}
	if err := asC.Delete(ctx, leaseName, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("C deletes A's Lease: %v, want Forbidden", err)
	}
	forged := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "consumer-" + string(uuid.NewUUID()),
		Labels: map[string]string{binding.LabelLeaseConsumer: nsA}}, Spec: coordinationv1.LeaseSpec{RenewTime: &now}}
	if _, err := asC.Create(ctx, forged, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("C makes a Lease stamped A's: %v, want Forbidden", err)
	}
	if _, err := asC.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leaseName}}, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Errorf("C makes a Lease of A's name: %v, want AlreadyExists", err)
	}
	if l, err := leases.Get(ctx, leaseName, metav1.GetOptions{}); err != nil || l.Labels[binding.LabelLeaseConsumer] != nsA {
		t.Errorf("A's Lease after C's attempts: %v, labels %v", err, l.GetLabels())
	}
	if c := healthOf(ctx, provider, nsC); c != nil && c["status"] == "True" {
		t.Errorf("C's binding, whose konnector never ran, is healthy: %v", c)
	}

	var renewals []time.Time
	select {
	case renewals = <-renewed:
	case <-time.After(4 * time.Minute):
		t.Fatal("the konnector did not renew its Lease three times in 4 minutes")
	}
	if len(renewals) < 4 {
		t.Fatalf("the konnector renewed its Lease at %v only", renewals)
	}
	var gaps []string
	for i := 1; i < len(renewals); i++ {
		gaps = append(gaps, renewals[i].Sub(renewals[i-1]).Round(100*time.Millisecond).String())
	}
	t.Logf("Lease %s/%s: leaseDurationSeconds %d, holder %s, renewals %s apart", binding.V2LeaseNamespace, leaseName,
		*first.Spec.LeaseDurationSeconds, ptrString(first.Spec.HolderIdentity), strings.Join(gaps, ", "))

	// A's konnector stops: HeartbeatMissing once the tolerance passed,
	// while the v0.8.2 consumer stays healthy.
	if err := v2.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	testutil.AwaitWithin(t, 2*leaseTolerance+2*time.Minute, time.Second, "A's binding to turn HeartbeatMissing", func() (bool, error) {
		c := healthOf(ctx, provider, nsA)
		return c != nil && c["reason"] == heartbeats.ReasonHeartbeatMissing, nil
	})
	t.Logf("A's binding HeartbeatMissing %s after its konnector stopped (tolerance %s)", time.Since(stopped).Round(time.Second), leaseTolerance)
	if c := healthOf(ctx, provider, nsB); c == nil || c["status"] != "True" {
		t.Errorf("the v0.8.2 binding after the v2 konnector stopped: %v", c)
	}
	if done, err := old.Exited(); done {
		t.Errorf("the v0.8.2 konnector exited: %v", err)
	}
}

// v082Credentials returns the kubeconfig the released v0.8.2 CLI stored in
// the consumer cluster (namespace kube-bind, key kubeconfig).
func v082Credentials(t *testing.T, consumerKube kubernetes.Interface) (*rest.Config, string) {
	t.Helper()
	list, err := consumerKube.CoreV1().Secrets("kube-bind").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		if kc := s.Data["kubeconfig"]; len(kc) > 0 {
			return testutil.IssuedConfig(t, kc)
		}
	}
	t.Fatal("the v0.8.2 CLI stored no kubeconfig in namespace kube-bind")
	return nil, ""
}

func ptrString(p *string) string {
	if p == nil {
		return "<none>"
	}
	return *p
}
