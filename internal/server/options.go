package server

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kbprovider/backend/internal/flagvalue"
)

// Options are the backend's flags: the server's own, and each component's
// (registered and checked by the component). Complete turns them into
// Config.
type Options struct {
	Config

	// PodIP, PodNamespace and PodName come from the environment (the
	// chart sets POD_IP, POD_NAMESPACE and POD_NAME): the ring's
	// default self URL and namespace, the Lease's default namespace and
	// this replica's name in it.
	PodIP, PodNamespace, PodName string

	externalURL string
	store       storeFlags
}

// maxPolledSessionsBound bounds --max-polled-sessions: beyond it the
// nonce bound of the admission table decides anyway.
const maxPolledSessionsBound = 10_000_000

// AddFlags registers every flag of the backend, with the defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	s, d, i := fs.StringVar, fs.DurationVar, fs.IntVar
	c := &o.Config
	s(&c.ListenAddress, "listen-address", ":8080", "address to serve HTTP(S) on (host:port)")
	s(&c.DiagnosticsAddress, "diagnostics-address", "127.0.0.1:9090", "address (host:port) to serve /healthz, /readyz, /metrics and the status page /statusz on, for probes, Prometheus and the operator; loopback by default, the chart sets :<port> so that the kubelet and Prometheus reach it; never route it from the Internet (the public listener serves only a terse /healthz and /readyz)")
	fs.BoolVar(&c.Profiling, "profiling", false, "serve Go's runtime profiles (heap, goroutines, CPU) under /debug/pprof/ on the diagnostics address, for sizing and for finding where memory or CPU goes")
	s(&o.externalURL, "external-url", "", "public URL of the backend (scheme, host, optional path prefix); every advertised URL and every signature check uses it (default: http://<listen-address>, for local use only)")
	s(&c.PrettyName, "pretty-name", "kube-bind provider", "provider name shown to consumers")

	d(&c.SessionTTL, "session-ttl", 10*time.Minute, "how long a binding session lives after creation")
	d(&c.PollInterval, "poll-interval", 2*time.Second, "poll interval advertised to clients and enforced (with a small jitter tolerance)")
	d(&c.GracePeriod, "grace-period", 60*time.Second, "how long a delivered BindingResponse stays available to further polls")
	i(&c.MaxPolledSessions, "max-polled-sessions", 100000, "most sessions whose poll pace and nonces a replica remembers (about 100 bytes each, plus at most 16 MiB of nonces); beyond it the sessions expiring first are evicted and their polls answered 410, never admitted again")
	i(&c.MaxConnections, "max-connections", 4096, "most connections served at once; beyond it a new one takes the place of an idle keep-alive connection or of one silent for 0.5s since it was accepted, else waits in the listen backlog (0: no limit). Keep it below the open-file limit (ulimit -n)")
	i(&c.MaxConnsPerClient, "max-connections-per-client", 64, "most connections from one client IP address at once; more are closed at once (0: no limit). Behind a proxy that does not keep client addresses, every connection is the proxy's")
	fs.Float64Var(&c.SessionCreateRate, "session-create-rate", 10, "requests that create something for an anonymous caller (POST /sessions, /api/sessions; GET /authorize, /callback, /api/authorize, /) allowed per second per client (an IPv4 address, an IPv6 /64), one bucket, with a burst of three seconds' worth; more are answered 429 (0: no limit). Behind a proxy that does not keep client addresses every client shares the proxy's: raise it or set 0")
	d(&c.ShutdownTimeout, "shutdown-timeout", 25*time.Second, "how long in-flight requests may take to finish on SIGTERM")
	s(&c.TLSCertFile, "tls-cert-file", "", "PEM certificate to serve HTTPS with (with --tls-key-file)")
	s(&c.TLSKeyFile, "tls-key-file", "", "PEM private key to serve HTTPS with (with --tls-cert-file)")
	o.store.addFlags(fs)

	c.OIDC.AddFlags(fs)
	c.Browser.AddFlags(fs)
	c.ClusterKey.AddFlags(fs)
	c.Provider.AddFlags(fs)
	c.LongPoll.AddFlags(fs)
	c.CLITokens.AddFlags(fs)
	c.Controllers.AddFlags(fs)
}

