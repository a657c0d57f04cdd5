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
	"path/filepath"
	"strings"
	"time"

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
	outputDir string
	output    string
	force     bool
	clusterID string
	timeout   time.Duration
	caFile    string
	verbose   bool
}

func parseArgs(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("kube-bind-poll", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.outputDir, "output-dir", ".", "directory for "+responseFile+" and "+kubeconfigFile+" (written with mode 0600)")
	fs.StringVar(&o.output, "o", "", `"-" writes the BindingResponse JSON to stdout instead of files`)
	fs.BoolVar(&o.force, "force", false, "overwrite existing output files")
	fs.StringVar(&o.clusterID, "cluster-id", "", "cluster ID of an earlier binding, to land in the same provider namespace")
	fs.DurationVar(&o.timeout, "timeout", 0, "give up after this long (0: when the session expires)")
	fs.StringVar(&o.caFile, "certificate-authority", "", "PEM file of CA certificates to trust besides the system's")
	fs.BoolVar(&o.verbose, "v", false, "report every poll on stderr")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: kube-bind-poll [flags] <export-url>\n\n"+
			"Binds APIs of a kube-bind provider: prints a URL to open in any browser,\n"+
			"waits while you log in and pick the APIs, then writes the BindingResponse\n"+
			"and its kubeconfig.\n\nFlags:\n")
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
	case o.output != "" && o.output != "-":
		return nil, fmt.Errorf(`-o takes only "-" (stdout); use --output-dir for files`)
	case o.timeout < 0:
		return nil, errors.New("--timeout must not be negative")
	}
	o.exportURL = positional[0]
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "kube-bind-poll: %v\n", err)
		return exitUsage
	}
	// Refuse unwritable or existing outputs before the user spends time in
	// the browser.
	if o.output == "" && !o.force {
		for _, name := range []string{responseFile, kubeconfigFile} {
			p := filepath.Join(o.outputDir, name)
			if _, err := os.Lstat(p); err == nil {
				fmt.Fprintf(stderr, "kube-bind-poll: %s exists; remove it, choose another --output-dir, or pass --force\n", p)
				return exitUsage
			}
		}
	}
	if o.output == "" {
		if fi, err := os.Stat(o.outputDir); err != nil || !fi.IsDir() {
			fmt.Fprintf(stderr, "kube-bind-poll: --output-dir %s is not a directory\n", o.outputDir)
			return exitUsage
		}
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
	if err := bind(ctx, o, hc, stdout, stderr); err != nil {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			fmt.Fprintf(stderr, "kube-bind-poll: gave up after --timeout %s\n", o.timeout)
		case errors.Is(err, context.Canceled):
			fmt.Fprintln(stderr, "kube-bind-poll: interrupted")
		default:
			fmt.Fprintf(stderr, "kube-bind-poll: %v\n", err)
			if hint := hintFor(err); hint != "" {
				fmt.Fprintln(stderr, hint)
			}
		}
		return exitFailed
	}
	return exitOK
}

func bind(ctx context.Context, o *options, hc *http.Client, stdout, stderr io.Writer) error {
	c := pollclient.New(hc)
	c.UserAgent = "kube-bind-poll"
	p, err := c.Discover(ctx, o.exportURL)
	if err != nil {
		return err
	}
	s, err := c.CreateSession(ctx, p, o.clusterID)
	if err != nil {
		return err
	}
	authURL, err := s.AuthenticationURL()
	if err != nil {
		return err
	}
	name := p.PrettyName
	if name == "" {
		name = "the provider"
	}
	fmt.Fprintf(stderr, "To bind APIs of %s, open this URL in a browser (on any machine),\nlog in and pick the APIs:\n\n    %s\n\n", name, authURL)
	fmt.Fprintf(stderr, "Waiting until you are done (the link expires at %s; Ctrl-C to stop)...\n", s.ExpiresAt.Local().Format("15:04:05 MST"))

	var opts []pollclient.WaitOption
	if o.verbose {
		opts = append(opts, pollclient.WithProgress(func(pr pollclient.Progress) {
			if pr.Err != nil {
				fmt.Fprintf(stderr, "poll %d: %s (%v); next in %s\n", pr.Attempt, pr.State, pr.Err, pr.Wait.Round(time.Millisecond))
				return
			}
			fmt.Fprintf(stderr, "poll %d: %s; next in %s\n", pr.Attempt, pr.State, pr.Wait.Round(time.Millisecond))
		}))
	}
	res, err := s.Wait(ctx, opts...)
	if err != nil {
		return err
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, res.Raw, "", "  "); err != nil {
		return err
	}
	pretty.WriteByte('\n')
	if o.output == "-" {
		if _, err := stdout.Write(pretty.Bytes()); err != nil {
			return err
		}
	} else {
		if err := writeFile(o.outputDir, responseFile, pretty.Bytes(), o.force); err != nil {
			return err
		}
		if err := writeFile(o.outputDir, kubeconfigFile, res.Response.Kubeconfig, o.force); err != nil {
			return err
		}
	}
	fmt.Fprintf(stderr, "Bound %d request(s): namespace %s on %s.\n", len(res.Response.Requests), res.Namespace, res.Server)
	if o.output == "" {
		fmt.Fprintf(stderr, "Wrote %s and %s in %s.\n", responseFile, kubeconfigFile, o.outputDir)
	}
	fmt.Fprintf(stderr, "Cluster ID %s: pass --cluster-id %s next time to bind into the same provider namespace.\n", s.ClusterID, s.ClusterID)
	return nil
}

func hintFor(err error) string {
	switch {
	case errors.Is(err, pollclient.ErrAccessDenied):
		return "The binding was cancelled in the browser or refused by the provider."
	case errors.Is(err, pollclient.ErrExpired), errors.Is(err, pollclient.ErrInvalidSignature):
		return "Run the command again to start a new session."
	case errors.Is(err, pollclient.ErrNoPollMethod):
		return "Use kubectl bind (the callback flow) with this provider."
	}
	return ""
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
