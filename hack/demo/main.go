// Command demo runs the backend locally with real parts, for trying it out:
// a control plane (etcd, kube-apiserver, kube-controller-manager) as the
// provider cluster, the kube-bind CRDs and two example exported APIs, a
// second control plane as the consumer cluster, a real OpenID Connect
// provider with a demo user, and the backend. It prints the export URL, the
// user's credentials and the one command that binds into the consumer
// cluster. Its clusters have no nodes, so the konnector that command
// deploys never starts there: the demo runs the released konnector as a
// local process in its place, as the command's ServiceAccount. It runs
// until Ctrl-C (SIGINT) or SIGTERM, and stops everything it started.
//
// Start it with hack/demo.sh, which installs what is missing and builds this
// command next to the backend, kube-bind-poll and the konnector's network
// bridge, where it looks for them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/localenv/konnector"
)

// T0Env holds the start time (Unix nanoseconds) of hack/demo.sh, so the
// "ready" line can count the installs and the build too.
const T0Env = "KUBE_BIND_DEMO_T0"

type options struct {
	stateDir        string
	listenAddress   string
	oidcAddress     string
	diagAddress     string
	binDir          string // kube-apiserver & co.; "" = found like the tests do
	backendBinary   string
	pollBinary      string
	netbridgeBinary string
	user            string
	password        string
	prettyName      string
	node            bool
}

func main() {
	// Children get Linux's parent-death signal, which fires when the thread
	// that started them ends: keep the main goroutine, which starts them, on
	// the main thread, which lives as long as the process.
	runtime.LockOSThread()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func parseOptions(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	self, _ := os.Executable()
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.stateDir, "state-dir", "", "folder for logs, certificates, kubeconfigs and the poll client's output (default: a new temporary folder)")
	fs.StringVar(&o.listenAddress, "listen-address", "127.0.0.1:8080", "address of the backend; its URL is http://<listen-address>")
	fs.StringVar(&o.oidcAddress, "oidc-address", "127.0.0.1:5556", "address of the OpenID Connect provider")
	fs.StringVar(&o.diagAddress, "diagnostics-address", "127.0.0.1:9090", "address of the backend's probes, metrics and status page (/statusz)")
	fs.StringVar(&o.binDir, "bin-dir", "", "folder of etcd, kube-apiserver, kube-controller-manager and kubectl (default: $KUBE_BIND_TEST_BINARIES, else the cache of hack/install-test-binaries.sh)")
	fs.StringVar(&o.backendBinary, "backend-binary", filepath.Join(filepath.Dir(self), "backend"), "the backend (cmd/backend), built")
	fs.StringVar(&o.pollBinary, "poll-binary", filepath.Join(filepath.Dir(self), "kube-bind-poll"), "the poll client (cmd/kube-bind-poll), built")
	fs.StringVar(&o.netbridgeBinary, "netbridge-binary", filepath.Join(filepath.Dir(self), "netbridge"), "the konnector's network bridge (internal/localenv/konnector/netbridge), built")
	fs.StringVar(&o.user, "user", "demo", "name of the demo user at the OpenID Connect provider")
	fs.StringVar(&o.password, "password", "demo-password", "password of the demo user")
	fs.StringVar(&o.prettyName, "pretty-name", "kube-bind demo provider", "provider name shown to consumers")
	fs.BoolVar(&o.node, "node", false, "run the provider cluster with a node (root only): the backend as the chart's pods behind their Service at http://"+nodeServiceIP+"; --listen-address and --diagnostics-address are then unused")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, b := range []struct{ flag, path string }{{"--backend-binary", o.backendBinary}, {"--poll-binary", o.pollBinary}, {"--netbridge-binary", o.netbridgeBinary}} {
		if st, err := os.Stat(b.path); err != nil || st.IsDir() {
			return nil, fmt.Errorf("%s %s: not found; start the demo with hack/demo.sh, which builds it", b.flag, b.path)
		}
	}
	if static := filepath.Join(filepath.Dir(o.backendBinary), "backend-static"); o.node {
		if _, err := os.Stat(static); err != nil {
			return nil, fmt.Errorf("--node: %s (the backend built for an image) not found; start the demo with hack/demo.sh --node, which builds it", static)
		}
	}
	if o.user == "" || o.password == "" {
		return nil, errors.New("--user and --password must not be empty")
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	begin := time.Now()
	if ns, err := strconv.ParseInt(os.Getenv(T0Env), 10, 64); err == nil {
		begin = time.Unix(0, ns)
	}
	o, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return 2
	}

	// The first SIGINT or SIGTERM stops the demo in order; after it, the
	// default action applies again, so a second Ctrl-C ends it at once (the
	// children then die with it: parent-death signal).
	ctx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()

	d := &demo{opts: o, log: stderr}
	if err := d.start(ctx); err != nil {
		interrupted := ctx.Err() != nil
		stopSignals() // (this cancels ctx too)
		if interrupted {
			fmt.Fprintln(stderr, "demo: interrupted while starting; stopping what was started")
		} else {
			fmt.Fprintf(stderr, "demo: %v\n", err)
		}
		d.stop()
		return 1
	}
	d.printReady(stdout, time.Since(begin))

	code := 0
	select {
	case <-ctx.Done():
	case err := <-d.backendExited:
		fmt.Fprintf(stderr, "demo: the backend exited (%v); see %s\n", err, d.path("backend.log"))
		code = 1
	case <-d.idp.Done():
		fmt.Fprintf(stderr, "demo: the OpenID Connect provider exited; see %s\n", d.path("oidc-provider.log"))
		code = 1
	}
	stopSignals()
	fmt.Fprintln(stderr, "demo: stopping (Ctrl-C again ends it at once)")
	t0 := time.Now()
	d.stop()
	fmt.Fprintf(stderr, "demo: stopped in %s; logs kept in %s\n", time.Since(t0).Round(100*time.Millisecond), o.stateDir)
	return code
}

