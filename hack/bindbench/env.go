package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/kbprovider/backend/internal/benchutil"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
)

const (
	// externalURL is what both replicas advertise, as replicas behind one
	// Service do. Nobody resolves it: the bench's clients dial a chosen
	// replica for it (binder.transport).
	externalURL = "http://backend.bindbench.test"
	// namespace holds the session records and the leader election Lease.
	namespace = "bindbench"
	// namespacePrefix is the replicas' --namespace-prefix: each bind's
	// provider namespace.
	namespacePrefix = "kb-bench-"
	// recordLabel marks the session records (internal/sessions/kube).
	recordLabel = "kube-bind.io/session-record"
	// readyWithin bounds a replica's start, a restart with a backlog too.
	readyWithin = 5 * time.Minute
)

// exported is the API every bind picks.
var exported = exampleapis.MangoDB

// env is what a run starts: the provider cluster, the identity provider
// and the replicas.
type env struct {
	o       options
	dir     string
	bin     string
	cp      *controlplane.ControlPlane
	cpPids  []int
	kube    kubernetes.Interface
	meta    metadata.Interface
	records schema.GroupVersionResource
	idp     *oidcprovider.Provider
	users   []oidcprovider.User
	reps    []*replica

	// recordLists counts the bench's own LIST requests of the records,
	// left out of the API requests per bind.
	recordLists int
	listsMu     sync.Mutex
}

// replica is one cmd/backend process, started again with the same flags
// by restart.
type replica struct {
	name       string
	addr, diag string // public and diagnostics listeners, host:port
	args       []string
	out        io.Writer // nil: kept in memory
	p          *benchutil.Process
}

func (r *replica) start(bin string) error {
	p, err := benchutil.StartProcess(benchutil.ProcessOptions{
		Argv: append([]string{bin}, r.args...), Out: r.out,
		ReadyURL: "http://" + r.diag + "/readyz", ReadyStatus: 200, ReadyWithin: readyWithin,
	})
	if err != nil {
		return fmt.Errorf("%s: %w", r.name, err)
	}
	r.p = p
	return nil
}

func (e *env) start(ctx context.Context) error {
	o := e.o
	if e.bin = o.backend; e.bin == "" {
		e.bin = filepath.Join(e.dir, "backend")
		fmt.Println("building ./cmd/backend")
		build := exec.Command("go", "build", "-o", e.bin, "./cmd/backend")
		build.Stdout, build.Stderr = os.Stdout, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("building the backend: %w", err)
		}
	}
	rec, err := parseResource(o.recordResource)
	if err != nil {
		return fmt.Errorf("--record-resource: %w", err)
	}
	e.records = rec

	t := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if e.cp, err = controlplane.Start(cctx, controlplane.Options{Dir: filepath.Join(e.dir, "controlplane")}); err != nil {
		return fmt.Errorf("starting the control plane (binaries: $%s or %s): %w", controlplane.BinariesEnv, controlplane.InstallScript, err)
	}
	e.cpPids = benchutil.ChildrenNamed(map[string]bool{"etcd": true, "kube-apiserver": true, "kube-controller": true})
	if e.kube, err = kubernetes.NewForConfig(e.cp.AdminConfig()); err != nil {
		return err
	}
	if e.meta, err = metadata.NewForConfig(e.cp.AdminConfig()); err != nil {
		return err
	}
	if err := exampleapis.Prepare(cctx, e.cp, exported); err != nil {
		return fmt.Errorf("installing the kube-bind CRDs and %s: %w", exported.Name(), err)
	}
	_, err = e.kube.CoreV1().Namespaces().Create(cctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	fmt.Printf("control plane up at %s in %.1fs, %s installed; session records and the leader Lease in namespace %s\n",
		e.cp.Host(), time.Since(t).Seconds(), exported.Name(), namespace)

	// Binders: a handful of users, each bind a new cluster of one of them.
	for i := range o.users {
		e.users = append(e.users, oidcprovider.User{Name: fmt.Sprintf("binder-%d", i), Password: fmt.Sprintf("binder-%d-pw", i),
			Email: fmt.Sprintf("binder-%d@example.com", i), Groups: []string{"binders"}})
	}
	idpOpts := oidcprovider.Options{RedirectURIs: []string{externalURL + "/callback"}, Users: e.users}
	if o.logDir != "" {
		f, err := os.Create(filepath.Join(o.logDir, "oidc-provider.log"))
		if err != nil {
			return err
		}
		defer f.Close() // node has its own descriptor
		idpOpts.Log = f
	}
	t = time.Now()
	ictx, icancel := context.WithTimeout(ctx, time.Minute)
	defer icancel()
	if e.idp, err = oidcprovider.RunRetrying(ictx, idpOpts, nil); err != nil {
		return fmt.Errorf("identity provider (needs `npm ci` in test/oidcprovider: hack/install-test-deps.sh): %w", err)
	}
	fmt.Printf("identity provider up at %s in %.1fs, %d users\n", e.idp.IssuerURL, time.Since(t).Seconds(), len(e.users))

	return e.startReplicas()
}

