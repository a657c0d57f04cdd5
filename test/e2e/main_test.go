// Package e2e drives both binding flows end to end against real parts: the
// backend as a separate process, a real kube-apiserver with etcd and
// kube-controller-manager, a real OpenID Connect provider, and a real
// chromium for the pages.
package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
)

func TestMain(m *testing.M) {
	os.Exit(backendproc.RunMain(m))
}

// Users of the test identity provider. Only members of group "binders"
// may bind (the backend runs with --oidc-allowed-groups=binders).
var (
	alice   = oidcprovider.Alice
	bob     = oidcprovider.User{Name: "bob", Password: "bob-pw", Email: "bob@example.com", Groups: []string{"binders"}}
	carol   = oidcprovider.User{Name: "carol", Password: "carol-pw", Email: "carol@example.com", Groups: []string{"binders"}}
	dave    = oidcprovider.User{Name: "dave", Password: "dave-pw", Email: "dave@example.com", Groups: []string{"binders"}}
	mallory = oidcprovider.Mallory
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
		clusterErr = exampleapis.Prepare(ctx, cp, exampleapis.MangoDB, exampleapis.Redis, exampleapis.SecretThing)
	})
	if clusterErr != nil {
		t.Fatalf("preparing the control plane: %v", clusterErr)
	}
}

// backendOptions change how a backend of one test is started.
type backendOptions struct {
	extraArgs []string
	// users are more users of the identity provider, for tests that need
	// users no other test binds as.
	users []oidcprovider.User
}

// startEnv starts an identity provider and a backend process for the test.
func startEnv(t *testing.T, opts backendOptions) *env {
	t.Helper()
	cp := controlplane.Get(t)
	prepareCluster(t, cp)

	port := procs.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	idp := oidcprovider.Start(t, oidcprovider.Options{
		RedirectURIs: []string{base + "/callback"},
		Users:        append([]oidcprovider.User{alice, bob, carol, dave, mallory}, opts.users...),
	})
	args := backendproc.BrowserArgs(t, port, base, idp, cp.AdminKubeconfigPath(), prettyName, namespacePrefix)
	backendproc.Start(t, base, append(args, opts.extraArgs...), 60*time.Second)
	return &env{cp: cp, idp: idp, baseURL: base, kube: kubernetes.NewForConfigOrDie(cp.AdminConfig())}
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
