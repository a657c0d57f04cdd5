package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	"golang.org/x/term"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/kbprovider/backend/internal/bindflow"
	"github.com/kbprovider/backend/internal/consumer"
	"github.com/kbprovider/backend/pkg/pollclient"
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

// Output file names in --output-dir.
const (
	responseFile   = "binding-response.json"
	kubeconfigFile = "kubeconfig"
)

type options struct {
	exportURL string

	// Files-only mode (no cluster).
	outputDir string
	output    string // "-" (files mode), "yaml" or "json" (dry run)
	force     bool

	// Cluster mode.
	kubeconfig     string
	context        string
	dryRun         bool
	konnectorImage string
	skipKonnector  bool
	waitTimeout    time.Duration

	// Both.
	protocol    string
	flow        string
	clusterID   string
	timeout     time.Duration
	caFile      string
	verbose     bool
	openBrowser bool
	qr          string
}

func (o *options) filesOnly() bool { return o.outputDir != "" || o.output == "-" }

func parseArgs(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("kube-bind-poll", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the consumer cluster (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context of the consumer cluster (default: the current one)")
	fs.BoolVar(&o.dryRun, "dry-run", false, "print every object the bind would create (-o yaml|json) and change nothing")
	fs.StringVar(&o.konnectorImage, "konnector-image", "", "konnector image to deploy (default: "+consumer.DefaultKonnectorV1alpha2+
		" when binding through v1alpha2, "+consumer.DefaultKonnector+" through v1alpha1)")
	fs.BoolVar(&o.skipKonnector, "skip-konnector", false, "do not deploy the konnector or its RBAC (it runs elsewhere)")
	fs.DurationVar(&o.waitTimeout, "wait-timeout", 5*time.Minute, "how long to wait for each request to succeed and for the konnector")
	fs.StringVar(&o.outputDir, "output-dir", "", "files only, no cluster: write "+responseFile+" and "+kubeconfigFile+" here (mode 0600)")
	fs.StringVar(&o.output, "o", "", `"yaml" or "json": format of --dry-run; "-": files only, the BindingResponse JSON to stdout`)
	fs.BoolVar(&o.force, "force", false, "overwrite existing output files (--output-dir)")
	fs.StringVar(&o.flow, "flow", "", `"poll" or "callback" (default: poll when the provider offers it)`)
	fs.StringVar(&o.protocol, "protocol", "auto", `protocol generation: "auto" (v1alpha2 when the provider offers its poll flow at /api/exports, else v1alpha1), "v1alpha1" or "v1alpha2"`)
	fs.StringVar(&o.clusterID, "cluster-id", "", "present this cluster ID instead of the one kept in the cluster")
	fs.DurationVar(&o.timeout, "timeout", 0, "give up after this long (0: when the session expires)")
	fs.StringVar(&o.caFile, "certificate-authority", "", "PEM file of CA certificates to trust for the provider's URLs besides the system's")
	fs.BoolVar(&o.verbose, "v", false, "report every poll on stderr")
	fs.BoolVar(&o.openBrowser, "open-browser", false, "also open the URL in a browser of this machine")
	fs.StringVar(&o.qr, "qr", "auto", `show the URL as a QR code: "auto" (when stderr is a terminal), "always" or "never"`)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: kube-bind-poll [flags] <export-url>\n"+
			"       kubectl bind-poll [flags] <export-url>   (installed as kubectl-bind_poll)\n\n"+
			"Binds APIs of a kube-bind provider into the cluster of the current kubeconfig\n"+
			"context: prints a URL to open in any browser, waits while you log in and pick\n"+
			"the APIs, then creates what the konnector needs and the APIServiceBindings.\n"+
			"With --output-dir it only writes the BindingResponse and its kubeconfig.\n\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "\nExit codes: 0 bound, 1 binding failed, 2 usage error.\n")
	}
	// Accept flags after the URL too.
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	switch {
	case len(positional) != 1:
		fs.Usage()
		return nil, errors.New("expected exactly one argument, the provider's export URL")
	case !strings.HasPrefix(positional[0], "http://") && !strings.HasPrefix(positional[0], "https://"):
		return nil, fmt.Errorf("export URL %q must start with http:// or https://", positional[0])
	case o.output != "" && o.output != "-" && o.output != "yaml" && o.output != "json":
		return nil, fmt.Errorf(`-o takes "yaml" or "json" (with --dry-run) or "-" (files only, to stdout); use --output-dir for files`)
	case (o.output == "yaml" || o.output == "json") && !o.dryRun:
		return nil, fmt.Errorf("-o %s goes with --dry-run", o.output)
	case o.dryRun && o.filesOnly():
		return nil, errors.New("--dry-run binds into a cluster; it does not go with --output-dir or -o -")
	case o.outputDir != "" && o.output == "-":
		return nil, errors.New("choose one of --output-dir and -o -")
	case o.timeout < 0 || o.waitTimeout <= 0:
		return nil, errors.New("--timeout must not be negative, --wait-timeout must be positive")
	case o.flow != bindflow.FlowAuto && o.flow != bindflow.FlowPoll && o.flow != bindflow.FlowCallback:
		return nil, fmt.Errorf(`--flow takes "poll" or "callback", not %q`, o.flow)
	case o.protocol != "auto" && o.protocol != bindflow.ProtocolV1alpha1 && o.protocol != bindflow.ProtocolV1alpha2:
		return nil, fmt.Errorf(`--protocol takes "auto", "v1alpha1" or "v1alpha2", not %q`, o.protocol)
	case o.protocol == bindflow.ProtocolV1alpha2 && o.flow == bindflow.FlowCallback:
		return nil, errors.New("--protocol v1alpha2 binds through the poll flow only; it does not go with --flow callback")
	case o.qr != "auto" && o.qr != "always" && o.qr != "never":
		return nil, fmt.Errorf(`--qr takes "auto", "always" or "never", not %q`, o.qr)
	}
	if o.dryRun && o.output == "" {
		o.output = "yaml"
	}
	o.exportURL = positional[0]
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	start := time.Now()
	o, err := parseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "kube-bind-poll: %v\n", err)
		return exitUsage
	}
	hc, err := httpClient(o.caFile)
	if err != nil {
		fmt.Fprintf(stderr, "kube-bind-poll: %v\n", err)
		return exitUsage
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	var code int
	if o.filesOnly() {
		code = runFiles(ctx, o, hc, stdout, stderr)
	} else {
		code = runCluster(ctx, o, hc, stdout, stderr, start)
	}
	return code
}

