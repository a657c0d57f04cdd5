// Package consumer shows kube-bind-poll binding for real: a provider
// control plane with the backend as a separate process, the real OpenID
// Connect provider and chromium, and a second control plane as the
// consumer cluster, where the released konnector (v0.4.8 for v1alpha1
// binds, v0.8.2 for v1alpha2) runs as a process with the token of the
// ServiceAccount the command created (so the RBAC the command wrote is all
// it has).
package consumer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
)

var (
	cliBinary string // kube-bind-poll, also installed as kubectl-bind_poll in cliDir
	cliDir    string
)

func TestMain(m *testing.M) {
	code := func() int {
		cli, cleanupCLI, err := procs.Build("./cmd/kube-bind-poll")
		if err != nil {
			fmt.Fprintln(os.Stderr, "building kube-bind-poll:", err)
			return 1
		}
		defer cleanupCLI()
		cliBinary, cliDir = cli, filepath.Dir(cli)
		if err := os.Link(cli, filepath.Join(cliDir, "kubectl-bind_poll")); err != nil {
			fmt.Fprintln(os.Stderr, "installing the kubectl plugin:", err)
			return 1
		}
		return backendproc.RunMain(m)
	}()
	os.Exit(code)
}

// Users of the test identity provider; only group "binders" may bind.
var alice = oidcprovider.Alice

const (
	namespacePrefix = "kb-consumer-"
	prettyName      = "MangoDB Inc."
)

// Example APIs: MangoDB and Redis for the main flow, the others each for
// one test, so tests do not see each other's bindings.
var (
	queueAPI  = exampleapis.API{Group: "queue.example.com", Plural: "queues", Kind: "Queue", Exported: true}
	bucketAPI = exampleapis.API{Group: "storage.example.com", Plural: "buckets", Kind: "Bucket", Exported: true}
	widgetAPI = exampleapis.API{Group: "widgets.example.com", Plural: "widgets", Kind: "Widget", Exported: true}
	gadgetAPI = exampleapis.API{Group: "gadgets.example.com", Plural: "gadgets", Kind: "Gadget", Exported: true}
)

// env is the provider side: control plane, identity provider, backend.
type env struct {
	provider  *controlplane.ControlPlane
	consumer  *controlplane.ControlPlane
	idp       *oidcprovider.Provider
	baseURL   string
	exportURL string
}

// startEnv prepares both clusters and starts an identity provider and a
// backend that stop when t ends.
func startEnv(t *testing.T) *env {
	t.Helper()
	provider := controlplane.Get(t)
	consumer := controlplane.Consumer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := exampleapis.Prepare(ctx, provider,
		exampleapis.MangoDB, exampleapis.Redis, exampleapis.SecretThing, queueAPI, bucketAPI, widgetAPI, gadgetAPI); err != nil {
		t.Fatalf("preparing the provider cluster: %v", err)
	}
	port := procs.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	idp := oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{base + "/callback"}, Users: []oidcprovider.User{alice}})
	backendproc.Start(t, base, backendproc.BrowserArgs(t, port, base, idp, provider.AdminKubeconfigPath(), prettyName, namespacePrefix), 90*time.Second)
	return &env{provider: provider, consumer: consumer, idp: idp, baseURL: base, exportURL: base + "/export"}
}
