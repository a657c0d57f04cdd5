// Package e2e drives both binding flows end to end against real parts: the
// backend as a separate process, a real kube-apiserver with etcd and
// kube-controller-manager, a real OpenID Connect provider, and a real
// chromium for the pages.
package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/deploy/crds"
	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/testutil/controlplane"
	"github.com/kbprovider/backend/internal/testutil/oidcprovider"
)

var backendBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "e2e-backend-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	backendBinary = filepath.Join(dir, "kube-bind-backend")
	build := exec.Command("go", "build", "-o", backendBinary, "./cmd/backend")
	build.Dir = repoRoot()
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the backend:", err)
		os.Exit(1)
	}
	code := controlplane.RunMain(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Users of the test identity provider. Only members of group "binders"
// may bind (the backend runs with --oidc-allowed-groups=binders).
var (
	alice   = oidcprovider.User{Name: "alice", Password: "alice-pw", Email: "alice@example.com", Groups: []string{"binders"}}
	bob     = oidcprovider.User{Name: "bob", Password: "bob-pw", Email: "bob@example.com", Groups: []string{"binders"}}
	carol   = oidcprovider.User{Name: "carol", Password: "carol-pw", Email: "carol@example.com", Groups: []string{"binders"}}
	dave    = oidcprovider.User{Name: "dave", Password: "dave-pw", Email: "dave@example.com", Groups: []string{"binders"}}
	mallory = oidcprovider.User{Name: "mallory", Password: "mallory-pw", Email: "mallory@example.com", Groups: []string{"visitors"}}
)

const (
	namespacePrefix = "kb-e2e-"
	prettyName      = "MangoDB Inc."
)

// env is one running set-up: control plane, identity provider, backend.
type env struct {
	cp      *controlplane.ControlPlane
	idp     *oidcprovider.Provider
	baseURL string
	kube    kubernetes.Interface
}

var (
	clusterOnce sync.Once
	clusterErr  error
)

// prepareCluster installs the kube-bind CRDs, the consumer ClusterRoles and
// three example CRDs: two exported, one not.
func prepareCluster(t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	clusterOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin := cp.AdminConfig()
		if clusterErr = crds.Install(ctx, admin); clusterErr != nil {
			return
		}
		if clusterErr = binding.InstallClusterRoles(ctx, admin); clusterErr != nil {
			return
		}
		ext := apiextensionsclient.NewForConfigOrDie(admin)
		for _, c := range []struct {
			group, plural, kind string
			exported            bool
		}{
			{"mangodb.com", "mangodbs", "MangoDB", true},
			{"cache.example.com", "redises", "Redis", true},
			{"internal.example.com", "secretthings", "SecretThing", false},
		} {
			crd := exampleCRD(c.group, c.plural, c.kind, c.exported)
			_, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				clusterErr = err
				return
			}
			clusterErr = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
				if err != nil {
					return false, nil
				}
				for _, cond := range got.Status.Conditions {
					if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
						return true, nil
					}
				}
				return false, nil
			})
			if clusterErr != nil {
				return
			}
		}
	})
	if clusterErr != nil {
		t.Fatalf("preparing the control plane: %v", clusterErr)
	}
}

func exampleCRD(group, plural, kind string, exported bool) *apiextensionsv1.CustomResourceDefinition {
	labels := map[string]string{}
	if exported {
		labels[binding.ExportedLabel] = "true"
	}
	preserve := true
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group, Labels: labels},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: plural, Kind: kind, ListKind: kind + "List", Singular: strings.ToLower(kind)},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1alpha1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: &preserve,
				}},
			}},
		},
	}
}

// backendOptions change how a backend of one test is started.
type backendOptions struct {
	extraArgs []string
}

// startEnv starts an identity provider and a backend process for the test.
func startEnv(t *testing.T, opts backendOptions) *env {
	t.Helper()
	cp := controlplane.Get(t)
	prepareCluster(t, cp)

	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	idp := oidcprovider.Start(t, oidcprovider.Options{
		RedirectURIs: []string{base + "/callback"},
		Users:        []oidcprovider.User{alice, bob, carol, dave, mallory},
	})
	args := []string{
		"--listen-address", fmt.Sprintf("127.0.0.1:%d", port),
		"--external-url", base,
		"--oidc-issuer-url", idp.IssuerURL,
		"--oidc-issuer-client-id", idp.ClientID,
		"--oidc-issuer-client-secret", idp.ClientSecret,
		"--oidc-allowed-groups", "binders",
		"--cookie-signing-key", randomKey(t, 32),
		"--cookie-encryption-key", randomKey(t, 32),
		"--kubeconfig", cp.AdminKubeconfigPath(),
		"--pretty-name", prettyName,
		"--namespace-prefix", namespacePrefix,
		"--consumer-scope", "Namespaced",
		"--poll-interval", "1s",
		"--log-format", "text",
	}
	startBackend(t, append(args, opts.extraArgs...), base)
	return &env{cp: cp, idp: idp, baseURL: base, kube: kubernetes.NewForConfigOrDie(cp.AdminConfig())}
}

// startBackend runs the backend binary until the test ends and waits until
// /readyz says every dependency is there.
func startBackend(t *testing.T, args []string, base string) {
	t.Helper()
	cmd := exec.Command(backendBinary, args...)
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the backend: %v", err)
	}
	// exited is closed when the process is gone; waitErr says how it ended.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("backend logs:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("backend not ready after 60s: %d %s\nlogs:\n%s", resp.StatusCode, body, logs.String())
			}
		}
		select {
		case <-exited:
			t.Fatalf("backend exited: %v\nlogs:\n%s", waitErr, logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend not answering after 60s: %v\nlogs:\n%s", err, logs.String())
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func randomKey(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

// consumerNamespaces lists the provider namespaces made for a user.
func (e *env) consumerNamespaces(t *testing.T, user oidcprovider.User) []string {
	t.Helper()
	list, err := e.kube.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ns := range list.Items {
		if ns.Annotations[binding.AnnotationSubject] == user.Name && strings.HasPrefix(ns.Name, namespacePrefix) {
			names = append(names, ns.Name)
		}
	}
	return names
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