// failed reports err and returns exitFailed.
func failed(o *options, stderr io.Writer, err error) int {
	switch {
	case errors.Is(err, context.DeadlineExceeded) && o.timeout > 0:
		fmt.Fprintf(stderr, "kube-bind-poll: gave up after --timeout %s\n", o.timeout)
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(stderr, "kube-bind-poll: interrupted; run the same command again to finish")
	default:
		fmt.Fprintf(stderr, "kube-bind-poll: %v\n", err)
		if hint := hintFor(err); hint != "" {
			fmt.Fprintln(stderr, hint)
		}
	}
	return exitFailed
}

// flowOptions are the options of the browser part common to both modes.
func flowOptions(o *options, hc *http.Client, stderr io.Writer) bindflow.Options {
	fo := bindflow.Options{HTTPClient: hc, UserAgent: "kube-bind-poll", Flow: o.flow, Out: stderr}
	if o.protocol != "auto" {
		fo.Protocol = o.protocol
	}
	switch o.qr {
	case "always":
		fo.QR = true
	case "auto":
		f, ok := stderr.(*os.File)
		fo.QR = ok && term.IsTerminal(int(f.Fd()))
	}
	if o.openBrowser {
		fo.OpenBrowser = openBrowser
	}
	if o.verbose {
		fo.Progress = func(pr pollclient.Progress) {
			if pr.Err != nil {
				fmt.Fprintf(stderr, "poll %d: %s (%v); next in %s\n", pr.Attempt, pr.State, pr.Err, pr.Wait.Round(time.Millisecond))
				return
			}
			fmt.Fprintf(stderr, "poll %d: %s; next in %s\n", pr.Attempt, pr.State, pr.Wait.Round(time.Millisecond))
		}
	}
	return fo
}

