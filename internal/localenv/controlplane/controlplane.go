// Package controlplane runs a real Kubernetes control plane: etcd,
// kube-apiserver (client-certificate authentication, RBAC, service-account
// tokens) and kube-controller-manager (service-account, token, root-CA and
// resource-quota controllers), all on loopback, as separate processes tied to the caller
// (the kernel ends them if it dies).
//
// The local demo (hack/demo) and the tests both use it:
//
//	cp, err := controlplane.Start(ctx, controlplane.Options{})
//	if err != nil { ... }
//	defer cp.Stop()
//	cs, err := kubernetes.NewForConfig(cp.AdminConfig())
//
// Tests get one control plane per package (RunMain and Get, testing.go).
//
// The binaries come from Options.BinDir, $KUBE_BIND_TEST_BINARIES or the
// cache of hack/install-test-binaries.sh; without them Start fails, naming
// the script.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

const (
	// AdminUser is the user name of AdminConfig (group system:masters).
	AdminUser = "kube-bind-test-admin"
	// ServiceAccountIssuer is the issuer of service-account tokens.
	ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"
	// ServiceClusterIPRange is the API server's service network.
	ServiceClusterIPRange = "10.0.0.0/24"

	startTimeout = 90 * time.Second
	stopGrace    = 5 * time.Second
	logTailLines = 40
)

// ControlPlane is a running etcd, kube-apiserver and kube-controller-manager.
// Its methods are safe for concurrent use.
type ControlPlane struct {
	mu              sync.Mutex // guards procs against RestartAPIServer
	dir             string     // temp folder: certificates, kubeconfig, etcd data, logs
	binDir          string
	host            string
	ca              *authority
	admin           *rest.Config
	adminKubeconfig string
	procs           []*process // in start order
	startup         time.Duration
	apiserverReady  time.Duration
}

// AdminConfig returns a config for a cluster admin (client certificate of
// AdminUser in group system:masters). Each call returns a new copy.
func (cp *ControlPlane) AdminConfig() *rest.Config { return rest.CopyConfig(cp.admin) }

// ConfigForToken returns a config that authenticates with a bearer token,
// e.g. a service-account token from TokenRequest or a legacy token Secret.
func (cp *ControlPlane) ConfigForToken(token string) *rest.Config {
	cfg := cp.anonymousConfig()
	cfg.BearerToken = token
	return cfg
}

// ConfigForUser returns a config for the given user and groups, which the API
// server authenticates for real: a client certificate (CN = name, O = groups)
// signed by the CA of its --client-ca-file. RBAC applies as for any user; it
// has no permissions until someone grants them.
func (cp *ControlPlane) ConfigForUser(name string, groups ...string) (*rest.Config, error) {
	certPEM, keyPEM, err := cp.ca.client(name, groups...)
	if err != nil {
		return nil, fmt.Errorf("controlplane: client certificate for %q: %w", name, err)
	}
	cfg := cp.anonymousConfig()
	cfg.CertData = certPEM
	cfg.KeyData = keyPEM
	return cfg, nil
}

// UserWithClusterRole binds clusterRole to the user name (a
// ClusterRoleBinding of the same name; one that exists already is kept)
// and returns that user's config, as ConfigForUser. The backend's tests
// run the backend as such a user holding only binding.BackendClusterRole,
// so that they also prove the documented RBAC is enough.
func (cp *ControlPlane) UserWithClusterRole(ctx context.Context, name, clusterRole string) (*rest.Config, error) {
	kube, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		return nil, err
	}
	_, err = kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("granting %s to %s: %w", clusterRole, name, err)
	}
	return cp.ConfigForUser(name)
}

// AnonymousConfig returns a config that presents no credentials.
func (cp *ControlPlane) anonymousConfig() *rest.Config {
	return &rest.Config{
		Host:            cp.host,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.ca.certPEM},
		QPS:             200,
		Burst:           400,
	}
}

// AdminKubeconfigPath is a kubeconfig file of AdminConfig, for separate
// processes, kubectl and helm.
func (cp *ControlPlane) AdminKubeconfigPath() string { return cp.adminKubeconfig }

// BinDir is the folder of etcd, kube-apiserver, kube-controller-manager,
// kubectl (and helm, when built by hack/install-test-binaries.sh).
func (cp *ControlPlane) BinDir() string { return cp.binDir }

