package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/kbprovider/backend/internal/client/apply"
	"github.com/kbprovider/backend/internal/client/flow"
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

// ioStreams are the command's standard input and outputs.
type ioStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
}

type options struct {
	streams ioStreams

	// The consumer cluster, from kubectl's flags.
	kubeconfig string
	overrides  clientcmd.ConfigOverrides
	userExtra  []string

	output            string
	showManagedFields bool

	exportURL string
	// printer is set when -o asks for one.
	printer *printer

	// No cluster: the BindingResponse to files or to stdout.
	outputDir     string
	printResponse bool
	force         bool

	// Cluster mode.
	dryRun         bool
	konnectorImage string
	skipKonnector  bool
	waitTimeout    time.Duration

	// Both.
	protocol    string
	flow        string
	clusterID   string
	timeout     time.Duration
	providerCA  string
	openBrowser bool
	qr          string
}

func (o *options) noCluster() bool { return o.outputDir != "" || o.printResponse }

// usageError is a mistake in the command line: exit 2.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// newCommand is the command; *code receives its exit code.
func newCommand(name string, streams ioStreams, code *int) *cobra.Command {
	o := &options{streams: streams}
	cmd := &cobra.Command{
		Use:   "kube-bind-poll [flags] <export-url>",
		Short: "Bind APIs of a kube-bind provider into this cluster",
		Long: `Binds APIs of a kube-bind provider into the cluster kubectl would talk to
(the current kubeconfig context, or the one kubectl's flags name): prints a URL
to open in any browser, waits while you log in and pick the APIs, then creates
what the konnector needs and the APIServiceBindings.

With --output-dir or --print-response it only hands over the provider's
BindingResponse, without a cluster. With --dry-run it opens no session at the
provider and prints what it would write in the cluster.

Exit codes: 0 bound, 1 binding failed, 2 usage error.`,
		Example: `  # Bind into the current context's cluster (as a kubectl plugin: kubectl bind-poll ...)
  kube-bind-poll https://bind.example.com/export

  # Another context; print the APIServiceBindings made
  kube-bind-poll --context prod -o yaml https://bind.example.com/export

  # What a bind would write, changing nothing here or at the provider
  kube-bind-poll --dry-run https://bind.example.com/export

  # No cluster: write binding-response.json and kubeconfig
  kube-bind-poll --output-dir ./out https://bind.example.com/export`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: name},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.complete(cmd, args); err != nil {
				return err
			}
			*code = o.run(cmd.Context())
			return nil
		},
	}
	cmd.SetIn(streams.In)
	cmd.SetOut(streams.Out)
	cmd.SetErr(streams.ErrOut)

	fs := cmd.Flags()
	fs.SortFlags = false
	fs.BoolVar(&o.dryRun, "dry-run", false, "Open no session at the provider and change nothing: check the cluster, read the provider's discovery, and print what the bind would write in the cluster before the APIs are picked (-o yaml, the default, or json).")
	fs.StringVar(&o.protocol, "protocol", "auto", `Protocol generation: "auto" (v1alpha2 when the provider offers its poll flow at /api/exports and the konnector that will run in the cluster serves it, else v1alpha1), "v1alpha1" or "v1alpha2".`)
	fs.StringVar(&o.flow, "flow", "", `"poll" or "callback" (default: poll when the provider offers it).`)
	fs.StringVar(&o.konnectorImage, "konnector-image", "", "Konnector image to deploy (default: "+apply.DefaultKonnectorV1alpha2+
		" when binding through v1alpha2, "+apply.DefaultKonnector+" through v1alpha1).")
	fs.BoolVar(&o.skipKonnector, "skip-konnector", false, "Do not deploy the konnector or its RBAC (it runs elsewhere).")
	fs.DurationVar(&o.waitTimeout, "wait-timeout", 5*time.Minute, "Bound of each wait in the cluster: for each request to succeed at the provider, for the konnector's CRD, for a failed request to go. Each says what it waits for; at the bound the command exits 1 saying what to do.")
	fs.StringVar(&o.clusterID, "cluster-id", "", "Present this cluster ID instead of the one kept in the cluster.")
	fs.DurationVar(&o.timeout, "timeout", 0, "Give up after this long in all (0: the browser part ends when the session expires, or after "+flow.DefaultCallbackWait.String()+" in the callback flow; each wait in the cluster is bounded by --wait-timeout).")
	fs.StringVar(&o.outputDir, "output-dir", "", "No cluster: write "+responseFile+" and "+kubeconfigFile+" here (mode 0600).")
	fs.BoolVar(&o.printResponse, "print-response", false, "No cluster: print the provider's BindingResponse on stdout (-o json, the default, or yaml).")
	fs.BoolVar(&o.force, "force", false, "Overwrite existing files in --output-dir.")
	fs.StringVar(&o.providerCA, "provider-certificate-authority", "", "PEM file of CA certificates to trust for the provider's URLs besides the system's (--certificate-authority is the cluster's, as in kubectl).")
	fs.BoolVar(&o.openBrowser, "open-browser", false, "Also open the URL in a browser of this machine.")
	fs.StringVar(&o.qr, "qr", "auto", `Show the URL as a QR code: "auto" (when stderr is a terminal), "always" or "never".`)
	fs.BoolVar(&o.showManagedFields, "show-managed-fields", false, "If true, keep the managedFields when printing objects in JSON or YAML format.")
	fs.StringVarP(&o.output, "output", "o", "", "Output format: json or yaml (also kyaml). Prints the APIServiceBindings bound; with --dry-run the planned objects; with --print-response the BindingResponse. Default: messages on stderr only.")
	o.addClusterFlags(fs)
	fs.Lookup("certificate-authority").Usage = "Path to a cert file for the certificate authority of the cluster (the provider's: --provider-certificate-authority)"
	fs.Lookup("namespace").Usage = "Only " + apply.Namespace + ": a bind writes there (the konnector's namespace) and cluster-wide; another value is refused"
	addKlogFlags(fs)
	fs.Lookup("v").Usage = "Log level: 2 logs every poll of the provider, 6 and more the cluster's requests (as kubectl)"
	return cmd
}

