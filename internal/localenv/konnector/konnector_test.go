package konnector_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/procs"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

// Two konnectors at once, each on its own :8080, reach the consumer API
// server through the bridge (they install the APIServiceBinding CRD), keep
// running, and are gone after Stop.
func TestTwoKonnectorsRunSideBySideAndReachTheAPIServer(t *testing.T) {
	cp := controlplane.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kube := kubernetes.NewForConfigOrDie(cp.AdminConfig())
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-bind"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	a := run(t, konnector.Options{Kubeconfig: cp.AdminKubeconfigPath()})
	b := run(t, konnector.Options{Kubeconfig: cp.AdminKubeconfigPath(), Args: []string{"--lease-name", "other"}})

	crds := apiextensionsclient.NewForConfigOrDie(cp.AdminConfig()).ApiextensionsV1().CustomResourceDefinitions()
	for {
		_, err := crds.Get(ctx, "apiservicebindings.kube-bind.io", metav1.GetOptions{})
		if err == nil {
			break
		}
		for _, k := range []*konnector.Konnector{a, b} {
			if done, werr := k.Exited(); done {
				t.Fatalf("a konnector exited: %v\n%s", werr, k.Log())
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("the konnectors did not install the APIServiceBinding CRD: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Both got past starting their healthz server on :8080 (a clash
	// panics at once); give a late panic a moment to show.
	time.Sleep(2 * time.Second)
	for i, k := range []*konnector.Konnector{a, b} {
		if done, err := k.Exited(); done {
			t.Fatalf("konnector %d exited: %v\n%s", i, err, k.Log())
		}
		if strings.Contains(k.Log(), "address already in use") {
			t.Fatalf("konnector %d: port clash:\n%s", i, k.Log())
		}
	}
	t.Logf("konnector log (first one):\n%s", a.Log())

	pid := a.Pid()
	a.Stop()
	if done, _ := a.Exited(); !done {
		t.Fatal("Stop returned with the konnector still running")
	}
	if procs.Alive(pid) {
		t.Fatalf("process %d still alive after Stop", pid)
	}
	if done, _ := b.Exited(); done {
		t.Fatalf("stopping one konnector ended the other:\n%s", b.Log())
	}
}

// run starts a konnector and stops it when the test ends.
func run(t *testing.T, o konnector.Options) *konnector.Konnector {
	t.Helper()
	k, err := konnector.Run(o)
	if err != nil {
		t.Fatalf("konnector: %v", err)
	}
	t.Cleanup(k.Stop)
	return k
}

func TestRefusesServersNotOnLoopback(t *testing.T) {
	k, err := konnector.Run(konnector.Options{Kubeconfig: writeKubeconfig(t, "https://10.1.2.3:6443")})
	if err == nil {
		k.Stop()
		t.Fatal("Run with a non-loopback server succeeded")
	}
	if !strings.Contains(err.Error(), "not on loopback") {
		t.Fatalf("Run with a non-loopback server: got %q, want a message naming loopback", err)
	}
}

func TestReleasedBinariesMatchTheirSums(t *testing.T) {
	for _, b := range []struct{ release, name string }{
		{konnector.ReleasedVersion, "konnector"}, {konnector.ReleasedVersion, "kubectl-bind"},
		{konnector.ReleasedV1alpha2, "konnector"}, {konnector.ReleasedV1alpha2, "kubectl-bind"},
		{konnector.ReleasedV1alpha2, "backend"},
	} {
		p, err := konnector.ReleasedPathOf(b.release, b.name)
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(p)
		if err != nil || st.Mode()&0o111 == 0 {
			t.Fatalf("%s: %v (mode %v)", p, err, st)
		}
	}
}

func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	p := t.TempDir() + "/kubeconfig"
	data := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, server)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
