package upgrade

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/kbprovider/backend/deploy/crds"
	"github.com/kbprovider/backend/internal/client/apply"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

const namespacePrefix = "kb-upgrade-"

var (
	mango       = exampleapis.MangoDB
	mangoGVR    = mango.GVR()
	crdGVR      = apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions")
	namespaces  = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	secrets     = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	clusterGVR  = kbresources.ClusterBindings
	exportGVR   = kbresources.APIServiceExports
	bindingGVR  = apply.BindingGVR
	namespaceRe = regexp.MustCompile(`in namespace (\S+) on `)
)

// TestUpgradeFromV1alpha1: a consumer binds with the previous release's
// client and backend and runs konnector v0.4.8; the provider upgrades (new
// CRDs, new backend); the consumer keeps syncing, then swaps to konnector
// v0.8.2 with no rebind. Nothing either side made is re-created: UIDs are
// recorded before the upgrade and compared after each step.
func TestUpgradeFromV1alpha1(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	old := buildOldRelease(t)
	testStart := time.Now()
	provider := controlplane.Get(t)
	cons := controlplane.Consumer(t)
	pDyn := dynamic.NewForConfigOrDie(provider.AdminConfig())
	cDyn := dynamic.NewForConfigOrDie(cons.AdminConfig())
	pCRDs := apiextensionsclient.NewForConfigOrDie(provider.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()
	cCRDs := apiextensionsclient.NewForConfigOrDie(cons.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()

	// ---- Before: the previous release, a consumer bound through v1alpha1.
	runOld(t, old.prepare, provider.AdminKubeconfigPath())
	for _, name := range []string{crds.ClusterBindings, crds.APIServiceExports, crds.APIServiceExportRequests, crds.APIServiceNamespaces} {
		if v := servedVersions(ctx, t, pCRDs, name); v != "v1alpha1(storage)" {
			t.Fatalf("the previous release's CRD %s serves %s, want v1alpha1 only", name, v)
		}
	}
	if _, err := pCRDs.Get(ctx, "boundschemas."+crds.Group, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("BoundSchemas exist before the upgrade: %v", err)
	}
	port := procs.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	idp := oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{base + "/callback"}, Users: []oidcprovider.User{alice}})
	// One set of flags for both releases, as a Helm upgrade keeps its
	// values: same URL, same keys (cluster secrets must survive upgrades).
	args := append(backendproc.BrowserArgs(t, port, base, idp, provider.AdminKubeconfigPath(), "Upgrade Inc.", namespacePrefix),
		"--cluster-secret-key", procs.RandomKey(32))
	oldBackend := backendproc.StartBinary(t, old.backend, base, args, 90*time.Second)

	// Konnector v0.4.8 as the consumer cluster's admin (the bind skips its
	// Deployment); it installs the APIServiceBinding CRD the bind waits for.
	k1 := konnector.Start(t, konnector.Options{
		Binary:     konnector.ReleasedBinaryOf(t, konnector.ReleasedVersion, "konnector"),
		Kubeconfig: cons.AdminKubeconfigPath(),
		Servers:    []string{provider.Host()},
		// A lease per konnector: v0.8.2 need not wait for v0.4.8's to expire.
		Args: []string{"--lease-name", "konnector-v0-4-8"},
	})
	// The previous release's client speaks v1alpha1 only: it has no
	// --protocol flag yet.
	home := t.TempDir()
	bind := procs.Start(t, home, old.cli, []string{"--skip-konnector", "--kubeconfig", cons.AdminKubeconfigPath(), "--wait-timeout", "3m", base + "/export"},
		"HOME="+home, "KUBECONFIG=")
	bindInBrowser(t, base, bind.URL(t), mango.Name())
	if code := bind.Wait(t, 5*time.Minute); code != 0 {
		t.Fatalf("the previous release's kube-bind-poll: exit %d:\n%s", code, bind.Stderr.String())
	}
	m := namespaceRe.FindStringSubmatch(bind.Stderr.String())
	if m == nil {
		t.Fatalf("the bind named no provider namespace:\n%s", bind.Stderr.String())
	}
	ns := m[1]
	t.Logf("bound by the previous release into provider namespace %s (%s since the test started)", ns, time.Since(testStart).Round(time.Second))

	testutil.AwaitWithin(t, 2*time.Minute, 200*time.Millisecond, "konnector v0.4.8 to create the bound CRD, owned by its binding", func() (bool, error) {
		crd, err := cCRDs.Get(ctx, mango.Name(), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return len(crd.OwnerReferences) == 1 && crd.OwnerReferences[0].Kind == "APIServiceBinding", nil
	})
	upBefore := syncBothWays(ctx, t, cDyn, pDyn, "before")
	if hb := heartbeat(ctx, t, pDyn, ns); hb.IsZero() {
		t.Fatal("no heartbeat from konnector v0.4.8 before the upgrade")
	}
	export := get(ctx, t, pDyn, exportGVR, ns, mango.Name())
	if _, has, _ := unstructured.NestedFieldNoCopy(export.Object, "spec", "resources"); has {
		t.Fatalf("the previous release wrote spec.resources: %v", export.Object["spec"])
	}
	v1Spec, _, _ := unstructured.NestedMap(export.Object, "spec")
	if v1Spec["group"] != mango.Group {
		t.Fatalf("the previous release's export has no v1alpha1 CRD copy: %v", v1Spec)
	}
	konnectorVersionBefore := nested(get(ctx, t, pDyn, clusterGVR, ns, "cluster"), "status", "konnectorVersion")

	// The UIDs of everything the bind and the konnector made.
	binding := get(ctx, t, cDyn, bindingGVR, "", mango.Name())
	kept := []ref{
		{"consumer MangoDB default/before", cDyn, mangoGVR, "default", "before"},
		{"provider MangoDB " + upBefore.GetNamespace() + "/before", pDyn, mangoGVR, upBefore.GetNamespace(), "before"},
		{"consumer CRD " + mango.Name(), cDyn, crdGVR, "", mango.Name()},
		{"consumer APIServiceBinding " + mango.Name(), cDyn, bindingGVR, "", mango.Name()},
		{"consumer kubeconfig Secret", cDyn, secrets, apply.Namespace, nested(binding, "spec", "kubeconfigSecretRef", "name")},
		{"provider Namespace " + ns, pDyn, namespaces, "", ns},
		{"provider ClusterBinding", pDyn, clusterGVR, ns, "cluster"},
		{"provider APIServiceExport", pDyn, exportGVR, ns, mango.Name()},
		{"provider APIServiceExportRequest", pDyn, kbresources.APIServiceExportRequests, ns, mango.Name()},
	}
	sns, err := pDyn.Resource(kbresources.APIServiceNamespaces).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(sns.Items) == 0 {
		t.Fatalf("APIServiceNamespaces in %s: %v (%d)", ns, err, len(sns.Items))
	}
	for _, sn := range sns.Items {
		kept = append(kept,
			ref{"provider APIServiceNamespace " + sn.GetName(), pDyn, kbresources.APIServiceNamespaces, ns, sn.GetName()},
			ref{"provider Namespace " + nested(&sn, "status", "namespace"), pDyn, namespaces, "", nested(&sn, "status", "namespace")})
	}
	before := uids(ctx, t, kept)
	if crd := get(ctx, t, cDyn, crdGVR, "", mango.Name()); crd.GetOwnerReferences()[0].UID != binding.GetUID() {
		t.Fatalf("the bound CRD's owner %v is not APIServiceBinding %s", crd.GetOwnerReferences(), binding.GetUID())
	}
	t.Logf("before the upgrade: bound, synced both ways, %d objects recorded (%s since the test started)", len(before), time.Since(testStart).Round(time.Second))

	// ---- Upgrade: the new CRDs (and ClusterRoles), the new backend.
	var newBackend *backendproc.Process
	if !t.Run("Upgrade", func(t *testing.T) {
		oldBackend.Stop()
		if err := exampleapis.Prepare(ctx, provider, mango); err != nil {
			t.Fatalf("installing the new CRDs: %v", err)
		}
		if v := servedVersions(ctx, t, pCRDs, crds.APIServiceExports); v != "v1alpha1,v1alpha2(storage)" {
			t.Fatalf("after the upgrade %s serves %s, want v1alpha1 and v1alpha2 (storage)", crds.APIServiceExports, v)
		}
		newBackend = backendproc.StartBinary(t, backendproc.Binary, base, slices.Concat(args, backendproc.DiagnosticsArgs(t)), 90*time.Second)

		// The export turns dual, its v1alpha1 fields untouched.
		testutil.AwaitWithin(t, 2*time.Minute, 200*time.Millisecond, "the export to become dual (spec.resources) and its BoundSchema", func() (bool, error) {
			e, err := pDyn.Resource(kbresources.APIServiceExportsV1alpha2).Namespace(ns).Get(ctx, mango.Name(), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if res, _, _ := unstructured.NestedSlice(e.Object, "spec", "resources"); len(res) != 1 {
				return false, nil
			}
			_, err = pDyn.Resource(kbresources.BoundSchemas).Namespace(ns).Get(ctx, mango.Name(), metav1.GetOptions{})
			return err == nil, err
		})
		checkV1alpha1Fields(ctx, t, pDyn, ns, v1Spec)

		// Konnector v0.4.8 goes on: a new object syncs both ways, the
		// heartbeat is renewed.
		if done, err := k1.Exited(); done {
			t.Fatalf("konnector v0.4.8 exited: %v", err)
		}
		upAfter := syncBothWays(ctx, t, cDyn, pDyn, "after-upgrade")
		kept = append(kept,
			ref{"consumer MangoDB default/after-upgrade", cDyn, mangoGVR, "default", "after-upgrade"},
			ref{"provider MangoDB " + upAfter.GetNamespace() + "/after-upgrade", pDyn, mangoGVR, upAfter.GetNamespace(), "after-upgrade"})
		heartbeatRenewed(ctx, t, pDyn, ns, "konnector v0.4.8")
		// Its v1alpha1 status writes kept the v1alpha2 fields.
		checkDual(ctx, t, pDyn, ns)
		if phase := nested(get(ctx, t, pDyn, kbresources.APIServiceExportRequests, ns, mango.Name()), "status", "phase"); phase != "Succeeded" {
			t.Errorf("after the upgrade the request is %q, want Succeeded", phase)
		}
		compareUIDs(ctx, t, before, kept)
	}) {
		t.FailNow()
	}
	afterUpgrade := uids(ctx, t, kept)

	// ---- Swap: konnector v0.8.2 in place of v0.4.8, no rebind.
	t.Run("SwapKonnector", func(t *testing.T) {
		k1.Stop()
		k2 := konnector.Start(t, konnector.Options{
			Binary:     konnector.ReleasedBinaryOf(t, konnector.ReleasedV1alpha2, "konnector"),
			Kubeconfig: cons.AdminKubeconfigPath(),
			Servers:    []string{provider.Host()},
			Args:       []string{"--lease-name", "konnector-v0-8-2"},
		})
		// It moved the consumer's APIServiceBinding CRD to v1alpha2 storage.
		testutil.AwaitWithin(t, 2*time.Minute, 200*time.Millisecond, "konnector v0.8.2 to install its APIServiceBinding CRD (v1alpha2 storage)", func() (bool, error) {
			return servedVersions(ctx, t, cCRDs, "apiservicebindings."+crds.Group) == "v1alpha1,v1alpha2(storage)", nil
		})
		syncBothWays(ctx, t, cDyn, pDyn, "after-swap")
		// A status set upstream on an object made before the upgrade comes
		// back too.
		statusComesBack(ctx, t, cDyn, pDyn, upBefore.GetNamespace(), "before", "Ready-again")
		var version string
		testutil.AwaitWithin(t, 2*time.Minute, 500*time.Millisecond, "konnector v0.8.2 to report its version on the ClusterBinding", func() (bool, error) {
			version = nested(get(ctx, t, pDyn, clusterGVR, ns, "cluster"), "status", "konnectorVersion")
			return version != "" && version != konnectorVersionBefore, nil
		})
		t.Logf("ClusterBinding status.konnectorVersion: %s before, %s after the swap", konnectorVersionBefore, version)
		heartbeatRenewed(ctx, t, pDyn, ns, "konnector v0.8.2")
		compareUIDs(ctx, t, afterUpgrade, kept)
		compareUIDs(ctx, t, before, kept)
		if crd := get(ctx, t, cDyn, crdGVR, "", mango.Name()); len(crd.GetOwnerReferences()) != 1 || crd.GetOwnerReferences()[0].UID != binding.GetUID() {
			t.Errorf("after the swap the bound CRD's owners are %v, want only APIServiceBinding %s", crd.GetOwnerReferences(), binding.GetUID())
		}
		checkV1alpha1Fields(ctx, t, pDyn, ns, v1Spec)
		checkDual(ctx, t, pDyn, ns)
		if log := k2.Log(); strings.Contains(strings.ToLower(log), "forbidden") {
			t.Errorf("konnector v0.8.2 was refused something on the provider:\n%s", testutil.GrepLines(log, "orbidden"))
		}
		// It took the binding over: schema in sync, from the BoundSchema.
		testutil.AwaitWithin(t, time.Minute, 200*time.Millisecond, "konnector v0.8.2 to report the APIServiceBinding Ready and SchemaInSync", func() (bool, error) {
			b := get(ctx, t, cDyn, apply.BindingV1alpha2GVR, "", mango.Name())
			return condition(b, "Ready") == "True" && condition(b, "SchemaInSync") == "True", nil
		})
		if done, err := k2.Exited(); done {
			t.Errorf("konnector v0.8.2 exited: %v", err)
		}
	})
	// Shown, not failed on: a retried conflict is logged as an error too.
	if errs := testutil.GrepLines(newBackend.Logs.String(), "level=ERROR"); errs != "" {
		t.Logf("the new backend logged errors:\n%s", errs)
	}
	t.Logf("the whole test took %s (without the previous release's build)", time.Since(testStart).Round(time.Second))
}

// checkV1alpha1Fields compares the export's v1alpha1 spec (read through
// v1alpha1) with want, the previous release's; fields only v1alpha2 has
// are not in want.
func checkV1alpha1Fields(ctx context.Context, t *testing.T, dyn dynamic.Interface, ns string, want map[string]any) {
	t.Helper()
	e := get(ctx, t, dyn, exportGVR, ns, mango.Name())
	have, _, _ := unstructured.NestedMap(e.Object, "spec")
	for k, v := range want {
		if !equality.Semantic.DeepEqual(have[k], v) {
			t.Errorf("the export's v1alpha1 field spec.%s changed:\nwas %v\nnow %v", k, v, have[k])
		}
	}
}

// checkDual checks that the export still has its v1alpha2 resources and
// its BoundSchema.
func checkDual(ctx context.Context, t *testing.T, dyn dynamic.Interface, ns string) {
	t.Helper()
	e := get(ctx, t, dyn, kbresources.APIServiceExportsV1alpha2, ns, mango.Name())
	res, _, _ := unstructured.NestedSlice(e.Object, "spec", "resources")
	if first, _ := firstMap(res); len(res) != 1 || first["group"] != mango.Group || first["resource"] != mango.Plural {
		t.Errorf("the export's spec.resources is %v, want the one resource %s", res, mango.Plural)
	}
	if _, err := dyn.Resource(kbresources.BoundSchemas).Namespace(ns).Get(ctx, mango.Name(), metav1.GetOptions{}); err != nil {
		t.Errorf("BoundSchema %s/%s: %v", ns, mango.Name(), err)
	}
}

func firstMap(s []any) (map[string]any, bool) {
	if len(s) == 0 {
		return nil, false
	}
	m, ok := s[0].(map[string]any)
	return m, ok
}

// servedVersions lists a CRD's served versions, sorted, the storage one
// marked.
func servedVersions(ctx context.Context, t *testing.T, client interface {
	Get(context.Context, string, metav1.GetOptions) (*apiextensionsv1.CustomResourceDefinition, error)
}, name string) string {
	t.Helper()
	crd, err := client.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	var vs []string
	for _, v := range crd.Spec.Versions {
		if !v.Served {
			continue
		}
		if v.Storage {
			vs = append(vs, v.Name+"(storage)")
		} else {
			vs = append(vs, v.Name)
		}
	}
	sort.Strings(vs)
	return strings.Join(vs, ",")
}

// ref names an object whose UID must not change.
type ref struct {
	what string
	dyn  dynamic.Interface
	gvr  schema.GroupVersionResource
	ns   string
	name string
}

func uids(ctx context.Context, t *testing.T, refs []ref) map[string]types.UID {
	t.Helper()
	out := map[string]types.UID{}
	for _, r := range refs {
		out[r.what] = get(ctx, t, r.dyn, r.gvr, r.ns, r.name).GetUID()
	}
	return out
}

// compareUIDs reports each object of refs recorded in was that is gone or
// was re-created.
func compareUIDs(ctx context.Context, t *testing.T, was map[string]types.UID, refs []ref) {
	t.Helper()
	for _, r := range refs {
		want, ok := was[r.what]
		if !ok {
			continue
		}
		o, err := r.dyn.Resource(r.gvr).Namespace(r.ns).Get(ctx, r.name, metav1.GetOptions{})
		switch {
		case err != nil:
			t.Errorf("%s (%s): %v", r.what, r.name, err)
		case o.GetDeletionTimestamp() != nil:
			t.Errorf("%s (%s) is being deleted", r.what, r.name)
		case o.GetUID() != want:
			t.Errorf("%s (%s) was re-created: UID %s, was %s", r.what, r.name, o.GetUID(), want)
		}
	}
}

// condition is the status of condition typ of u ("" when it has none).
func condition(u *unstructured.Unstructured, typ string) string {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			s, _ := m["status"].(string)
			return s
		}
	}
	return ""
}

func get(ctx context.Context, t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, ns, name string) *unstructured.Unstructured {
	t.Helper()
	o, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s %s/%s: %v", gvr.Resource, ns, name, err)
	}
	return o
}

func nested(u *unstructured.Unstructured, fields ...string) string {
	s, _, _ := unstructured.NestedString(u.Object, fields...)
	return s
}
