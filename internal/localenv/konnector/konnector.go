// Package konnector runs the released kube-bind konnector (v0.4.8) as a real
// process, with a given consumer kubeconfig, for the local demo and the
// tests (testing.go).
//
// The konnector serves healthz on :8080 of all interfaces, hard-coded, and
// panics when the port is taken. So each one runs in a network namespace of
// its own, where its :8080 clashes with nothing. It still reaches the API
// servers on the host's loopback: for each address it needs, the calling
// process listens on a unix socket (those are not network-namespaced) and
// proxies to the TCP address, and a small forwarder inside the namespace
// (./netbridge) listens on 127.0.0.1 with the same port and dials the
// socket. Same ports keep URLs and TLS server names as they were.
//
//	k, err := konnector.Run(konnector.Options{
//		Kubeconfig: consumerKubeconfig,     // its server is bridged
//		Servers:    []string{provider.Host()}, // what issued kubeconfigs name
//	})
//	...
//	defer k.Stop()
//	if strings.Contains(k.Log(), "Forbidden") { ... }
//
// The konnector and its forwarder die with the calling process
// (parent-death signal).
package konnector

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/kbprovider/backend/internal/localenv/konnector/bridgepipe"
	"github.com/kbprovider/backend/internal/localenv/procs"
)

// Options configure Run.
type Options struct {
	// Kubeconfig of the consumer cluster (required). The server of its
	// current context is bridged into the konnector's namespace.
	Kubeconfig string
	// Servers are further API server URLs (or host:port) on the host's
	// loopback the konnector must reach: the provider's, as the kubeconfigs
	// the provider issues name it.
	Servers []string
	// LeaseNamespace for the konnector's leader election; default kube-bind.
	LeaseNamespace string
	// Args are further konnector flags.
	Args []string
	// Binary is the konnector to run; "" = the released v0.4.8
	// (ReleasedPath).
	Binary string
	// Netbridge is the built ./netbridge; "" = build it once into the
	// cache (needs this checkout and the go command).
	Netbridge string
	// Output, when set, receives the konnector's output instead of the
	// in-memory log (Log then stays empty): a file, for a konnector that
	// runs for hours (the demo).
	Output io.Writer
}

// Konnector is a running konnector.
type Konnector struct {
	cmd     *exec.Cmd
	log     procs.Buffer
	done    chan struct{} // closed when the process has exited
	waitErr error         // valid after done

	stopOnce sync.Once
	bridges  []*bridge
	sockDir  string
}

const stopGrace = 10 * time.Second

// Run starts the konnector; the caller must call Stop.
func Run(o Options) (_ *Konnector, err error) {
	if err := procs.RefuseInParallelSet("a konnector"); err != nil {
		return nil, err
	}
	if o.Kubeconfig == "" {
		return nil, errors.New("Options.Kubeconfig is required")
	}
	if o.LeaseNamespace == "" {
		o.LeaseNamespace = "kube-bind"
	}
	bin := o.Binary
	if bin == "" {
		if bin, err = ReleasedPath("konnector"); err != nil {
			return nil, fmt.Errorf("released kube-bind %s konnector: %w", ReleasedVersion, err)
		}
	}
	bridgeBin := o.Netbridge
	if bridgeBin == "" {
		if bridgeBin, err = netbridgeBinary(); err != nil {
			return nil, fmt.Errorf("building the network bridge: %w", err)
		}
	}
	cfg, err := clientcmd.LoadFromFile(o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	servers := append([]string(nil), o.Servers...)
	if ctx, ok := cfg.Contexts[cfg.CurrentContext]; ok {
		if c, ok := cfg.Clusters[ctx.Cluster]; ok {
			servers = append(servers, c.Server)
		}
	}
	if len(servers) == len(o.Servers) {
		return nil, fmt.Errorf("%s has no server in its current context", o.Kubeconfig)
	}

	k := &Konnector{done: make(chan struct{})}
	// Short: a socket path has at most 107 bytes.
	if k.sockDir, err = os.MkdirTemp("", "konnector-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			k.closeBridges()
		}
	}()
	args := []string{}
	seen := map[string]bool{}
	for _, s := range servers {
		addr, err := loopbackAddress(s)
		if err != nil {
			return nil, err
		}
		if seen[addr] {
			continue
		}
		seen[addr] = true
		_, port, _ := net.SplitHostPort(addr)
		sock := filepath.Join(k.sockDir, port+".sock")
		b, err := newBridge(sock, addr)
		if err != nil {
			return nil, err
		}
		k.bridges = append(k.bridges, b)
		args = append(args, "-forward", "127.0.0.1:"+port+"="+sock)
	}
	args = append(args, "--", bin,
		"--kubeconfig", o.Kubeconfig,
		"--lease-namespace", o.LeaseNamespace)
	args = append(args, o.Args...)

	k.cmd = exec.Command(bridgeBin, args...)
	k.cmd.Stdout, k.cmd.Stderr = &k.log, &k.log
	if o.Output != nil {
		k.cmd.Stdout, k.cmd.Stderr = o.Output, o.Output
	}
	podName := make([]byte, 3)
	_, _ = rand.Read(podName)
	k.cmd.Env = append(os.Environ(),
		"POD_NAME=konnector-"+hex.EncodeToString(podName),
		"POD_NAMESPACE="+o.LeaseNamespace)
	if err := startInNetns(k.cmd); err != nil {
		return nil, fmt.Errorf("starting %s in a network namespace of its own: %w", bin, err)
	}
	go func() {
		k.waitErr = k.cmd.Wait()
		close(k.done)
	}()
	return k, nil
}

