// Package node runs a one-node Kubernetes cluster on this machine, so that
// the chart and the konnector run as pods, as they are deployed: a control
// plane (internal/localenv/controlplane) on the node's IP, containerd and
// runc from Debian's packages, the CNI bridge plugin, and the kubelet,
// kube-scheduler and kube-proxy (nftables mode) built by
// hack/install-test-binaries.sh. Images are FROM scratch OCI layout tars
// (Image) imported with ctr; there is no registry and no cluster DNS.
//
// It needs root and changes the host: a network guard (nft) goes in first
// and keeps every packet of the node's ranges on this machine; Stop undoes
// everything Start did (processes, container shims, mounts, network
// namespaces, links, nft tables, cgroups, sysctls). containerd, the kubelet
// and CNI use fixed host paths: one node per machine at a time (a lock
// file enforces it).
package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/procs"
)

const (
	// Name is the node's name.
	Name = "kbb-node"
	// IP is the node's address: the pods' gateway on their bridge, made
	// before anything starts (the CNI plugin finds it there). The API
	// server, the kubelet and NodePorts listen on it, and pods reach the
	// host there (never at 127.0.0.1, which is theirs).
	IP = "10.214.0.1"
	// PodCIDR is the pods' range, on the bridge Bridge.
	PodCIDR = "10.214.0.0/24"
	Bridge  = "kbbnode0"
	// ServiceCIDR is the control plane's Service range.
	ServiceCIDR = controlplane.ServiceClusterIPRange

	// PauseImage is the sandbox image containerd starts each pod with.
	PauseImage = "kbb.local/pause:1"

	// stateDir and dataDir are the node's fixed host paths (containerd's
	// socket and state; images, snapshots and the kubelet's root).
	stateDir = "/run/kbb-node"
	dataDir  = "/var/lib/kbb-node"
	// cgroupRoot holds every pod's cgroup, in each v1 hierarchy.
	cgroupRoot = "kbb-node"
	lockFile   = "/run/kbb-node.lock"
	cniNetwork = "kbb-node"

	// RequireEnv, when "1", makes a test fail where the node cannot come
	// up (hack/test.sh sets it when run as root).
	RequireEnv = "KUBE_BIND_TEST_REQUIRE_NODE"
)

// Options configure Start.
type Options struct {
	// ControlPlane configures the cluster's control plane;
	// AdvertiseAddress is set to IP, and the controllers pods need are added.
	ControlPlane controlplane.Options
	// Images are imported before the kubelet starts (the pause image is
	// always made and imported).
	Images []Image
	// Dir receives configuration and logs; "" makes a temporary folder.
	Dir string
}

// Node is a running one-node cluster.
type Node struct {
	cp       *controlplane.ControlPlane
	dir      string
	lock     *os.File
	procs    []*proc // containerd, kubelet, kube-scheduler, kube-proxy
	sysctls  []sysctlValue
	before   hostState
	timings  Timings
	stopped  bool
	stopErrs error
}

// Timings are how long the start took.
type Timings struct {
	ControlPlane time.Duration // control plane ready
	Images       time.Duration // images built and imported
	NodeReady    time.Duration // from containerd's start to the Node Ready
	Total        time.Duration
}

// ControlPlane is the cluster's control plane; its API server listens on IP.
func (n *Node) ControlPlane() *controlplane.ControlPlane { return n.cp }

// Timings are how long the start took.
func (n *Node) Timings() Timings { return n.timings }

// Dir holds the node's configuration and the logs of containerd, the
// kubelet, kube-scheduler and kube-proxy.
func (n *Node) Dir() string { return n.dir }

// Preflight tells why a node cannot start on this machine, or nil.
func Preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("node: needs root")
	}
	var missing []string
	for _, bin := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "nft", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, plugin)); err != nil {
			missing = append(missing, "CNI plugin "+plugin)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("node: missing %s; run hack/install-test-deps.sh", strings.Join(missing, ", "))
	}
	return nil
}

const cniBinDir = "/usr/lib/cni"

