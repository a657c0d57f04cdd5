package consumer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kbprovider/backend/internal/client/apply"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil"
)

var deputyAPI = exampleapis.API{Group: "deputies.example.com", Plural: "deputies", Kind: "Deputy", Exported: true}

// TestKonnectorV048InTheCluster is a consumer cluster where the released
// kubectl-bind v0.4.8 left its konnector: Deployment kube-bind/konnector of
// image v0.4.8 (no pods run: no nodes) and the konnector itself, run as a
// process, which installed its APIServiceBinding CRD of v1alpha1 only. The
// backend offers both generations. With --skip-konnector, which keeps that
// konnector, the command refuses a forced v1alpha2 before the browser step,
// and auto binds through v1alpha1, saying why, instead of waiting for a
// v1alpha2 CRD that never comes.
func TestKonnectorV048InTheCluster(t *testing.T) {
	e := startEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := exampleapis.Prepare(ctx, e.provider, deputyAPI); err != nil {
		t.Fatal(err)
	}
	cons := freshConsumer(t)
	kube := kubernetes.NewForConfigOrDie(cons.AdminConfig())
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: apply.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": apply.KonnectorName}
	if _, err := kube.AppsV1().Deployments(apply.Namespace).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: apply.KonnectorName, Namespace: apply.Namespace, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "konnector", Image: apply.DefaultKonnector}}},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	konnector.StartReleased(t, konnector.ReleasedVersion, cons.AdminKubeconfigPath(), e.provider.Host())
	crds := apiextensionsclient.NewForConfigOrDie(cons.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()
	testutil.AwaitWithin(t, 2*time.Minute, 200*time.Millisecond, "konnector v0.4.8 to install its APIServiceBinding CRD", func() (bool, error) {
		crd, err := crds.Get(ctx, apply.BindingCRDName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == "Established" && c.Status == "True" {
				return true, nil
			}
		}
		return false, nil
	})
	args := []string{"--kubeconfig", cons.AdminKubeconfigPath(), "--skip-konnector", "--wait-timeout", "1m"}

	// Forced v1alpha2: refused before any session, naming the konnector,
	// what it serves and what to do.
	c := runCLI(t, t.TempDir(), cliBinary, append(args, "--protocol", "v1alpha2", e.exportURL))
	if code := c.Wait(t, time.Minute); code != 1 {
		t.Fatalf("forced v1alpha2: exit code %d, want 1:\n%s", code, c.Stderr.String())
	}
	for _, want := range []string{"kube-bind.io/v1alpha2 does not fit this cluster", "the konnector in this cluster (v0.4.8",
		"serves only kube-bind.io/v1alpha1", "--skip-konnector", "leave out --protocol"} {
		if !strings.Contains(c.Stderr.String(), want) {
			t.Errorf("forced v1alpha2: stderr lacks %q:\n%s", want, c.Stderr.String())
		}
	}
	if strings.Contains(c.Stderr.String(), e.baseURL+"/authorize") {
		t.Errorf("forced v1alpha2: a session was opened:\n%s", c.Stderr.String())
	}

	// Auto: v1alpha1, said before the URL, and bound.
	c = runCLI(t, t.TempDir(), cliBinary, append(args, e.exportURL))
	u := c.URL(t)
	before := c.Stderr.String()
	if !strings.Contains(before, "binds through kube-bind.io/v1alpha1 with the poll flow, not kube-bind.io/v1alpha2: the konnector in this cluster (v0.4.8") {
		t.Errorf("the choice of v1alpha1 and its reason were not said before the URL:\n%s", before)
	}
	bindInBrowser(t, e, u, deputyAPI.Name())
	if code := c.Wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("auto: exit code %d:\n%s", code, c.Stderr.String())
	}
	t.Logf("command output:\n%s", c.Stderr.String())
	if _, err := dynamic.NewForConfigOrDie(cons.AdminConfig()).Resource(apply.BindingGVR).Get(ctx, deputyAPI.Name(), metav1.GetOptions{}); err != nil {
		t.Errorf("APIServiceBinding %s of kube-bind.io/v1alpha1: %v", deputyAPI.Name(), err)
	}
	if d, err := kube.AppsV1().Deployments(apply.Namespace).Get(ctx, apply.KonnectorName, metav1.GetOptions{}); err != nil ||
		d.Spec.Template.Spec.Containers[0].Image != apply.DefaultKonnector {
		t.Errorf("the konnector Deployment was changed despite --skip-konnector: %v", err)
	}
}

// TestKbindV2InTheCluster is a consumer cluster with kbind v2's CRDs
// (core.kbind.io, from the released v2.0.0-rc4) and no kube-bind
// konnector. With --skip-konnector nothing there serves kube-bind.io
// APIServiceBindings: the command says so and that it does not bind
// through kbind v2, before it asks the provider anything (the export URL
// is a closed port).
func TestKbindV2InTheCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := kbindV2Release(t)
	cons := freshConsumer(t)
	crds := apiextensionsclient.NewForConfigOrDie(cons.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()
	for _, name := range apply.KbindV2CRDs {
		plural, group, _ := strings.Cut(name, ".")
		data, err := os.ReadFile(filepath.Join(dir, "crds", group+"_"+plural+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(data, &crd); err != nil {
			t.Fatal(err)
		}
		if _, err := crds.Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	exportURL := fmt.Sprintf("http://127.0.0.1:%d/export", procs.FreePort(t))
	c := runCLI(t, t.TempDir(), cliBinary, []string{"--kubeconfig", cons.AdminKubeconfigPath(), "--skip-konnector", exportURL})
	if code := c.Wait(t, time.Minute); code != 1 {
		t.Fatalf("exit code %d, want 1:\n%s", code, c.Stderr.String())
	}
	for _, want := range []string{"no protocol generation fits this cluster", "kbind v2's CRDs (" + strings.Join(apply.KbindV2CRDs, ", ") + ")",
		"does not bind through yet", "leave out --skip-konnector"} {
		if !strings.Contains(c.Stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, c.Stderr.String())
		}
	}
	t.Logf("command output:\n%s", c.Stderr.String())
	if strings.Contains(c.Stderr.String(), "connection refused") {
		t.Errorf("the provider was asked:\n%s", c.Stderr.String())
	}
}

// kbindV2Release is the folder of the released kbind v2.0.0-rc4, a
// sibling of kube-bind's releases (konnector.PeersEnv).
func kbindV2Release(t *testing.T) string {
	t.Helper()
	peers := os.Getenv(konnector.PeersEnv)
	if peers == "" {
		peers = filepath.Join(procs.RepoRoot(), "peers")
	} else if _, err := os.Stat(filepath.Join(peers, "SHA256SUMS")); err == nil {
		peers = filepath.Dir(peers) // one release's folder
	}
	dir := filepath.Join(peers, "kbind-v2.0.0-rc4")
	if _, err := os.Stat(filepath.Join(dir, "crds")); err != nil {
		t.Fatalf("kbind v2.0.0-rc4's CRDs: %v (set %s to the folder holding kbind-v2.0.0-rc4)", err, konnector.PeersEnv)
	}
	return dir
}
