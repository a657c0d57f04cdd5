package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	"golang.org/x/term"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kbprovider/backend/internal/client/apply"
	"github.com/kbprovider/backend/internal/client/flow"
	"github.com/kbprovider/backend/pkg/apis/v1alpha2"
	"github.com/kbprovider/backend/pkg/pollclient"
)

func (o *options) run(ctx context.Context) int {
	start := time.Now()
	hc, err := httpClient(o.providerCA)
	if err != nil {
		fmt.Fprintf(o.streams.ErrOut, "kube-bind-poll: %v\n", err)
		return exitUsage
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	if o.noCluster() {
		return o.runFiles(ctx, hc)
	}
	return o.runCluster(ctx, hc, start)
}

// failed reports err and returns exitFailed.
func (o *options) failed(err error) int {
	stderr := o.streams.ErrOut
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

// usage reports a usage error found after the command line was read.
func (o *options) usage(err error) int {
	fmt.Fprintf(o.streams.ErrOut, "kube-bind-poll: %v\n", err)
	return exitUsage
}

// flowOptions are the options of the browser part common to all modes.
func (o *options) flowOptions(hc *http.Client) flow.Options {
	stderr := o.streams.ErrOut
	fo := flow.Options{HTTPClient: hc, UserAgent: "kube-bind-poll", Flow: o.flow, Out: stderr, CallbackWait: o.timeout}
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
	if klog.V(2).Enabled() {
		fo.Progress = func(pr pollclient.Progress) {
			if pr.Err != nil {
				klog.Infof("poll %d: %s (%v); next in %s", pr.Attempt, pr.State, pr.Err, pr.Wait.Round(time.Millisecond))
				return
			}
			klog.Infof("poll %d: %s; next in %s", pr.Attempt, pr.State, pr.Wait.Round(time.Millisecond))
		}
	}
	return fo
}

// restConfig resolves the consumer cluster from kubectl's flags as
// kubectl does, except that where kubectl would fall back to its default
// server for lack of any kubeconfig, there is no cluster to bind into.
func (o *options) restConfig() (*rest.Config, error) {
	cc := o.clientConfig()
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("the consumer cluster's kubeconfig: %w", err)
	}
	if o.overrides.ClusterInfo.Server != "" {
		return cfg, nil
	}
	raw, err := cc.RawConfig()
	if err != nil {
		return nil, fmt.Errorf("the consumer cluster's kubeconfig: %w", err)
	}
	if _, inPod := rest.InClusterConfig(); len(raw.Clusters) == 0 && inPod != nil {
		return nil, errors.New("no cluster to bind into: no kubeconfig found (--kubeconfig, $KUBECONFIG, ~/.kube/config), " +
			"no --server, and not running in a pod; pass --output-dir DIR or --print-response to only hand over the binding")
	}
	return cfg, nil
}

func (o *options) runCluster(ctx context.Context, hc *http.Client, start time.Time) int {
	stderr := o.streams.ErrOut
	cfg, err := o.restConfig()
	if err != nil {
		return o.usage(err)
	}
	binder, err := apply.New(apply.Options{
		Config: cfg, KonnectorImage: o.konnectorImage, SkipKonnector: o.skipKonnector,
		WaitTimeout: o.waitTimeout, Progress: stderr,
	})
	if err != nil {
		return o.failed(err)
	}
	// Everything that can fail without the user is checked before the
	// browser step.
	if err := binder.Check(ctx); err != nil {
		return o.failed(err)
	}
	id, err := binder.LoadIdentity(ctx, o.exportURL)
	if err != nil {
		return o.failed(err)
	}
	found, err := binder.Detect(ctx)
	if err != nil {
		return o.failed(err)
	}
	fit := binder.Fit(found)
	fo := o.flowOptions(hc)
	fo.Fits = fit.Allows
	if o.dryRun {
		fmt.Fprintf(stderr, "Dry run: planning a bind into the cluster at %s (%s; %s).\n", cfg.Host, describeIdentity(id, o.clusterID), fit.Konnector)
		return o.runDryRun(ctx, binder, fit, fo)
	}
	fmt.Fprintf(stderr, "Binding into the cluster at %s (%s; %s).\n", cfg.Host, describeIdentity(id, o.clusterID), fit.Konnector)
	if o.clusterID != "" {
		id = apply.Identity{ClusterID: o.clusterID}
	}
	fo.ClusterID, fo.ClusterSecret = id.ClusterID, id.ClusterSecret
	ch, err := flow.Choose(ctx, o.exportURL, fo)
	if err != nil {
		return o.failed(err)
	}
	o.sayChoice(ch, fit)
	res, err := ch.Obtain(ctx, fo)
	if err != nil {
		return o.failed(err)
	}
	answered := time.Now()
	fmt.Fprintf(stderr, "The provider bound %d API(s) in namespace %s on %s (%s flow, %s). Completing in the cluster:\n",
		len(res.Response.Requests), res.Namespace, res.Server, res.Flow, res.Response.APIVersion)
	out, err := binder.Bind(ctx, apply.Binding{
		Protocol:   res.Protocol,
		ExportURL:  o.exportURL,
		Identity:   apply.Identity{ClusterID: res.ClusterID, ClusterSecret: res.ClusterSecret},
		Kubeconfig: res.Response.Kubeconfig,
		Server:     res.Server,
		Namespace:  res.Namespace,
		Requests:   res.Response.Requests,
	})
	if err != nil {
		return o.failed(err)
	}
	fmt.Fprintf(stderr, "Bound %s (kubeconfig Secret %s/%s) in %s after the provider's answer, %s in all.\n",
		strings.Join(out.Bindings, ", "), apply.Namespace, out.SecretName,
		time.Since(answered).Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))
	if o.printer != nil {
		items := make([]unstructured.Unstructured, len(out.BindingObjects))
		for i, b := range out.BindingObjects {
			items[i] = *b
		}
		if err := o.printer.printList(o.streams.Out, items); err != nil {
			return o.failed(err)
		}
	}
	return exitOK
}