// Host is the API server's URL (https://127.0.0.1:port).
func (cp *ControlPlane) Host() string { return cp.host }

// CAData is the PEM certificate of the CA that signed the API server's
// serving certificate (and the client certificates).
func (cp *ControlPlane) CAData() []byte { return append([]byte(nil), cp.ca.certPEM...) }

// LogDir is the folder holding etcd.log, kube-apiserver.log and
// kube-controller-manager.log.
func (cp *ControlPlane) LogDir() string { return cp.dir }

// StartupDuration is how long the start took, until the API server was ready
// and the controller manager had made the default ServiceAccount.
func (cp *ControlPlane) StartupDuration() time.Duration { return cp.startup }

// APIServerReadyDuration is how long the start took until kube-apiserver's
// /readyz answered ok (etcd and kube-apiserver started, before the
// controller manager).
func (cp *ControlPlane) APIServerReadyDuration() time.Duration { return cp.apiserverReady }

var errPortInUse = errors.New("port already in use")

// Options configure Start.
type Options struct {
	// BinDir holds etcd, kube-apiserver, kube-controller-manager and
	// kubectl; "" finds them as the tests do ($KUBE_BIND_TEST_BINARIES, else
	// the cache of hack/install-test-binaries.sh, never building).
	BinDir string
	// Dir receives certificates, kubeconfig, etcd data and the servers'
	// logs; "" makes a temporary folder. Etcd data left in it by an earlier
	// start is removed. Stop never removes Dir.
	Dir string
	// ExtraControllers are kube-controller-manager controllers to run
	// besides the default ones (the service-account, token, root-CA and
	// resource-quota controllers: the backend gives each consumer a
	// quota, which admits nothing until this controller has counted),
	// e.g. "clusterrole-aggregation-controller".
	ExtraControllers []string
	// AdvertiseAddress, when set, is a non-loopback IP of this machine
	// (a node's IP) the API server binds and advertises instead of
	// 127.0.0.1: pods cannot reach the host's loopback, and the
	// kubernetes Service then points at this address. Host then uses it.
	AdvertiseAddress string
}

// Start starts a control plane; the caller must call Stop. ctx bounds only
// the start. (Tests share one per package: Get.)
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	if err := procs.RefuseInParallelSet("a control plane"); err != nil {
		return nil, err
	}
	binDir := opts.BinDir
	if binDir == "" {
		var err error
		if binDir, err = findBinaries(); err != nil {
			return nil, err
		}
	} else if err := checkBinaries(binDir); err != nil {
		return nil, fmt.Errorf("%s: %w; run %s", binDir, err, InstallScript)
	}
	// Try again when a free port chosen for a server got taken by someone
	// else before the server bound it.
	for attempt := 1; ; attempt++ {
		cp, err := startIn(ctx, binDir, opts)
		if err == nil || !errors.Is(err, errPortInUse) || attempt == 3 {
			return cp, err
		}
	}
}

// Stop stops the servers (its folder stays: see LogDir).
func (cp *ControlPlane) Stop() { cp.stop() }

