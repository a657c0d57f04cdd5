package konnector

import (
	"context"
	"strings"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/tb"
)

// What tests add: a konnector stopped when the test ends, the released
// binaries found or the test failed.

// Start starts the konnector for the test and stops it when the test ends.
// When the test failed, its log is shown.
func Start(t tb.TB, o Options) *Konnector {
	t.Helper()
	k, err := Run(o)
	if err != nil {
		t.Fatalf("konnector: %v", err)
	}
	t.Cleanup(func() {
		k.Stop()
		if t.Failed() {
			t.Logf("konnector log:\n%s", k.Log())
		}
	})
	return k
}

// ReleasedBinary returns the path of the released kube-bind binary name
// ("konnector" or "kubectl-bind"), checked against its sum; it fails the
// test when the release folder cannot be found or a sum does not match.
func ReleasedBinary(t tb.TB, name string) string {
	t.Helper()
	return ReleasedBinaryOf(t, ReleasedVersion, name)
}

// ReleasedBinaryOf is ReleasedBinary of another release (e.g.
// ReleasedV1alpha2).
func ReleasedBinaryOf(t tb.TB, release, name string) string {
	t.Helper()
	p, err := ReleasedPathOf(release, name)
	if err != nil {
		t.Fatalf("released kube-bind %s: %v", release, err)
	}
	return p
}

// What the released kubectl-bind (v0.6+, kube-bind.io/v1alpha2) and
// konnector do against a backend, as the end-to-end suites drive them:
// the CLI with a HOME of its own, the konnector as a process against a
// consumer cluster. The CLI's browser parts are in
// internal/testutil/chromium.

// CLIConfigFile is the kube-bind config (server, token) RunCLI uses in
// home.
func CLIConfigFile(home string) string { return home + "/kube-bind-config.yaml" }

// RunCLI runs the released kubectl-bind of release with HOME home (a
// machine with no local state) and its kube-bind config in it.
func RunCLI(t tb.TB, release, home string, args ...string) *procs.Command {
	t.Helper()
	args = append(args, "--config-file", CLIConfigFile(home))
	return procs.Start(t, home, ReleasedBinaryOf(t, release, "kubectl-bind"), args, "HOME="+home, "KUBECONFIG=")
}

// StartReleased runs the konnector of release against the consumer
// cluster of kubeconfig as its admin (with --skip-konnector nothing made
// it a ServiceAccount), reaching the provider's API servers; its lease is
// named after the test. It installs the consumer-side CRDs the CLI waits
// for.
func StartReleased(t tb.TB, release, kubeconfig string, servers ...string) *Konnector {
	t.Helper()
	return Start(t, Options{
		Binary:     ReleasedBinaryOf(t, release, "konnector"),
		Kubeconfig: kubeconfig,
		Servers:    servers,
		Args:       []string{"--lease-name", "konnector-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))},
	})
}

// BindingGVR is the consumer's APIServiceBinding as the released CLI
// writes it.
var BindingGVR = schema.GroupVersionResource{Group: "kube-bind.io", Version: "v1alpha2", Resource: "apiservicebindings"}

// ExpectBinding fails the test unless APIServiceBinding name exists in
// the consumer cluster.
func ExpectBinding(t tb.TB, consumer *rest.Config, name string) {
	t.Helper()
	if _, err := dynamic.NewForConfigOrDie(consumer).Resource(BindingGVR).Get(context.Background(), name, metav1.GetOptions{}); err != nil {
		t.Fatalf("APIServiceBinding %s: %v", name, err)
	}
}

// SyncsBothWays waits for the konnector to make the bound CRD of api in
// the consumer cluster, creates object name of it in namespace default,
// waits for it on the provider (in a namespace of namespacePrefix), sets
// its status there and waits for that status on the consumer. It returns
// the object as the provider first had it.
func SyncsBothWays(t tb.TB, consumer, provider *rest.Config, api exampleapis.API, name, namespacePrefix string) *unstructured.Unstructured {
	t.Helper()
	ctx := context.Background()
	consumerDyn := dynamic.NewForConfigOrDie(consumer)
	providerDyn := dynamic.NewForConfigOrDie(provider)
	crds := apiextensionsclient.NewForConfigOrDie(consumer).ApiextensionsV1().CustomResourceDefinitions()
	testutil.AwaitWithin(t, 2*time.Minute, 200*time.Millisecond, "the konnector to create the bound CRD "+api.Name(), func() (bool, error) {
		crd, err := crds.Get(ctx, api.Name(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return len(crd.OwnerReferences) > 0 && crd.OwnerReferences[0].Kind == "APIServiceBinding", nil
	})
	gvr := api.GVR()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": api.Group + "/v1alpha1", "kind": api.Kind,
		"metadata": map[string]any{"name": name, "namespace": "default"},
		"spec":     map[string]any{"tier": "gold"},
	}}
	testutil.AwaitWithin(t, time.Minute, 200*time.Millisecond, "the API to be served in the consumer cluster", func() (bool, error) {
		_, err := consumerDyn.Resource(gvr).Namespace("default").Create(ctx, obj, metav1.CreateOptions{})
		return err == nil || apierrors.IsAlreadyExists(err), nil
	})
	var upstream *unstructured.Unstructured
	testutil.AwaitWithin(t, 2*time.Minute, 200*time.Millisecond, name+" to appear on the provider", func() (bool, error) {
		list, err := providerDyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for i := range list.Items {
			if list.Items[i].GetName() == name {
				upstream = &list.Items[i]
				return true, nil
			}
		}
		return false, nil
	})
	if tier, _, _ := unstructured.NestedString(upstream.Object, "spec", "tier"); tier != "gold" {
		t.Errorf("upstream spec %v, want tier gold", upstream.Object["spec"])
	}
	if !strings.HasPrefix(upstream.GetNamespace(), namespacePrefix) {
		t.Errorf("%s is in provider namespace %s, not one made for a consumer", name, upstream.GetNamespace())
	}
	testutil.AwaitWithin(t, time.Minute, 200*time.Millisecond, "the status to be written upstream", func() (bool, error) {
		cur, err := providerDyn.Resource(gvr).Namespace(upstream.GetNamespace()).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		_ = unstructured.SetNestedField(cur.Object, "Ready", "status", "phase")
		_, err = providerDyn.Resource(gvr).Namespace(upstream.GetNamespace()).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err == nil, nil
	})
	testutil.AwaitWithin(t, 2*time.Minute, 200*time.Millisecond, "the provider's status to reach the consumer", func() (bool, error) {
		cur, err := consumerDyn.Resource(gvr).Namespace("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		phase, _, _ := unstructured.NestedString(cur.Object, "status", "phase")
		return phase == "Ready", nil
	})
	return upstream
}