// Log returns everything the konnector (and its forwarder) wrote so far
// (nothing when Options.Output took it).
func (k *Konnector) Log() string { return k.log.String() }

// Pid is the process id of the forwarder whose child the konnector is.
func (k *Konnector) Pid() int { return k.cmd.Process.Pid }

// Exited reports whether the konnector has ended, and how.
func (k *Konnector) Exited() (bool, error) {
	select {
	case <-k.done:
		return true, k.waitErr
	default:
		return false, nil
	}
}

// Done is closed when the konnector has ended.
func (k *Konnector) Done() <-chan struct{} { return k.done }

// Stop ends the konnector (SIGTERM, then SIGKILL after a grace period) and
// its bridges. Safe to call more than once.
func (k *Konnector) Stop() {
	k.stopOnce.Do(func() {
		_ = k.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-k.done:
		case <-time.After(stopGrace):
			_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
			<-k.done
		}
		k.closeBridges()
	})
}

// closeBridges closes the bridges and removes their sockets' folder.
func (k *Konnector) closeBridges() {
	for _, b := range k.bridges {
		b.close()
	}
	_ = os.RemoveAll(k.sockDir)
}

// loopbackAddress turns an API server URL (or host:port) into the
// 127.0.0.1:port the bridge serves; only loopback servers can be bridged.
func loopbackAddress(server string) (string, error) {
	hostport := server
	if strings.Contains(server, "://") {
		u, err := url.Parse(server)
		if err != nil {
			return "", err
		}
		port := u.Port()
		if port == "" {
			port = "443"
			if u.Scheme == "http" {
				port = "80"
			}
		}
		hostport = net.JoinHostPort(u.Hostname(), port)
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", fmt.Errorf("server %q: %w", server, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", fmt.Errorf("server %q is not on loopback; only loopback servers can be bridged", server)
	}
	return net.JoinHostPort("127.0.0.1", port), nil
}

// bridge accepts connections on a unix socket and pipes each to a TCP
// address.
type bridge struct {
	l     net.Listener
	addr  string
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func newBridge(sock, addr string) (*bridge, error) {
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	b := &bridge{l: l, addr: addr, conns: map[net.Conn]struct{}{}}
	b.wg.Add(1)
	go b.serve()
	return b, nil
}

func (b *bridge) serve() {
	defer b.wg.Done()
	for {
		c, err := b.l.Accept()
		if err != nil {
			return // closed
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer c.Close()
			u, err := net.Dial("tcp", b.addr)
			if err != nil {
				return // the konnector sees the connection close and retries
			}
			defer u.Close()
			if !b.track(c, u) {
				return
			}
			defer b.untrack(c, u)
			bridgepipe.Pipe(c, u)
		}()
	}
}

// track registers open connections so close can end them; false once
// closing.
func (b *bridge) track(cs ...net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conns == nil {
		return false
	}
	for _, c := range cs {
		b.conns[c] = struct{}{}
	}
	return true
}

func (b *bridge) untrack(cs ...net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range cs {
		delete(b.conns, c)
	}
}

// close stops accepting, ends open connections and waits for every
// goroutine of the bridge.
func (b *bridge) close() {
	_ = b.l.Close()
	b.mu.Lock()
	for c := range b.conns {
		_ = c.Close()
	}
	b.conns = nil
	b.mu.Unlock()
	b.wg.Wait()
}

var (
	bridgeOnce sync.Once
	bridgePath string
	bridgeErr  error
)

// netbridgeBinary builds ./netbridge once into a cache folder named by a
// hash of its source (bridgepipe's too), go.mod, go.sum and the Go version, so it is built
// again only when one of them changes and no temporary build is left
// behind.
func netbridgeBinary() (string, error) {
	bridgeOnce.Do(func() { bridgePath, bridgeErr = buildNetbridge() })
	return bridgePath, bridgeErr
}

func buildNetbridge() (string, error) {
	root := procs.RepoRoot()
	h := sha256.New()
	fmt.Fprintln(h, runtime.Version())
	for _, f := range []string{"internal/localenv/konnector/netbridge/main.go", "internal/localenv/konnector/bridgepipe/bridgepipe.go", "go.mod", "go.sum"} {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", f, len(data))
		h.Write(data)
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(home, ".cache", "kube-bind-backend", "netbridge-"+hex.EncodeToString(h.Sum(nil))[:16])
	bin := filepath.Join(dir, "netbridge")
	if st, err := os.Stat(bin); err == nil && st.Mode()&0o111 != 0 {
		return bin, nil
	}
	built, cleanup, err := procs.Build("./internal/localenv/konnector/netbridge")
	if err != nil {
		return "", err
	}
	defer cleanup()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Copy then rename: the build folder may be on another file system.
	data, err := os.ReadFile(built)
	if err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".netbridge-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", err
	}
	return bin, nil
}