func (d *demo) printReady(w io.Writer, took time.Duration) {
	o := d.opts
	export := d.baseURL + "/export"
	kubectl := shellQuote(filepath.Join(d.cp.BinDir(), "kubectl"))
	provider := shellQuote(d.cp.AdminKubeconfigPath())
	consumer := shellQuote(d.consumerCP.AdminKubeconfigPath())
	poll := shellQuote(o.pollBinary)
	skip := ""
	if d.konnectorBinary == "" {
		skip = " --skip-konnector"
	}
	fmt.Fprintf(w, `
kube-bind demo is ready (came up in %s).

  Export URL:   %s
  Demo user:    %s
  Password:     %s
  (identity provider at %s)
  (%s)

Bind APIs into the consumer cluster, a second local cluster, with one command
in another terminal. It prints a URL to open in a browser: log in there, tick
APIs, press Bind.

  %s%s --kubeconfig %s %s

(the same as a kubectl plugin, with the demo's kubectl and kubectl-bind_poll
on your PATH:
  export PATH=%s:%s:$PATH
  kubectl bind-poll%s --kubeconfig %s %s)

`,
		took.Round(100*time.Millisecond),
		export, o.user, o.password, d.idp.IssuerURL, d.statusHint(),
		poll, skip, consumer, export,
		shellQuote(filepath.Dir(o.pollBinary)), shellQuote(d.cp.BinDir()),
		skip, consumer, export)
	if d.releasedCLI != "" {
		cfg := shellQuote(d.path("kube-bind-config.yaml"))
		fmt.Fprintf(w, `Or with the tool consumers install today, the released kubectl-bind %s:
log in once, then bind in the browser or by template:

  %s login %s --config-file %s
  %s --kubeconfig %s --config-file %s%s
  %s apiservice --template-name %s --name redises --kubeconfig %s --config-file %s%s

`, konnector.ReleasedV1alpha2,
			shellQuote(d.releasedCLI), d.baseURL, cfg,
			shellQuote(d.releasedCLI), consumer, cfg, skip,
			shellQuote(d.releasedCLI), exampleapis.Redis.Name(), consumer, cfg, skip)
	}
	if d.konnectorBinary != "" {
		fmt.Fprintf(w, `The command deploys the konnector into the consumer cluster, where its pods
cannot run (the demo's clusters have no nodes); so the demo runs it here as a
process, as the command's ServiceAccount kube-bind/konnector (log:
%s). Once the command says "Bound", the API is there:

  %s --kubeconfig %s get apiservicebindings
  %s --kubeconfig %s create -f %s
  %s --kubeconfig %s get mangodbs -A

and the konnector syncs the object to the provider cluster:

  %s --kubeconfig %s get mangodbs -A

`,
			d.path("konnector.log"),
			kubectl, consumer,
			kubectl, consumer, shellQuote(d.path("my-db.yaml")),
			kubectl, consumer,
			kubectl, provider)
	} else {
		fmt.Fprintf(w, `The released konnector %s was not found (%v),
so nothing runs the konnector for the consumer cluster: the command above
skips it (--skip-konnector). The APIs are then bound (the APIServiceBindings
exist) but not synced: the consumer cluster gets no CRDs of them, and nothing
reaches the provider. To have the demo run the konnector, set %s to the
folder of the release (konnector.gz, SHA256SUMS) and start it again.

`, konnector.ReleasedV1alpha2, d.konnectorErr, konnector.PeersEnv)
	}
	fmt.Fprintf(w, `The provider cluster:

  %s --kubeconfig %s get namespaces

State and logs: %s
  backend.log, oidc-provider.log, konnector.log,
  controlplane/ (provider) and consumer-controlplane/: {etcd,kube-apiserver,kube-controller-manager}.log

Press Ctrl-C to stop everything.
`,
		kubectl, provider,
		o.stateDir)
}

// shellQuote quotes a path for the printed commands, which users paste into
// a shell (a --state-dir may hold spaces).
func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"\\$`!*?[]{}()<>|&;#~") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