// Complete checks the server's flags and has each component complete
// its own; the errors of all of them are reported together, each naming
// its flag.
func (o *Options) Complete() error {
	c := &o.Config
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}

	_, public, listenErr := net.SplitHostPort(c.ListenAddress)
	if listenErr != nil {
		fail("--listen-address %q: want host:port, e.g. :8080 or 127.0.0.1:8080", c.ListenAddress)
	}
	if _, port, err := net.SplitHostPort(c.DiagnosticsAddress); err != nil {
		fail("--diagnostics-address %q: want host:port, e.g. :9090 or 127.0.0.1:9090", c.DiagnosticsAddress)
	} else if listenErr == nil && port == public && port != "0" {
		fail("--diagnostics-address %q: needs a port of its own, not the --listen-address port %s", c.DiagnosticsAddress, public)
	}
	c.ExternalURL = nil
	if o.externalURL != "" {
		u, err := flagvalue.HTTPURL(o.externalURL)
		switch {
		case err != nil:
			fail("--external-url %q: %v; e.g. https://bind.example.com", o.externalURL, err)
		case u.RawQuery != "" || u.Fragment != "":
			fail("--external-url %q: must not have a query or fragment", o.externalURL)
		default:
			c.ExternalURL = u
		}
	}
	if c.PrettyName = strings.TrimSpace(c.PrettyName); c.PrettyName == "" {
		fail("--pretty-name must not be empty")
	}

	if c.SessionTTL <= 0 {
		fail("--session-ttl %s: must be positive", c.SessionTTL)
	}
	if c.PollInterval <= 0 {
		fail("--poll-interval %s: must be positive", c.PollInterval)
	} else if c.SessionTTL > 0 && c.PollInterval >= c.SessionTTL {
		fail("--poll-interval %s: must be shorter than --session-ttl %s", c.PollInterval, c.SessionTTL)
	}
	if c.GracePeriod <= 0 {
		fail("--grace-period %s: must be positive", c.GracePeriod)
	}
	if c.MaxConnections < 0 {
		fail("--max-connections %d: must be 0 (no limit) or positive", c.MaxConnections)
	}
	if c.MaxConnsPerClient < 0 {
		fail("--max-connections-per-client %d: must be 0 (no limit) or positive", c.MaxConnsPerClient)
	}
	if !(c.SessionCreateRate >= 0) || math.IsInf(c.SessionCreateRate, 0) {
		fail("--session-create-rate %v: must be 0 (no limit) or positive", c.SessionCreateRate)
	}
	if c.MaxPolledSessions <= 0 || c.MaxPolledSessions > maxPolledSessionsBound {
		fail("--max-polled-sessions %d: must be positive and at most %d", c.MaxPolledSessions, maxPolledSessionsBound)
	}
	if c.ShutdownTimeout <= 0 {
		fail("--shutdown-timeout %s: must be positive", c.ShutdownTimeout)
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		fail("--tls-cert-file and --tls-key-file go together")
	}
	for _, f := range []string{c.TLSCertFile, c.TLSKeyFile} {
		if f != "" {
			if _, err := os.Stat(f); err != nil {
				fail("TLS: %v", err)
			}
		}
	}
	var storeErrs []error
	c.Store, storeErrs = o.store.complete(o.PodIP, o.PodNamespace)
	errs = append(errs, storeErrs...)

	add(c.OIDC.Complete())
	add(c.Browser.Complete())
	add(c.ClusterKey.Complete())
	add(c.Provider.Complete())
	errs = append(errs, c.LongPoll.Validate()...)
	add(c.CLITokens.Complete())
	c.Controllers.Leader.PodNamespace, c.Controllers.Leader.PodName = o.PodNamespace, o.PodName
	add(c.Controllers.Complete(c.SessionTTL))
	return errors.Join(errs...)
}
