package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/node"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
)

const (
	readyTimeout   = 90 * time.Second
	backendStopMax = 10 * time.Second
)

// demo is one run: what it started, to stop it again in reverse order.
type demo struct {
	opts *options
	log  io.Writer

	baseURL       string
	cp            *controlplane.ControlPlane // the provider cluster
	node          *node.Node                 // with --node: the provider cluster's node
	consumerCP    *controlplane.ControlPlane // the consumer cluster
	idp           *oidcprovider.Provider
	idpLog        *os.File
	backend       *exec.Cmd
	backendLog    *os.File
	backendExited chan error // receives the backend's exit, once
	backendDone   chan struct{}

	konnectorBinary string // the released konnector; "" when not found
	releasedCLI     string // the released kubectl-bind; "" when not found
	konnectorErr    error  // why it was not found
	konnectorLog    *os.File
	watchCancel     context.CancelFunc // ends the konnector watcher
	watchDone       chan struct{}      // closed when it has ended
}

func (d *demo) path(name string) string { return filepath.Join(d.opts.stateDir, name) }

func (d *demo) step(format string, args ...any) {
	fmt.Fprintf(d.log, "[demo %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (d *demo) start(ctx context.Context) error {
	o := d.opts
	d.baseURL = "http://" + o.listenAddress
	// Refuse taken ports before starting anything, naming the flag.
	addrs := []struct{ flag, addr string }{{"--listen-address", o.listenAddress}, {"--oidc-address", o.oidcAddress},
		{"--diagnostics-address", o.diagAddress}}
	if o.node {
		// The backend is the chart's pods behind their Service; the
		// identity provider listens on the node's address.
		if err := node.Preflight(); err != nil {
			return err
		}
		a, err := d.oidcAddressOnNode()
		if err != nil {
			return err
		}
		addrs = addrs[:0]
		o.oidcAddress = a
	}
	for _, a := range addrs {
		l, err := net.Listen("tcp", a.addr)
		if err != nil {
			return fmt.Errorf("cannot listen on %s (%w): is another demo running? Choose another address with %s", a.addr, err, a.flag)
		}
		l.Close()
	}
	if o.stateDir == "" {
		dir, err := os.MkdirTemp("", "kube-bind-demo-")
		if err != nil {
			return err
		}
		o.stateDir = dir
	}
	if err := os.MkdirAll(o.stateDir, 0o700); err != nil {
		return err
	}

	// Meanwhile: the konnector's binary is checked against its sums
	// (64 MB, a third of a second).
	found := make(chan struct{})
	go func() {
		defer close(found)
		d.findKonnector()
	}()
	err := d.startClusters(ctx)
	<-found
	if err != nil {
		return err
	}

	t := time.Now()
	if !o.node { // (with --node, the chart installs them)
		if err := exampleapis.Prepare(ctx, d.cp, exampleAPIs...); err != nil {
			return fmt.Errorf("installing the kube-bind CRDs and the example APIs: %w", err)
		}
		d.step("installed the kube-bind CRDs, the consumer ClusterRoles and the example APIs %s (%s)", describeAPIs(), since(t))
	}

	t = time.Now()
	if d.idpLog, err = os.Create(d.path("oidc-provider.log")); err != nil {
		return err
	}
	secret := procs.RandomKey(32)
	d.idp, err = oidcprovider.RunRetrying(ctx, oidcprovider.Options{
		Address:      o.oidcAddress,
		ClientID:     "kube-bind-demo",
		ClientSecret: secret,
		RedirectURIs: []string{d.baseURL + "/callback"},
		Users:        []oidcprovider.User{{Name: o.user, Password: o.password, Email: o.user + "@example.com", Groups: []string{"kube-bind-demo"}}},
		Log:          d.idpLog,
	}, func(attempt int, err error) {
		d.step("OpenID Connect provider: start %d failed, starting it again: %v", attempt, err)
	})
	if err != nil {
		return fmt.Errorf("OpenID Connect provider (log: %s): %w", d.path("oidc-provider.log"), err)
	}
	d.step("OpenID Connect provider up at %s (%s)", d.idp.IssuerURL, since(t))

	t = time.Now()
	if o.node {
		if err := d.installChart(ctx, secret); err != nil {
			return err
		}
	} else {
		if err := d.startBackend(ctx, secret); err != nil {
			return fmt.Errorf("backend (log: %s): %w", d.path("backend.log"), err)
		}
		d.step("backend ready at %s (%s)", d.baseURL, since(t))
	}

	if d.konnectorBinary != "" {
		if err := d.startKonnectorWatcher(); err != nil {
			return fmt.Errorf("konnector: %w", err)
		}
	} else if err := d.installBindingsAPI(ctx); err != nil {
		return fmt.Errorf("installing the APIServiceBinding CRD into the consumer cluster: %w", err)
	}
	if err := writeExampleObject(d.path("my-db.yaml")); err != nil {
		return err
	}
	return ctx.Err()
}

// startClusters starts the provider and the consumer cluster, each
// etcd, kube-apiserver and kube-controller-manager, at once: a start mostly
// waits (for etcd, for the API server's readiness), so two take little
// longer than one.
func (d *demo) startClusters(ctx context.Context) error {
	o := d.opts
	t := time.Now()
	d.step("starting etcd, kube-apiserver and kube-controller-manager twice, the provider and the consumer cluster (logs: %s, %s)",
		d.path("controlplane"), d.path("consumer-controlplane"))
	var consumerErr error
	consumerDone := make(chan struct{})
	go func() {
		defer close(consumerDone)
		cp, err := controlplane.Start(ctx, controlplane.Options{BinDir: o.binDir, Dir: d.path("consumer-controlplane")})
		if err != nil {
			consumerErr = fmt.Errorf("consumer control plane: %w", err)
			return
		}
		d.step("consumer control plane up at %s (%s)", cp.Host(), since(t))
		d.consumerCP = cp
	}()
	var err error
	if o.node {
		err = d.startNode(ctx)
	} else {
		var cp *controlplane.ControlPlane
		cp, err = controlplane.Start(ctx, controlplane.Options{BinDir: o.binDir, Dir: d.path("controlplane")})
		if err == nil {
			d.cp = cp
			d.step("provider control plane up at %s (%s)", cp.Host(), since(t))
		}
	}
	<-consumerDone
	if err != nil {
		return fmt.Errorf("provider control plane: %w", err)
	}
	return consumerErr
}

func (d *demo) startBackend(ctx context.Context, clientSecret string) error {
	o := d.opts
	signing, encryption := procs.RandomKey(32), procs.RandomKey(32)
	var err error
	if d.backendLog, err = os.Create(d.path("backend.log")); err != nil {
		return err
	}
	cmd := exec.Command(o.backendBinary,
		"--listen-address", o.listenAddress,
		"--diagnostics-address", o.diagAddress,
		"--external-url", d.baseURL,
		"--oidc-issuer-url", d.idp.IssuerURL,
		"--oidc-issuer-client-id", d.idp.ClientID,
		"--kubeconfig", d.cp.AdminKubeconfigPath(),
		"--pretty-name", o.prettyName,
		"--log-format", "text",
		"--shutdown-timeout", "5s",
	)
	// Secrets through the environment, not the command line (which ps shows).
	cmd.Env = append(os.Environ(),
		"KUBE_BIND_OIDC_ISSUER_CLIENT_SECRET="+clientSecret,
		"KUBE_BIND_COOKIE_SIGNING_KEY="+signing,
		"KUBE_BIND_COOKIE_ENCRYPTION_KEY="+encryption,
		// The demo's backend is the control plane's admin: nothing to confine.
		"KUBE_BIND_UNSAFE_SKIP_ADMISSION_POLICY_CHECK=true",
	)
	cmd.Stdout, cmd.Stderr = d.backendLog, d.backendLog
	// Its own process group: a Ctrl-C on the terminal reaches only the demo,
	// which stops the backend gracefully; the parent-death signal ends it if
	// the demo dies without doing so.
	if err := procs.StartTied(cmd); err != nil {
		d.backendLog.Close()
		return err
	}
	d.backend = cmd
	d.backendExited = make(chan error, 1)
	d.backendDone = make(chan struct{})
	go func() {
		d.backendExited <- cmd.Wait()
		close(d.backendDone)
	}()

	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	var last string
	for {
		// Ready, and the identity provider and the cluster answer: the
		// status page of the diagnostics listener says both.
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+o.diagAddress+"/statusz", nil)
		if resp, err := client.Do(req); err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && resp.Header.Get("X-Ready") == "true" &&
				!strings.Contains(string(body), "\n[-]") && !strings.Contains(string(body), "\n[?]") {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		select {
		case <-d.backendDone:
			return fmt.Errorf("exited while starting")
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s (/statusz: %s)", readyTimeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop ends what start started, in reverse order; safe after a partial start.
func (d *demo) stop() {
	d.stopKonnectorWatcher()
	if d.backend != nil {
		select {
		case <-d.backendDone:
		default:
			// SIGTERM: the backend finishes in-flight requests and exits.
			_ = d.backend.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.backendDone:
			case <-time.After(backendStopMax):
				d.step("the backend did not stop within %s; killing it", backendStopMax)
				_ = syscall.Kill(-d.backend.Process.Pid, syscall.SIGKILL)
				<-d.backendDone
			}
		}
		d.backendLog.Close()
	}
	if d.idp != nil {
		d.idp.Stop()
	}
	if d.idpLog != nil {
		d.idpLog.Close()
	}
	// The node puts the host back as it was (and stops its control plane).
	if d.node != nil {
		if drops, err := node.GuardDrops(); err != nil || drops > 0 {
			d.step("the node's network guard: %v, %d packets dropped that would have left this machine:\n%s", err, drops, node.GuardListing())
		}
		if err := d.node.Stop(); err != nil {
			d.step("%v", err)
		}
		d.cp = nil
	}
	// Both clusters at once, as they started.
	var wg sync.WaitGroup
	for _, cp := range []*controlplane.ControlPlane{d.cp, d.consumerCP} {
		if cp != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cp.Stop()
			}()
		}
	}
	wg.Wait()
	// The logs stay; etcd's data (tens of MB) need not, also of a start that
	// was interrupted (which stopped its servers itself).
	for _, dir := range []string{"controlplane", "consumer-controlplane"} {
		if d.opts.stateDir != "" { // (unset when the start failed before making it)
			_ = os.RemoveAll(filepath.Join(d.path(dir), "etcd"))
		}
	}
}

// exampleAPIs are the provider's APIs in the demo: two that consumers can
// bind, and one that is not exported (and so never offered).
var exampleAPIs = []exampleapis.API{exampleapis.MangoDB, exampleapis.Redis, exampleapis.SecretThing}

func describeAPIs() string {
	var names []string
	for _, a := range exampleAPIs {
		if a.Exported {
			names = append(names, a.Name()+" (exported)")
		} else {
			names = append(names, a.Name()+" (not exported)")
		}
	}
	return strings.Join(names, ", ")
}

func since(t time.Time) time.Duration { return time.Since(t).Round(10 * time.Millisecond) }
