// Package replicas runs several backend processes on loopback that share
// sessions through the hashring (docs/sessions-hashring.md): any replica
// answers any request, a dead replica's sessions go on at their backups,
// a replica added later joins the ring and takes its sessions over, and a
// rolling restart or a crash loses no session (TestRollingRestartAndCrash). The
// provider cluster is a real control plane, the identity provider a real
// OpenID Connect provider.
package replicas

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
	"github.com/kbprovider/backend/internal/testutil/controlplane"
)

func TestMain(m *testing.M) {
	os.Exit(backendproc.Main(func() int { return controlplane.RunMain(m) }))
}

const (
	namespacePrefix = "kb-replicas-"
	exportedCRD     = "mangodbs.mangodb.com" // exampleapis.MangoDB
)

var (
	clusterOnce sync.Once
	clusterErr  error
)

// prepareCluster installs the kube-bind CRDs, the consumer ClusterRoles and
// one exported CRD.
func prepareCluster(t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	clusterOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin := cp.AdminConfig()
		clusterErr = exampleapis.Prepare(ctx, admin, exampleapis.MangoDB)
	})
	if clusterErr != nil {
		t.Fatalf("preparing the control plane: %v", clusterErr)
	}
}