// runDryRun reads the provider's discovery documents, opens no session
// (pressing Bind on its page would set up the provider's side), and
// prints what the bind would write in the cluster before the APIs are
// picked.
func (o *options) runDryRun(ctx context.Context, binder *apply.Binder, fit *apply.Fit, fo flow.Options) int {
	stderr := o.streams.ErrOut
	ch, err := flow.Choose(ctx, o.exportURL, fo)
	if err != nil {
		return o.failed(err)
	}
	o.sayChoice(ch, fit)
	fmt.Fprintf(stderr, "What the bind would write here before the APIs are picked:\n")
	planned, err := binder.Plan(ctx, ch.Protocol)
	if err != nil {
		return o.failed(err)
	}
	items := make([]unstructured.Unstructured, len(planned))
	for i, obj := range planned {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return o.failed(err)
		}
		items[i] = unstructured.Unstructured{Object: m}
	}
	if err := o.printer.printList(o.streams.Out, items); err != nil {
		return o.failed(err)
	}
	fmt.Fprintf(stderr, "Dry run: no session was opened at the provider and nothing changed there or in this cluster; %d object(s) printed.\n"+
		"A bind then shows a URL; once you pick APIs and press Bind there, the provider sets up (or reuses) this cluster's namespace "+
		"with credentials to it, and this command writes the kubeconfig Secret, creates one APIServiceExportRequest per API "+
		"in that namespace, adds the APIs to the konnector's ClusterRole and creates their APIServiceBindings.\n", len(items))
	return exitOK
}

// sayChoice says which generation and flow the bind takes and, where the
// cluster's konnector decided or is changed by it, why.
func (o *options) sayChoice(ch *flow.Choice, fit *apply.Fit) {
	line := fmt.Sprintf("%s binds through %s/%s with the %s flow", ch.ProviderName, apply.BindingGVR.Group, ch.Protocol, ch.Flow)
	if ch.Protocol == flow.ProtocolV1alpha1 && o.protocol == "auto" && o.flow != flow.FlowCallback {
		if unfit := fit.Allows(flow.ProtocolV1alpha2); unfit != nil {
			line += fmt.Sprintf(", not %s: %v", v1alpha2.GroupVersion, unfit)
		}
	}
	if note := fit.Note(ch.Protocol); note != "" {
		line += "; " + note
	}
	fmt.Fprintln(o.streams.ErrOut, line+".")
}

func describeIdentity(id apply.Identity, override string) string {
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

func (o *options) runFiles(ctx context.Context, hc *http.Client) int {
	stderr := o.streams.ErrOut
	// Refuse unwritable or existing outputs before the user spends time in
	// the browser.
	if o.outputDir != "" {
		if fi, err := os.Stat(o.outputDir); err != nil || !fi.IsDir() {
			return o.usage(fmt.Errorf("--output-dir %s is not a directory", o.outputDir))
		}
		if !o.force {
			for _, name := range []string{responseFile, kubeconfigFile} {
				p := filepath.Join(o.outputDir, name)
				if _, err := os.Lstat(p); err == nil {
					return o.usage(fmt.Errorf("%s exists; remove it, choose another --output-dir, or pass --force", p))
				}
			}
		}
	}
	fo := o.flowOptions(hc)
	fo.ClusterID = o.clusterID
	res, err := flow.Obtain(ctx, o.exportURL, fo)
	if err != nil {
		return o.failed(err)
	}
	if o.printResponse {
		// As received: the printer indents the JSON or turns it into YAML.
		if err := o.printer.printJSON(o.streams.Out, res.Raw); err != nil {
			return o.failed(err)
		}
	} else {
		var pretty bytes.Buffer
		if err := json.Indent(&pretty, res.Raw, "", "  "); err != nil {
			return o.failed(err)
		}
		pretty.WriteByte('\n')
		if err := writeFile(o.outputDir, responseFile, pretty.Bytes(), o.force); err != nil {
			return o.failed(err)
		}
		if err := writeFile(o.outputDir, kubeconfigFile, res.Response.Kubeconfig, o.force); err != nil {
			return o.failed(err)
		}
	}
	fmt.Fprintf(stderr, "Bound %d request(s): namespace %s on %s.\n", len(res.Response.Requests), res.Namespace, res.Server)
	if o.outputDir != "" {
		fmt.Fprintf(stderr, "Wrote %s and %s in %s.\n", responseFile, kubeconfigFile, o.outputDir)
	}
	// Without a cluster there is nowhere to keep the cluster ID.
	fmt.Fprintf(stderr, "Cluster ID %s: pass --cluster-id %s with --output-dir or --print-response next time to bind into the same "+
		"provider namespace (binds into a cluster keep it there themselves).\n", res.ClusterID, res.ClusterID)
	return exitOK
}

func hintFor(err error) string {
	var rf *apply.RequestFailedError
	switch {
	case errors.Is(err, pollclient.ErrAccessDenied):
		return "The binding was cancelled in the browser or refused by the provider."
	case errors.Is(err, pollclient.ErrExpired):
		return "Nobody pressed Bind on the page before the link expired (or the provider lost the session). Run the command again for a new link."
	case errors.Is(err, pollclient.ErrInvalidSignature):
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
			return nil, fmt.Errorf("--provider-certificate-authority: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--provider-certificate-authority: no PEM certificates in %s", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr, Timeout: time.Minute}, nil
}
