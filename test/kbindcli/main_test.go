// Package kbindcli binds with the tools consumers install today, the
// released kubectl-bind and konnector v0.8.2 (kube-bind.io/v1alpha2),
// against our backend: the backend as a separate process on a real
// provider control plane, the real OpenID Connect provider and chromium
// for the browser parts, and a second control plane as the consumer
// cluster, where the konnector runs as a process. BenchmarkBindToProvider
// also runs upstream's own backend v0.8.2, on clusters of its own, for
// comparison (README.md).
package kbindcli

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
	"github.com/kbprovider/backend/internal/testutil/chromium"
)

func TestMain(m *testing.M) {
	os.Exit(backendproc.RunMain(m))
}

// Users of the test identity provider; only group "binders" may bind.
var (
	alice   = oidcprovider.Alice
	mallory = oidcprovider.Mallory
)

const (
	namespacePrefix = "kb-kbind-"
	prettyName      = "MangoDB Inc."
)

// The example APIs, one per test so that tests do not see each other's
// bindings.
var (
	widgetAPI = exampleapis.API{Group: "widgets.example.com", Plural: "widgets", Kind: "Widget", Exported: true}
	gadgetAPI = exampleapis.API{Group: "gadgets.example.com", Plural: "gadgets", Kind: "Gadget", Exported: true}
	// sprocketAPI is bound through a template that claims ConfigMaps.
	sprocketAPI = exampleapis.API{Group: "sprockets.example.com", Plural: "sprockets", Kind: "Sprocket", Exported: true}
	// gizmoAPI is offered twice on the selection page: by its CRD and by
	// a template that claims ConfigMaps.
	gizmoAPI = exampleapis.API{Group: "gizmos.example.com", Plural: "gizmos", Kind: "Gizmo", Exported: true}
)

// env is one set-up: both clusters, the identity provider, the backend.
type env struct {
	provider *controlplane.ControlPlane
	consumer *controlplane.ControlPlane
	idp      *oidcprovider.Provider
	baseURL  string
}

// startEnv prepares both clusters and starts an identity provider and a
// backend that stop when t ends.
func startEnv(t testing.TB) *env {
	t.Helper()
	provider := controlplane.Get(t)
	consumer := controlplane.Consumer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := exampleapis.Prepare(ctx, provider, exampleapis.MangoDB, widgetAPI, gadgetAPI, sprocketAPI, gizmoAPI); err != nil {
		t.Fatalf("preparing the provider cluster: %v", err)
	}
	port := procs.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	idp := oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{base + "/callback"}, Users: []oidcprovider.User{alice, mallory}})
	backendproc.Start(t, base, backendproc.BrowserArgs(t, port, base, idp, provider.AdminKubeconfigPath(), prettyName, namespacePrefix), 90*time.Second)
	return &env{provider: provider, consumer: consumer, idp: idp, baseURL: base}
}

// runCLI runs the released kubectl-bind with a HOME of its own (a machine
// with no local state) and its kube-bind config in it.
func runCLI(t testing.TB, home string, args ...string) *procs.Command {
	t.Helper()
	return konnector.RunCLI(t, konnector.ReleasedV1alpha2, home, args...)
}

// login runs kubectl-bind login and signs user in with chromium.
func login(t testing.TB, e *env, home string, user oidcprovider.User) {
	t.Helper()
	chromium.LoginCLI(t, konnector.ReleasedV1alpha2, home, e.baseURL, user)
}

// startKonnector runs the released konnector v0.8.2 against the consumer
// cluster.
func startKonnector(t testing.TB, e *env) *konnector.Konnector {
	t.Helper()
	return konnector.StartReleased(t, konnector.ReleasedV1alpha2, e.consumer.AdminKubeconfigPath(), e.provider.Host())
}
