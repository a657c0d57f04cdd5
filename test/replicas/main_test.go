// Package replicas runs several backend processes that share sessions with
// --session-store=ring (internal/sessions/ring over
// internal/sessions/kube): outcomes, first deliveries and single-use marks
// are Secrets in the provider cluster, a session's poll admission (nonces
// and pace) is kept in memory by its owner on a groupcache ring of the
// replicas, and an owner that does not answer within a second is skipped.
//
// The provider cluster is a real control plane (internal/testutil/
// controlplane), the identity provider a real OpenID Connect provider
// (internal/localenv/oidcprovider), and each replica a real process of
// cmd/backend (internal/testutil/backendproc) on loopback, killed, frozen,
// cut off or restarted as a crashed pod, a stopped node, a partition or a
// rolling update would do it:
//
//   - any replica answers any request (TestAnyReplicaAnswers);
//   - every replica killed at once after the binds loses nothing
//     (TestAllReplicasKilledAfterBind);
//   - a frozen owner, or one whose peer port drops packets, is skipped
//     within seconds (TestFrozenReplica, TestDroppedPeerTraffic);
//   - replicas that refuse each other's TLS keep what can be kept
//     (TestReplicasRefuseEachOther);
//   - a rolling restart that rotates the peer key loses no session
//     (TestRollingRestartRotatesKey);
//   - a delivered response is never served after its grace period, also
//     after restarts (TestReplayAfterGrace);
//   - a flood of session creations costs no memory and does not starve
//     other clients (TestSessionFlood);
//   - an API server restart is ridden out (TestAPIServerRestart), and a
//     replica whose view of the records lags never answers 503
//     (TestReplicaWithLaggingRecords);
//   - a long poll held on one replica hears of a bind on another at once
//     (TestLongPollLatency);
//   - replicas whose clocks are 5 and 10 s apart admit each poll nonce
//     once, without falling back, and report their offset from the API
//     server (TestSkewedClocks);
//   - the released kubectl-bind v0.8.2 logs in on one replica and binds
//     on the other, in both its flows, and its token survives restarts
//     and a key rotation but not another deployment
//     (TestReleasedCLIAcrossReplicas).
package replicas

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
)

func TestMain(m *testing.M) {
	os.Exit(backendproc.RunMain(m))
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
		clusterErr = exampleapis.Prepare(ctx, cp, exampleapis.MangoDB)
	})
	if clusterErr != nil {
		t.Fatalf("preparing the control plane: %v", clusterErr)
	}
}