// restConfig resolves the consumer cluster as kubectl does.
func restConfig(o *options) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: o.context}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, errors.New("no cluster to bind into: no kubeconfig found (--kubeconfig, $KUBECONFIG, ~/.kube/config) " +
			"and not running in a pod; pass --output-dir DIR to only write the binding's files")
	}
	if err != nil {
		return nil, fmt.Errorf("the consumer cluster's kubeconfig: %w", err)
	}
	return cfg, nil
}

func runCluster(ctx context.Context, o *options, hc *http.Client, stdout, stderr io.Writer, start time.Time) int {
	cfg, err := restConfig(o)
	if err != nil {
		fmt.Fprintf(stderr, "kube-bind-poll: %v\n", err)
		return exitUsage
	}
	binder, err := consumer.New(consumer.Options{
		Config: cfg, KonnectorImage: o.konnectorImage, SkipKonnector: o.skipKonnector,
		DryRun: o.dryRun, WaitTimeout: o.waitTimeout, Progress: stderr,
	})
	if err != nil {
		return failed(o, stderr, err)
	}
	// Everything that can fail without the user is checked before the
	// browser step.
	if err := binder.Check(ctx); err != nil {
		return failed(o, stderr, err)
	}
	id, err := binder.LoadIdentity(ctx, o.exportURL)
	if err != nil {
		return failed(o, stderr, err)
	}
	fmt.Fprintf(stderr, "Binding into the cluster at %s (%s).\n", cfg.Host, describeIdentity(id, o.clusterID))
	if o.clusterID != "" {
		id = consumer.Identity{ClusterID: o.clusterID}
	}
	fo := flowOptions(o, hc, stderr)
	fo.ClusterID, fo.ClusterSecret = id.ClusterID, id.ClusterSecret
	res, err := bindflow.Obtain(ctx, o.exportURL, fo)
	if err != nil {
		return failed(o, stderr, err)
	}
	answered := time.Now()
	fmt.Fprintf(stderr, "The provider bound %d API(s) in namespace %s on %s (%s flow, %s). Completing in the cluster:\n",
		len(res.Response.Requests), res.Namespace, res.Server, res.Flow, res.Response.APIVersion)
	out, err := binder.Bind(ctx, consumer.Binding{
		Protocol:   res.Protocol,
		ExportURL:  o.exportURL,
		Identity:   consumer.Identity{ClusterID: res.ClusterID, ClusterSecret: res.ClusterSecret},
		Kubeconfig: res.Response.Kubeconfig,
		Server:     res.Server,
		Namespace:  res.Namespace,
		Requests:   res.Response.Requests,
	})
	if err != nil {
		return failed(o, stderr, err)
	}
	if o.dryRun {
		if err := printObjects(stdout, o.output, binder.Planned()); err != nil {
			return failed(o, stderr, err)
		}
		fmt.Fprintf(stderr, "Dry run: nothing changed; %d object(s) printed.\n", len(binder.Planned()))
		return exitOK
	}
	fmt.Fprintf(stderr, "Bound %s (kubeconfig Secret %s/%s) in %s after the provider's answer, %s in all.\n",
		strings.Join(out.Bindings, ", "), consumer.Namespace, out.SecretName,
		time.Since(answered).Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))
	return exitOK
}

func describeIdentity(id consumer.Identity, override string) string {
	switch {
	case override != "":
		return "presenting cluster ID " + override + " from --cluster-id"
	case id.ClusterID == "":
		return "first bind to this provider: it will issue a cluster ID"
	case id.ClusterSecret != "":
		return "presenting the kept cluster ID " + id.ClusterID + " with its proof"
	default:
		return "presenting the kept cluster ID " + id.ClusterID
	}
}