// startIn makes one attempt to start a control plane in opts.Dir ("" = a
// new temporary folder).
func startIn(ctx context.Context, binDir string, opts Options) (_ *ControlPlane, err error) {
	begin := time.Now()
	dir, extraControllers := opts.Dir, opts.ExtraControllers
	address, endpointReconciler := "127.0.0.1", "none"
	var extraIPs []net.IP
	if opts.AdvertiseAddress != "" {
		ip := net.ParseIP(opts.AdvertiseAddress)
		if ip == nil || ip.IsLoopback() {
			return nil, fmt.Errorf("controlplane: AdvertiseAddress %q is not a non-loopback IP", opts.AdvertiseAddress)
		}
		// The kubernetes Service gets this address as its endpoint.
		address, endpointReconciler, extraIPs = ip.String(), "lease", []net.IP{ip}
	}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "kube-bind-controlplane-"); err != nil {
			return nil, err
		}
	} else {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		if err := os.RemoveAll(filepath.Join(dir, "etcd")); err != nil {
			return nil, err
		}
	}
	cp := &ControlPlane{dir: dir, binDir: binDir}
	defer func() {
		if err != nil {
			err = cp.failed(err)
		}
	}()

	if cp.ca, err = newAuthority(); err != nil {
		return nil, err
	}
	servingCert, servingKey, err := cp.ca.serving(extraIPs...)
	if err != nil {
		return nil, err
	}
	adminCert, adminKey, err := cp.ca.client(AdminUser, "system:masters")
	if err != nil {
		return nil, err
	}
	saKey, err := newServiceAccountKey()
	if err != nil {
		return nil, err
	}
	file := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if werr := os.WriteFile(p, data, 0o600); werr != nil && err == nil {
			err = werr
		}
		return p
	}
	caFile := file("ca.crt", cp.ca.certPEM)
	servingCertFile := file("apiserver.crt", servingCert)
	servingKeyFile := file("apiserver.key", servingKey)
	saKeyFile := file("service-account.key", saKey)
	if err != nil {
		return nil, err
	}

	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	etcdPeerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	cp.host = "https://" + net.JoinHostPort(address, strconv.Itoa(ports[2]))
	cp.admin = cp.anonymousConfig()
	cp.admin.CertData = adminCert
	cp.admin.KeyData = adminKey
	cp.adminKubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := WriteKubeconfig(cp.adminKubeconfig, cp.admin); err != nil {
		return nil, err
	}

	if err := cp.run("etcd",
		"--name=default",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+etcdPeerURL,
		"--initial-advertise-peer-urls="+etcdPeerURL,
		"--initial-cluster=default="+etcdPeerURL,
		"--unsafe-no-fsync",
		// A single member elects itself after one election timeout: keep it
		// short (the default 1 s is a third of the whole start).
		"--heartbeat-interval=20",
		"--election-timeout=100",
		"--log-level=warn",
	); err != nil {
		return nil, err
	}
	// The API server waits for etcd itself.
	if err := cp.run("kube-apiserver",
		"--etcd-servers="+etcdURL,
		"--bind-address="+address,
		"--advertise-address="+address,
		"--secure-port="+strconv.Itoa(ports[2]),
		"--cert-dir="+filepath.Join(dir, "apiserver-certs"),
		"--tls-cert-file="+servingCertFile,
		"--tls-private-key-file="+servingKeyFile,
		"--client-ca-file="+caFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer="+ServiceAccountIssuer,
		"--service-account-key-file="+saKeyFile,
		"--service-account-signing-key-file="+saKeyFile,
		"--service-cluster-ip-range="+ServiceClusterIPRange,
		"--allow-privileged=true",
		"--profiling=false",
		// Without AdvertiseAddress the kubernetes Service's endpoint would
		// be 127.0.0.1, which Endpoints refuse; nothing runs in pods then.
		"--endpoint-reconciler-type="+endpointReconciler,
		// kubectl logs and exec reach the kubelet at the node's IP.
		"--kubelet-preferred-address-types=InternalIP",
	); err != nil {
		return nil, err
	}
	admin, err := kubernetes.NewForConfig(cp.admin)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := cp.waitFor(ctx, "kube-apiserver /readyz", func(ctx context.Context) (bool, error) {
		_, err := admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil, nil
	}); err != nil {
		return nil, err
	}
	cp.apiserverReady = time.Since(begin)

	if err := cp.run("kube-controller-manager",
		"--kubeconfig="+cp.adminKubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--leader-elect=false",
		"--service-account-private-key-file="+saKeyFile,
		"--root-ca-file="+caFile,
		"--controllers="+strings.Join(append([]string{"serviceaccount-token-controller", "serviceaccount-controller", "root-ca-certificate-publisher-controller", "resourcequota-controller"}, extraControllers...), ","),
	); err != nil {
		return nil, err
	}
	// The default ServiceAccount and the kube-root-ca.crt ConfigMap show that
	// the controllers run, so tests need not wait for them.
	if err := cp.waitFor(ctx, "kube-controller-manager (default ServiceAccount and kube-root-ca.crt)", func(ctx context.Context) (bool, error) {
		if _, err := admin.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, ignoreNotFound(err)
		}
		_, err := admin.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, ignoreNotFound(err)
	}); err != nil {
		return nil, err
	}
	cp.startup = time.Since(begin)
	return cp, nil
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func (cp *ControlPlane) run(name string, args ...string) error {
	p, err := startProcess(cp.dir, name, filepath.Join(cp.binDir, name), args...)
	if err != nil {
		return err
	}
	cp.procs = append(cp.procs, p)
	return nil
}

