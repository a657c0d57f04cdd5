package node

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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/client/apply"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/node"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
)

// widgetAPI is bound into the node's cluster by the consumer-side test; the
// chart's provider side there serves MangoDB, which this must not meet.
var widgetAPI = exampleapis.API{Group: "widgets.example.com", Plural: "widgets", Kind: "Widget", Exported: true}

// TestKonnectorAsPod: our client binds into the node's cluster as the
// consumer cluster, and the konnector Deployment it creates runs as a pod
// (the released image as deployed: its RBAC, probes, read-only root,
// non-root) and syncs an object both ways. The provider side is a control
// plane of its own on the node's address (pods reach it there) and the
// backend as a process: one node per machine, and the node's cluster
// already plays the chart's provider.
func TestKonnectorAsPod(t *testing.T) {
	n := getNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	provider, err := controlplane.Start(ctx, controlplane.Options{BinDir: n.ControlPlane().BinDir(), AdvertiseAddress: node.IP})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(provider.Stop)
	if err := exampleapis.Prepare(ctx, provider, widgetAPI); err != nil {
		t.Fatal(err)
	}
	port := procs.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	idp := oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{base + "/callback"}, Users: []oidcprovider.User{alice}})
	backendproc.Start(t, base, backendproc.BrowserArgs(t, port, base, idp, provider.AdminKubeconfigPath(), "Widgets Inc.", "kb-widgets-"), 90*time.Second)

	consumerCP := n.ControlPlane()
	c := procs.Start(t, t.TempDir(), cliBinary, []string{"--kubeconfig", consumerCP.AdminKubeconfigPath(), "--wait-timeout", "4m", base + "/export"}, "KUBECONFIG=")
	start := time.Now()
	if err := bindAt(ctx, idp, c.URL(t), base, widgetAPI.Name()); err != nil {
		t.Fatal(err)
	}
	if code := c.Wait(t, 5*time.Minute); code != 0 {
		t.Fatalf("kube-bind-poll: exit %d:\n%s", code, c.Stderr.String())
	}
	t.Logf("FIGURE bind into the node's cluster with the konnector as a pod: %v", time.Since(start).Round(time.Millisecond))

	kube := kubernetes.NewForConfigOrDie(consumerCP.AdminConfig())
	d, err := kube.AppsV1().Deployments(apply.Namespace).Get(ctx, apply.KonnectorName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// As kubectl rollout status judges it: the Deployment may have been
	// updated after it was made, and an old pod may still be the
	// available one.
	waitFor(t, 2*time.Minute, "the konnector Deployment's rollout to complete", func() bool {
		d, err = kube.AppsV1().Deployments(apply.Namespace).Get(ctx, apply.KonnectorName, metav1.GetOptions{})
		if err != nil || d.Status.ObservedGeneration < d.Generation {
			return false
		}
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		st := d.Status
		return st.UpdatedReplicas == want && st.Replicas == want && st.AvailableReplicas == want && st.ReadyReplicas == want
	})
	t.Logf("the konnector runs as a pod: %s", d.Spec.Template.Spec.Containers[0].Image)
	checkKonnectorPod(t, kube, d)
	konnector.SyncsBothWays(t, consumerCP.AdminConfig(), provider.AdminConfig(), widgetAPI, "w1", "kb-widgets-")
}

// checkKonnectorPod checks the konnector's pod: Ready through its probes,
// the image as deployed, its ServiceAccount, non-root, read-only root.
func checkKonnectorPod(t *testing.T, kube kubernetes.Interface, d *appsv1.Deployment) {
	t.Helper()
	// Right after the Deployment counted it available, the pod has been
	// seen not Ready (on a busy machine a probe can fail once): the pod
	// must be Ready through its probe within a minute.
	var pod *corev1.Pod
	waitFor(t, time.Minute, "a Ready konnector pod", func() bool {
		pods, err := kube.CoreV1().Pods(apply.Namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod = nil
		for i := range pods.Items {
			if strings.HasPrefix(pods.Items[i].Name, apply.KonnectorName+"-") && pods.Items[i].DeletionTimestamp == nil {
				pod = &pods.Items[i]
			}
		}
		return pod != nil && len(pod.Status.ContainerStatuses) == 1 && pod.Status.ContainerStatuses[0].Ready
	})
	c := pod.Spec.Containers[0]
	if c.Image != d.Spec.Template.Spec.Containers[0].Image || !strings.Contains(c.Image, "konnector:v0.") {
		t.Errorf("konnector pod runs %s", c.Image)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil {
		t.Errorf("konnector pod without an HTTP readiness probe")
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("konnector root file system not read-only: %+v", c.SecurityContext)
	}
	if pod.Spec.ServiceAccountName != apply.KonnectorName {
		t.Errorf("konnector pod runs as ServiceAccount %q", pod.Spec.ServiceAccountName)
	}
	// The process runs as a non-root user: its status in /proc says so.
	uid := processUID(t, pod)
	if uid == "0" || uid == "" {
		t.Errorf("the konnector's process runs as uid %q", uid)
	}
}

// processUID is the real uid of the pod's container process, from the
// pod's cgroup on the node.
func processUID(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	var uid string
	_ = filepath.WalkDir("/sys/fs/cgroup/pids/kbb-node", func(path string, e os.DirEntry, err error) error {
		if err != nil || e.Name() != "cgroup.procs" || !strings.Contains(path, "pod"+string(pod.UID)) {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, pid := range strings.Fields(string(b)) {
			status, _ := os.ReadFile("/proc/" + pid + "/status")
			cmdline, _ := os.ReadFile("/proc/" + pid + "/cmdline")
			if !strings.Contains(string(cmdline), "konnector") {
				continue
			}
			for _, line := range strings.Split(string(status), "\n") {
				if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
					uid = f[1]
				}
			}
		}
		return nil
	})
	return uid
}