// Start brings the cluster up: the guard, the control plane on IP,
// containerd with the images, the kubelet, kube-scheduler and kube-proxy;
// it returns once the node is Ready. The caller must call Stop (also
// after an error of Start, Stop is not needed: Start undoes what it did).
func Start(ctx context.Context, opts Options) (_ *Node, err error) {
	begin := time.Now()
	if err := procs.RefuseInParallelSet("a node"); err != nil {
		return nil, err
	}
	if err := Preflight(); err != nil {
		return nil, err
	}
	bins, err := findNodeBinaries(opts.ControlPlane.BinDir)
	if err != nil {
		return nil, err
	}
	n := &Node{dir: opts.Dir}
	if n.dir == "" {
		if n.dir, err = os.MkdirTemp("", "kbb-node-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return nil, err
	}
	if n.lock, err = lockNode(); err != nil {
		return nil, err
	}
	// What an earlier run that died left behind goes first.
	if err := cleanLeftovers(); err != nil {
		n.lock.Close()
		return nil, fmt.Errorf("node: cleaning what an earlier node left: %w", err)
	}
	n.sysctls = recordSysctls()
	n.before = recordHost()
	defer func() {
		if err != nil {
			if stopErr := n.Stop(); stopErr != nil {
				err = fmt.Errorf("%w; and undoing the start: %v", err, stopErr)
			}
			err = fmt.Errorf("%w\n(logs in %s)", err, n.dir)
		}
	}()
	// The guard before anything that could send a packet.
	if err := installGuard(); err != nil {
		return nil, err
	}
	if err := setUpLinks(); err != nil {
		return nil, err
	}

	cpOpts := opts.ControlPlane
	cpOpts.BinDir = bins
	cpOpts.AdvertiseAddress = IP
	cpOpts.ExtraControllers = append(cpOpts.ExtraControllers, podControllers...)
	if cpOpts.Dir == "" {
		cpOpts.Dir = filepath.Join(n.dir, "controlplane")
	}
	if n.cp, err = controlplane.Start(ctx, cpOpts); err != nil {
		return nil, err
	}
	n.timings.ControlPlane = time.Since(begin)

	if err := n.writeConfigs(); err != nil {
		return nil, err
	}
	if err := makeCgroupRoot(); err != nil {
		return nil, err
	}
	nodeStart := time.Now()
	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	imagesStart := time.Now()
	if err := n.importImages(ctx, opts.Images); err != nil {
		return nil, err
	}
	n.timings.Images = time.Since(imagesStart)
	if err := n.run("kubelet", filepath.Join(bins, "kubelet"),
		"--config="+filepath.Join(n.dir, "kubelet.yaml"),
		"--kubeconfig="+n.cp.AdminKubeconfigPath(),
		"--hostname-override="+Name,
		"--node-ip="+IP,
		"--root-dir="+filepath.Join(dataDir, "kubelet"),
		"--v=1",
	); err != nil {
		return nil, err
	}
	if err := n.run("kube-scheduler", filepath.Join(bins, "kube-scheduler"),
		"--kubeconfig="+n.cp.AdminKubeconfigPath(),
		"--authentication-kubeconfig="+n.cp.AdminKubeconfigPath(),
		"--authorization-kubeconfig="+n.cp.AdminKubeconfigPath(),
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--leader-elect=false",
	); err != nil {
		return nil, err
	}
	if err := n.run("kube-proxy", filepath.Join(bins, "kube-proxy"),
		"--config="+filepath.Join(n.dir, "kube-proxy.yaml"),
	); err != nil {
		return nil, err
	}
	if err := n.waitReady(ctx); err != nil {
		return nil, err
	}
	n.timings.NodeReady = time.Since(nodeStart)
	n.timings.Total = time.Since(begin)
	return n, nil
}

// podControllers are the controller manager's controllers that running
// pods needs, beyond the control plane's defaults.
var podControllers = []string{
	"deployment-controller", "replicaset-controller", "endpoints-controller",
	"endpointslice-controller", "endpointslice-mirroring-controller",
	"garbage-collector-controller", "namespace-controller", "node-lifecycle-controller",
	"disruption-controller",
}

// lockNode takes the machine's node lock, or fails at once naming who
// holds it.
func lockNode() (*os.File, error) {
	f, err := os.OpenFile(lockFile, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(lockFile)
		f.Close()
		return nil, fmt.Errorf("node: another node runs on this machine (%s held by pid %s): one node per machine", lockFile, strings.TrimSpace(string(holder)))
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())), 0)
	return f, nil
}