// waitFor polls cond until it holds, a server exits, or ctx ends. Errors of
// cond other than a server exiting are retried (the server may still be
// coming up) and reported on timeout.
func (cp *ControlPlane) waitFor(ctx context.Context, what string, cond func(context.Context) (bool, error)) error {
	var lastErr error
	for {
		cp.mu.Lock()
		procs := slices.Clone(cp.procs)
		cp.mu.Unlock()
		for _, p := range procs {
			if p.exited() {
				return fmt.Errorf("%s exited while waiting for %s: %w", p.name, what, p.waitErr)
			}
		}
		attemptCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := cond(attemptCtx)
		cancel()
		if ok {
			return nil
		}
		if err != nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s (last error: %w)", what, lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// failed stops what was started and adds the end of each server's log to
// err, keeping the logs for a closer look.
func (cp *ControlPlane) failed(err error) error {
	cp.stop()
	var b strings.Builder
	fmt.Fprintf(&b, "%v\nlogs kept in %s", err, cp.dir)
	inUse := false
	for _, p := range cp.procs {
		fmt.Fprintf(&b, "\n--- last lines of %s ---\n%s", p.logPath, p.tail(logTailLines))
		inUse = inUse || p.logContains("address already in use")
	}
	if inUse {
		return fmt.Errorf("%w: %s", errPortInUse, b.String())
	}
	return errors.New(b.String())
}

// stop ends the servers in reverse order of start.
func (cp *ControlPlane) stop() {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for i := len(cp.procs) - 1; i >= 0; i-- {
		cp.procs[i].stop(stopGrace)
	}
}

// RestartAPIServer stops kube-apiserver (SIGTERM, as a rolling update of
// a control plane does), waits down for down, starts it again with the
// same flags on the same port (etcd keeps every object), and returns once
// its /readyz answers ok.
func (cp *ControlPlane) RestartAPIServer(ctx context.Context, down time.Duration) error {
	if err := cp.restart(ctx, "kube-apiserver", down); err != nil {
		return err
	}
	admin, err := kubernetes.NewForConfig(cp.admin)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	return cp.waitFor(ctx, "kube-apiserver /readyz after a restart", func(ctx context.Context) (bool, error) {
		_, err := admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil, nil
	})
}

// RestartControllerManager stops kube-controller-manager and starts it
// again. Its resource-quota controller discovers the cluster's kinds at
// start and then only every 30 s: a restart right after installing CRDs
// lets quotas count their objects at once.
func (cp *ControlPlane) RestartControllerManager(ctx context.Context) error {
	return cp.restart(ctx, "kube-controller-manager", 0)
}

// restart stops the named process, waits down, and starts it again with
// the same arguments.
func (cp *ControlPlane) restart(ctx context.Context, name string, down time.Duration) error {
	cp.mu.Lock()
	var old *process
	i := slices.IndexFunc(cp.procs, func(p *process) bool { return p.name == name })
	if i >= 0 {
		old = cp.procs[i]
	}
	cp.mu.Unlock()
	if old == nil {
		return errors.New("controlplane: no " + name)
	}
	old.stop(stopGrace)
	select {
	case <-time.After(down):
	case <-ctx.Done():
		return ctx.Err()
	}
	p, err := startProcess(cp.dir, old.name, old.bin, old.args...)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.procs[i] = p
	cp.mu.Unlock()
	return nil
}

// freePorts finds n loopback ports free at this moment and never handed
// out before in this process (procs.UnusedPort), so that a server this
// process starts later cannot be given one of them. Another process may
// take one before the server binds it; start then tries again.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		port, err := procs.UnusedPort()
		if err != nil {
			return nil, err
		}
		ports = append(ports, port)
	}
	return ports, nil
}

// WriteKubeconfig writes cfg (from this package, or any config with inline
// CA, client certificate or token) as a kubeconfig file (mode 0600) at
// path, for separate processes, kubectl and helm.
func WriteKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
		TLSServerName:            cfg.ServerName,
	}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
	}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test", Namespace: "default"}
	kc.CurrentContext = "test"
	return clientcmd.WriteToFile(*kc, path)
}