// printObjects writes objs as YAML documents or as a JSON List.
func printObjects(w io.Writer, format string, objs []runtime.Object) error {
	if format == "json" {
		b, err := json.MarshalIndent(map[string]any{"apiVersion": "v1", "kind": "List", "items": objs}, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	for _, obj := range objs {
		b, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "---\n%s", b); err != nil {
			return err
		}
	}
	return nil
}

func runFiles(ctx context.Context, o *options, hc *http.Client, stdout, stderr io.Writer) int {
	// Refuse unwritable or existing outputs before the user spends time in
	// the browser.
	if o.output == "" {
		if fi, err := os.Stat(o.outputDir); err != nil || !fi.IsDir() {
			fmt.Fprintf(stderr, "kube-bind-poll: --output-dir %s is not a directory\n", o.outputDir)
			return exitUsage
		}
		if !o.force {
			for _, name := range []string{responseFile, kubeconfigFile} {
				p := filepath.Join(o.outputDir, name)
				if _, err := os.Lstat(p); err == nil {
					fmt.Fprintf(stderr, "kube-bind-poll: %s exists; remove it, choose another --output-dir, or pass --force\n", p)
					return exitUsage
				}
			}
		}
	}
	fo := flowOptions(o, hc, stderr)
	fo.ClusterID = o.clusterID
	res, err := bindflow.Obtain(ctx, o.exportURL, fo)
	if err != nil {
		return failed(o, stderr, err)
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, res.Raw, "", "  "); err != nil {
		return failed(o, stderr, err)
	}
	pretty.WriteByte('\n')
	if o.output == "-" {
		if _, err := stdout.Write(pretty.Bytes()); err != nil {
			return failed(o, stderr, err)
		}
	} else {
		if err := writeFile(o.outputDir, responseFile, pretty.Bytes(), o.force); err != nil {
			return failed(o, stderr, err)
		}
		if err := writeFile(o.outputDir, kubeconfigFile, res.Response.Kubeconfig, o.force); err != nil {
			return failed(o, stderr, err)
		}
	}
	fmt.Fprintf(stderr, "Bound %d request(s): namespace %s on %s.\n", len(res.Response.Requests), res.Namespace, res.Server)
	if o.output == "" {
		fmt.Fprintf(stderr, "Wrote %s and %s in %s.\n", responseFile, kubeconfigFile, o.outputDir)
	}
	// Without a cluster there is nowhere to keep the cluster ID.
	fmt.Fprintf(stderr, "Cluster ID %s: pass --cluster-id %s with --output-dir next time to bind into the same provider namespace "+
		"(binds into a cluster keep it there themselves).\n", res.ClusterID, res.ClusterID)
	return exitOK
}

func hintFor(err error) string {
	var rf *consumer.RequestFailedError
	switch {
	case errors.Is(err, pollclient.ErrAccessDenied):
		return "The binding was cancelled in the browser or refused by the provider."
	case errors.Is(err, pollclient.ErrExpired), errors.Is(err, pollclient.ErrInvalidSignature):
		return "Run the command again to start a new session."
	case errors.Is(err, pollclient.ErrNoPollMethod):
		return "The provider offers only the callback flow: leave out --flow poll."
	case errors.As(err, &rf):
		return "Nothing was bound; fix what the provider says, then run the command again."
	}
	return ""
}

// openBrowser opens u in the desktop's browser.
func openBrowser(u string) error {
	var cmd *exec.Cmd
	switch goruntime.GOOS {
	case "darwin":
		cmd = exec.Command("open", u)
	case "windows":
		cmd = exec.Command("rundll32", "url.dll,FileProtocolHandler", u)
	default:
		cmd = exec.Command("xdg-open", u)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }()
	return nil
}

// writeFile writes data to dir/name with mode 0600, through a temporary
// file and a rename, so a reader never sees half a file. Without force it
// refuses to replace an existing file.
func writeFile(dir, name string, data []byte, force bool) error {
	path := filepath.Join(dir, name)
	if !force {
		if _, err := os.Lstat(path); err == nil {
			return fmt.Errorf("%s exists; not overwriting it without --force", path)
		}
	}
	f, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op after the rename
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func httpClient(caFile string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--certificate-authority: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--certificate-authority: no PEM certificates in %s", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr, Timeout: time.Minute}, nil
}
