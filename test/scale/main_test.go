// Package scale measures the backend with many consumers on one provider
// cluster: a real kube-apiserver with etcd and kube-controller-manager, the
// objects of each bind made by binding.Provisioner itself (what the
// backend calls when a user presses Bind; a browser per consumer would be
// far too slow), one APIServiceExportRequest per consumer as its
// konnector makes it, and two backend replicas as processes.
//
// KUBE_BIND_SCALE_CONSUMERS sets how many consumers (default 200, what CI
// runs); the figures in README.md come from a run with 10000. See
// README.md for the method, docs/scale.md for what the figures mean.
package scale

import (
	"os"
	"testing"

	"github.com/kbprovider/backend/internal/testutil/backendproc"
)

func TestMain(m *testing.M) {
	os.Exit(backendproc.RunMain(m))
}
