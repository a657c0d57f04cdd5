// Package node runs the product as it is deployed, on a real one-node
// cluster (internal/localenv/node) shared by the package's tests: the chart
// installed with helm, its backend pods ready through their real probes,
// binds through the Service, a rolling upgrade under load, and a frozen
// pod and a pod whose packets are dropped.
//
// The node needs root, containerd, runc, the CNI plugins and nftables
// (hack/install-test-deps.sh) and the kubelet, kube-scheduler and
// kube-proxy (hack/install-test-binaries.sh). Where it cannot come up, the
// tests skip saying why, or fail when KUBE_BIND_TEST_REQUIRE_NODE=1
// (hack/test.sh sets it when run as root). At the end the network guard
// must still be in place with every counter at zero, and the teardown must
// leave nothing behind; otherwise the package fails.
package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/client/apply"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/node"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
)

var (
	// cliBinary is our client, cmd/kube-bind-poll.
	cliBinary string
	nodeOnce  sync.Once
	theNode   *node.Node
	nodeErr   error
	// backendVersion is stamped into the backend image.
	backendVersion = "v0.0.0-node-test"
)

func TestMain(m *testing.M) {
	code := backendproc.Main(func() int {
		cli, cleanup, err := procs.Build("./cmd/kube-bind-poll")
		if err != nil {
			fmt.Fprintln(os.Stderr, "building kube-bind-poll:", err)
			return 1
		}
		defer cleanup()
		cliBinary = cli
		return m.Run()
	})
	if theNode != nil {
		drops, err := node.GuardDrops()
		switch {
		case err != nil:
			fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
			code = 1
		case drops > 0:
			fmt.Fprintf(os.Stderr, "FAIL: the network guard dropped %d packets that would have left this machine:\n%s\n", drops, node.GuardListing())
			code = 1
		default:
			fmt.Fprintf(os.Stderr, "node: the network guard dropped no packet\n")
		}
		if err := theNode.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
			code = 1
		} else if left := node.Leftovers(); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: the node's teardown left %s\n", strings.Join(left, ", "))
			code = 1
		} else if os.Getenv("KUBE_BIND_TEST_KEEP_LOGS") == "" && code == 0 {
			os.RemoveAll(theNode.Dir())
		} else {
			fmt.Fprintf(os.Stderr, "node: logs kept in %s\n", theNode.Dir())
		}
	}
	os.Exit(code)
}

// getNode returns the package's node, started on first use with the
// backend's image. Where no node can run it skips (or fails with
// KUBE_BIND_TEST_REQUIRE_NODE=1), saying why.
func getNode(t *testing.T) *node.Node {
	t.Helper()
	if err := node.Preflight(); err != nil {
		if os.Getenv(node.RequireEnv) == "1" {
			t.Fatalf("no node can run here (%s=1): %v", node.RequireEnv, err)
		}
		t.Skipf("SKIP: no node can run here: %v (set %s=1 to make this a failure)", err, node.RequireEnv)
	}
	nodeOnce.Do(func() {
		images, cleanup, err := productImages()
		if err != nil {
			nodeErr = err
			return
		}
		defer cleanup()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		theNode, nodeErr = node.Start(ctx, node.Options{Images: images})
		if nodeErr == nil {
			tm := theNode.Timings()
			fmt.Fprintf(os.Stderr, "node: up in %v (control plane %v, images %v, node Ready %v after containerd started)\n",
				tm.Total.Round(time.Millisecond), tm.ControlPlane.Round(time.Millisecond), tm.Images.Round(time.Millisecond), tm.NodeReady.Round(time.Millisecond))
		}
	})
	if nodeErr != nil {
		t.Fatalf("node: %v", nodeErr)
	}
	return theNode
}

const backendImage = "kbb.local/kube-bind-backend:" + "node-test"

// productImages builds the images the tests run: the backend as the
// Dockerfile builds it (test/image checks that build) on an empty base,
// and the released konnectors of both generations under the names our
// client deploys them by.
func productImages() ([]node.Image, func(), error) {
	dir, err := os.MkdirTemp("", "kbb-node-images-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	bin := filepath.Join(dir, "backend")
	if err := buildLikeDockerfile(bin); err != nil {
		cleanup()
		return nil, nil, err
	}
	images := []node.Image{{
		Name:       backendImage,
		Files:      map[string]string{"/backend": bin},
		Dirs:       []string{"/tmp"},
		Entrypoint: []string{"/backend"},
		User:       "65532:65532",
	}}
	for release, name := range map[string]string{
		konnector.ReleasedVersion:  apply.DefaultKonnector,
		konnector.ReleasedV1alpha2: apply.DefaultKonnectorV1alpha2,
	} {
		k, err := konnector.ReleasedPathOf(release, "konnector")
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		images = append(images, node.Image{Name: name, Files: map[string]string{"/konnector": k}, Entrypoint: []string{"/konnector"}, User: "65532:65532"})
	}
	return images, cleanup, nil
}
