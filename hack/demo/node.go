package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kbprovider/backend/internal/client/apply"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
	"github.com/kbprovider/backend/internal/localenv/node"
	"github.com/kbprovider/backend/internal/localenv/procs"
)

// With --node the provider cluster is a one-node cluster (internal/
// localenv/node) and the backend is the chart's two pods, reached through
// their Service at a fixed address: what a provider runs. The consumer
// cluster stays a control plane without a node (one node per machine), so
// the konnector still runs here as a process; test/node runs it as a pod.
const (
	nodeRelease    = "kbb"
	nodeNamespace  = "kube-bind"
	nodeServiceIP  = "10.0.0.200"
	nodeBackendImg = "kbb.local/kube-bind-backend:demo"
)

// startNode starts the provider's one-node cluster with the images it runs.
func (d *demo) startNode(ctx context.Context) error {
	static := filepath.Join(filepath.Dir(d.opts.backendBinary), "backend-static")
	images := []node.Image{{Name: nodeBackendImg, Files: map[string]string{"/backend": static},
		Dirs: []string{"/tmp"}, Entrypoint: []string{"/backend"}, User: "65532:65532"}}
	for release, name := range map[string]string{konnector.ReleasedVersion: apply.DefaultKonnector, konnector.ReleasedV1alpha2: apply.DefaultKonnectorV1alpha2} {
		if k, err := konnector.ReleasedPathOf(release, "konnector"); err == nil {
			images = append(images, node.Image{Name: name, Files: map[string]string{"/konnector": k}, Entrypoint: []string{"/konnector"}, User: "65532:65532"})
		}
	}
	n, err := node.Start(ctx, node.Options{
		ControlPlane: controlplane.Options{BinDir: d.opts.binDir, Dir: d.path("controlplane")},
		Images:       images,
		Dir:          d.path("node"),
	})
	if err != nil {
		return fmt.Errorf("the node: %w", err)
	}
	d.node = n
	d.cp = n.ControlPlane()
	tm := n.Timings()
	d.step("provider cluster with a node up at %s in %s (node Ready %s after containerd started; logs: %s)",
		d.cp.Host(), tm.Total.Round(10*time.Millisecond), tm.NodeReady.Round(10*time.Millisecond), d.path("node"))
	return nil
}

// oidcAddressOnNode is the identity provider's address in node mode: the
// node's address (pods cannot reach the host's loopback), the port of
// --oidc-address.
func (d *demo) oidcAddressOnNode() (string, error) {
	_, port, err := net.SplitHostPort(d.opts.oidcAddress)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(node.IP, port), nil
}

// installChart installs the chart into the node's cluster with its default
// values (two replicas) and waits for both pods to be Ready; then the
// example APIs, and quotas that count kube-bind objects.
func (d *demo) installChart(ctx context.Context, clientSecret string) error {
	d.baseURL = "http://" + nodeServiceIP
	args := []string{"upgrade", "--install", nodeRelease, filepath.Join(procs.RepoRoot(), "charts", "kube-bind-backend"),
		"--kubeconfig", d.cp.AdminKubeconfigPath(), "--namespace", nodeNamespace, "--create-namespace", "--wait", "--timeout", "3m"}
	for _, s := range []string{
		"externalURL=" + d.baseURL,
		"prettyName=" + d.opts.prettyName,
		"oidc.issuerURL=" + d.idp.IssuerURL,
		"oidc.clientID=" + d.idp.ClientID,
		"oidc.clientSecret=" + clientSecret,
		"image.repository=" + strings.Split(nodeBackendImg, ":")[0],
		"image.tag=" + strings.Split(nodeBackendImg, ":")[1],
		"image.pullPolicy=Never",
		"service.clusterIP=" + nodeServiceIP,
		"providerCluster.externalAddress=" + d.cp.Host(),
	} {
		args = append(args, "--set", s)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(d.cp.BinDir(), "helm"), args...)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+d.path("helm/config"), "HELM_CACHE_HOME="+d.path("helm/cache"),
		"HELM_DATA_HOME="+d.path("helm/data"), "HELM_NO_PLUGINS=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t := time.Now()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("helm install: %w\n%s", err, out.String())
	}
	d.step("installed the chart (two backend pods Ready) in %s; the backend's Service is %s", since(t), d.baseURL)

	admin := d.cp.AdminConfig()
	client, err := apiextensionsclient.NewForConfig(admin)
	if err != nil {
		return err
	}
	crdClient := client.ApiextensionsV1().CustomResourceDefinitions()
	for _, a := range exampleAPIs {
		if _, err := crdClient.Create(ctx, exampleapis.CRD(a), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		if err := exampleapis.WaitEstablished(ctx, crdClient, a.Name()); err != nil {
			return err
		}
	}
	if err := exampleapis.AwaitQuotaCounting(ctx, d.cp); err != nil {
		return err
	}
	d.step("created the example APIs %s", describeAPIs())
	return nil
}

// statusHint says where the backend's status page is.
func (d *demo) statusHint() string {
	if d.node == nil {
		return fmt.Sprintf("backend status, metrics: http://%s/statusz, /metrics", d.opts.diagAddress)
	}
	return fmt.Sprintf("backend: the chart's two pods, kubectl --kubeconfig %s -n %s get pods; status on their diagnostics port 9090",
		shellQuote(d.cp.AdminKubeconfigPath()), nodeNamespace)
}