// startReplicas starts two replicas as the chart runs them: the ring
// session store, peers over TLS sharing one peer key, the controllers
// under leader election. The limits that guard against one client are
// lifted: every bind comes from this one address, and each makes a new
// cluster of a handful of users.
func (e *env) startReplicas() error {
	o := e.o
	keyFile := filepath.Join(e.dir, "peer-key")
	if err := os.WriteFile(keyFile, []byte(procs.RandomKey(32)+"\n"), 0o600); err != nil {
		return err
	}
	sign, enc, clusterKey := procs.RandomKey(64), procs.RandomKey(32), procs.RandomKey(32)
	var peers []string
	ports := func() (int, int, int, error) {
		var p [3]int
		for i := range p {
			port, err := procs.UnusedPort()
			if err != nil {
				return 0, 0, 0, err
			}
			p[i] = port
		}
		return p[0], p[1], p[2], nil
	}
	var peerAddrs []string
	for i := range 2 {
		port, peerPort, diagPort, err := ports()
		if err != nil {
			return err
		}
		r := &replica{name: fmt.Sprintf("replica-%d", i),
			addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			diag: net.JoinHostPort("127.0.0.1", strconv.Itoa(diagPort))}
		peerAddrs = append(peerAddrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort)))
		peers = append(peers, "https://"+peerAddrs[i])
		e.reps = append(e.reps, r)
	}
	for i, r := range e.reps {
		r.args = append([]string{
			"--listen-address", r.addr,
			"--diagnostics-address", r.diag,
			"--external-url", externalURL,
			"--pretty-name", "bindbench",
			"--namespace-prefix", namespacePrefix,
			"--consumer-scope", "Namespaced",
			"--kubeconfig", e.cp.AdminKubeconfigPath(),
			// As admin, no admission policy confines it (the chart's
			// choice when the policy is off).
			"--unsafe-skip-admission-policy-check=true",
			"--oidc-issuer-url", e.idp.IssuerURL,
			"--oidc-issuer-client-id", e.idp.ClientID,
			"--oidc-issuer-client-secret", e.idp.ClientSecret,
			"--oidc-allowed-groups", "binders",
			"--cookie-signing-key", sign,
			"--cookie-encryption-key", enc,
			"--cluster-secret-key", clusterKey,
			"--session-store", "ring",
			"--session-namespace", namespace,
			"--peer-listen-address", peerAddrs[i],
			"--peer-self-url", peers[i],
			"--peers", strings.Join(peers, ","),
			"--peer-key-file", keyFile,
			"--leader-election-namespace", namespace,
			"--leader-election-lease-name", "bindbench",
			"--max-clusters-per-user", "10000",
			"--session-create-rate", "0",
			"--max-connections-per-client", "0",
			"--log-format", "text",
			"--log-level", o.logLevel,
		}, o.backendArgs...)
		if o.logDir != "" {
			f, err := os.Create(filepath.Join(o.logDir, r.name+".log"))
			if err != nil {
				return err
			}
			r.out = f // kept open for restarts; closed with the process
		}
	}
	t := time.Now()
	// Both at once: a replica of a ring may wait for its peer.
	errs := make([]error, len(e.reps))
	var wg sync.WaitGroup
	for i, r := range e.reps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.start(e.bin)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Printf("2 replicas ready in %.1fs (%s, %s), ring store, leader election\n", time.Since(t).Seconds(), e.reps[0].addr, e.reps[1].addr)
	return nil
}

func (e *env) stop() {
	for _, r := range e.reps {
		if r.p != nil {
			r.p.Stop()
		}
	}
	if e.idp != nil {
		e.idp.Stop()
	}
	if e.cp != nil {
		e.cp.Stop()
	}
}

// parseResource reads "secrets" (core v1) or "group/version/resource".
func parseResource(s string) (schema.GroupVersionResource, error) {
	parts := strings.Split(s, "/")
	switch {
	case len(parts) == 1 && parts[0] != "":
		return schema.GroupVersionResource{Version: "v1", Resource: parts[0]}, nil
	case len(parts) == 3 && parts[1] != "" && parts[2] != "":
		return schema.GroupVersionResource{Group: parts[0], Version: parts[1], Resource: parts[2]}, nil
	}
	return schema.GroupVersionResource{}, fmt.Errorf("%q: want a core resource (secrets) or group/version/resource", s)
}

// countRecords counts the live session records: a LIST of their metadata
// with the record label, 500 a page.
func (e *env) countRecords(ctx context.Context) (int, error) {
	opts := metav1.ListOptions{LabelSelector: recordLabel, Limit: 500}
	n := 0
	for {
		l, err := e.meta.Resource(e.records).Namespace(namespace).List(ctx, opts)
		e.listsMu.Lock()
		e.recordLists++
		e.listsMu.Unlock()
		if err != nil {
			return 0, err
		}
		n += len(l.Items)
		if l.Continue == "" {
			return n, nil
		}
		opts.Continue = l.Continue
	}
}

// ownLists is how many LIST requests of the records the bench made.
func (e *env) ownLists() int {
	e.listsMu.Lock()
	defer e.listsMu.Unlock()
	return e.recordLists
}

// apiRequests reads the API server's request counts by verb and resource.
func (e *env) apiRequests(ctx context.Context) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return benchutil.APIRequests(ctx, e.kube.Discovery().RESTClient())
}
