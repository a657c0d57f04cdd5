package node

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// writeConfigs writes containerd's, the CNI's, the kubelet's and
// kube-proxy's configuration into the node's folder.
func (n *Node) writeConfigs() error {
	ports, err := freePorts(4)
	if err != nil {
		return err
	}
	cniConf := filepath.Join(n.dir, "net.d")
	if err := os.MkdirAll(cniConf, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		// restrict_oom_score_adj: these machines withhold CAP_SYS_RESOURCE,
		// without it every sandbox fails to start.
		"containerd.toml": fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, filepath.Join(dataDir, "containerd"), filepath.Join(stateDir, "containerd"), containerdSocket,
			filepath.Join(dataDir, "opt"), PauseImage, cniBinDir, cniConf),
		// ipMasq off, and a route to the Service range only (the node's
		// address is on the pods' own link): pods have no way beyond
		// this machine.
		// hairpinMode: a pod reaching its own Service may land on itself.
		"net.d/10-kbb-node.conflist": fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": %q,
  "plugins": [{
    "type": "bridge",
    "bridge": %q,
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "dataDir": %q,
      "ranges": [[{"subnet": %q, "gateway": %q}]],
      "routes": [{"dst": %q}]
    }
  }]
}
`, cniNetwork, Bridge, filepath.Join(dataDir, "cni-ipam"), PodCIDR, IP, ServiceCIDR),
		// failCgroupV1: these machines have cgroup v1 only.
		// makeIPTablesUtilChains off: no iptables chains of its own.
		// resolvConf "": pods must not reach the machine's resolver (an
		// address outside it). Image GC off: images cannot be pulled again.
		"kubelet.yaml": fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
containerRuntimeEndpoint: unix://%s
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %q}
authorization: {mode: Webhook}
makeIPTablesUtilChains: false
resolvConf: ""
failSwapOn: false
protectKernelDefaults: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 8760h
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
fileCheckFrequency: 5s
volumeStatsAggPeriod: 0s
maxPods: 50
podPidsLimit: 4096
registerNode: true
`, cgroupRoot, containerdSocket, IP, ports[0], ports[1], filepath.Join(n.cp.LogDir(), "ca.crt")),
		// NodePorts only on the node's own address, never the machine's
		// external one; no conntrack sysctls.
		"kube-proxy.yaml": fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: %q
hostnameOverride: %s
bindAddress: %s
clusterCIDR: %s
nodePortAddresses: [%q]
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, n.cp.AdminKubeconfigPath(), Name, IP, PodCIDR, IP+"/32", ports[2], ports[3]),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(n.dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// freePorts are n distinct free ports.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		p, err := procs.UnusedPort()
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	return ports, nil
}