// setUpLinks makes the pods' bridge with the node's address, which is
// their gateway, on it.
func setUpLinks() error {
	for _, args := range [][]string{
		{"link", "add", Bridge, "type", "bridge"},
		{"addr", "add", IP + "/24", "dev", Bridge},
		{"link", "set", Bridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// makeCgroupRoot makes the pods' parent cgroup in every v1 hierarchy (the
// kubelet wants it to exist); cpuset's needs its parent's CPUs and memory
// nodes before anything can join it.
func makeCgroupRoot() error {
	hierarchies, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	for _, h := range hierarchies {
		parent := filepath.Join("/sys/fs/cgroup", h.Name())
		if h.Name() == "unified" {
			continue // the v2 hierarchy of a hybrid setup; the kubelet uses v1
		}
		dir := filepath.Join(parent, cgroupRoot)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if h.Name() == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(parent, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("cgroup %s/%s: %w", dir, f, err)
				}
			}
		}
	}
	return nil
}

func (n *Node) run(name, bin string, args ...string) error {
	logFile, err := os.OpenFile(filepath.Join(n.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := procs.StartTied(cmd); err != nil {
		logFile.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); logFile.Close(); close(p.done) }()
	n.procs = append(n.procs, p)
	return nil
}

// proc is one of the node's processes.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
	err  error         // its exit, once done is closed
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop ends the process's group: SIGTERM, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (n *Node) startContainerd(ctx context.Context) error {
	if err := n.run("containerd", "containerd", "--config="+filepath.Join(n.dir, "containerd.toml")); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if out, err := n.ctr(ctx, "version"); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("containerd did not answer within 30 s: %w: %s", err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ctr runs ctr against the node's containerd, in the namespace of the
// kubelet's containers.
func (n *Node) ctr(ctx context.Context, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "ctr", append([]string{"--address", containerdSocket, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
}

const containerdSocket = stateDir + "/containerd.sock"

// importImages builds the pause image and imports it with images.
func (n *Node) importImages(ctx context.Context, images []Image) error {
	pause, cleanup, err := procs.Build("./internal/localenv/node/pause", "-trimpath", "-ldflags=-s -w")
	if err != nil {
		return err
	}
	defer cleanup()
	all := append([]Image{{Name: PauseImage, Files: map[string]string{"/pause": pause}, Entrypoint: []string{"/pause"}, User: "65535:65535"}}, images...)
	for i, img := range all {
		tarPath := filepath.Join(n.dir, fmt.Sprintf("image-%d.tar", i))
		if err := img.WriteOCILayout(tarPath); err != nil {
			return err
		}
		out, err := n.ctr(ctx, "images", "import", tarPath)
		os.Remove(tarPath)
		if err != nil {
			return fmt.Errorf("ctr images import %s: %w: %s", img.Name, err, out)
		}
	}
	return nil
}

func (n *Node) waitReady(ctx context.Context) error {
	kube, err := kubernetes.NewForConfig(n.cp.AdminConfig())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	last := "not registered"
	for {
		for _, p := range n.procs {
			if p.exited() {
				return fmt.Errorf("%s exited while waiting for the node to be Ready: %w", p.name, p.err)
			}
		}
		node, err := kube.CoreV1().Nodes().Get(ctx, Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady {
					if c.Status == corev1.ConditionTrue {
						return nil
					}
					last = c.Reason + ": " + c.Message
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s not Ready within 60 s (%s)", Name, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