// addClusterFlags adds kubectl's flags for the cluster to talk to.
func (o *options) addClusterFlags(fs *pflag.FlagSet) {
	// As kubectl: a cluster with no server named falls back to its defaults.
	o.overrides = clientcmd.ConfigOverrides{ClusterDefaults: clientcmd.ClusterDefaults}
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to the kubeconfig file to use for CLI requests.")
	names := clientcmd.RecommendedConfigOverrideFlags("")
	// kubectl has none of these.
	names.AuthOverrideFlags.Username.LongName = ""
	names.AuthOverrideFlags.Password.LongName = ""
	names.ClusterOverrideFlags.ProxyURL.LongName = ""
	names.ClusterOverrideFlags.APIVersion.LongName = ""
	names.ClusterOverrideFlags.APIServer.ShortName = "s"
	clientcmd.BindOverrideFlags(&o.overrides, fs, names)
	fs.StringArrayVar(&o.userExtra, "as-user-extra", nil, "User extras to impersonate for the operation, this flag can be repeated to specify multiple values for the same key.")
}

// clientConfig is the consumer cluster's configuration as kubectl loads it.
func (o *options) clientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.DefaultClientConfig = &clientcmd.DefaultClientConfig
	rules.ExplicitPath = o.kubeconfig
	rules.Warner = func(err error) { fmt.Fprintf(o.streams.ErrOut, "Warning: %v\n", err) }
	overrides := o.overrides
	for _, extra := range o.userExtra {
		key, value, ok := strings.Cut(extra, "=")
		if !ok {
			continue
		}
		if overrides.AuthInfo.ImpersonateUserExtra == nil {
			overrides.AuthInfo.ImpersonateUserExtra = map[string][]string{}
		}
		overrides.AuthInfo.ImpersonateUserExtra[key] = append(overrides.AuthInfo.ImpersonateUserExtra[key], value)
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &overrides)
}

// addKlogFlags adds klog's -v and --vmodule, as kubectl has them.
func addKlogFlags(fs *pflag.FlagSet) {
	gfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(gfs)
	for _, name := range []string{"v", "vmodule"} {
		fs.AddGoFlag(gfs.Lookup(name))
	}
}

// complete checks the command line and fills in what follows from it.
func (o *options) complete(cmd *cobra.Command, args []string) error {
	switch {
	case len(args) != 1:
		return usagef("expected exactly one argument, the provider's export URL")
	case !strings.HasPrefix(args[0], "http://") && !strings.HasPrefix(args[0], "https://"):
		return usagef("export URL %q must start with http:// or https://", args[0])
	case o.outputDir != "" && o.printResponse:
		return usagef("choose one of --output-dir and --print-response")
	case o.dryRun && o.noCluster():
		return usagef("--dry-run plans a bind into a cluster; it does not go with --output-dir or --print-response")
	case o.outputDir != "" && o.output != "":
		return usagef("-o does not go with --output-dir: the files are the output (--print-response prints the BindingResponse)")
	case o.timeout < 0 || o.waitTimeout <= 0:
		return usagef("--timeout must not be negative, --wait-timeout must be positive")
	case o.flow != flow.FlowAuto && o.flow != flow.FlowPoll && o.flow != flow.FlowCallback:
		return usagef(`--flow takes "poll" or "callback", not %q`, o.flow)
	case o.protocol != "auto" && o.protocol != flow.ProtocolV1alpha1 && o.protocol != flow.ProtocolV1alpha2:
		return usagef(`--protocol takes "auto", "v1alpha1" or "v1alpha2", not %q`, o.protocol)
	case o.protocol == flow.ProtocolV1alpha2 && o.flow == flow.FlowCallback:
		return usagef("--protocol v1alpha2 binds through the poll flow only; it does not go with --flow callback")
	case o.qr != "auto" && o.qr != "always" && o.qr != "never":
		return usagef(`--qr takes "auto", "always" or "never", not %q`, o.qr)
	case o.overrides.Context.Namespace != "" && o.overrides.Context.Namespace != apply.Namespace:
		return usagef("--namespace: a bind writes to namespace %s (the konnector's) and cluster-scoped objects; it cannot be changed", apply.Namespace)
	}
	o.exportURL = args[0]
	format := o.output
	switch {
	case format == "" && o.dryRun:
		format = "yaml"
	case format == "" && o.printResponse:
		format = "json"
	}
	if format != "" {
		p, err := newPrinter(format, o.showManagedFields)
		if err != nil {
			return usageError{err}
		}
		o.printer = p
	}
	return nil
}

// run runs the command line args and returns the exit code.
func run(ctx context.Context, name string, args []string, streams ioStreams) int {
	defer klog.Flush()
	code := exitOK
	cmd := newCommand(name, streams, &code)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return code
	}
	// Ours and cobra's (flags, arguments) alike are usage errors.
	fmt.Fprintf(streams.ErrOut, "kube-bind-poll: %v\nSee '%s --help' for usage.\n", err, name)
	return exitUsage
}
