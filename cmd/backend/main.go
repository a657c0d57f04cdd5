// Command kube-bind-backend is a kube-bind provider backend: it serves
// discovery, binding sessions and polls (docs/protocol.md), the browser
// login, and provisions consumers on the provider cluster.
//
// Configuration is by flags or KUBE_BIND_* environment variables; see
// docs/configuration.md. This command only registers the flags of
// internal/server (each component registers and checks its own), adds the
// environment and its logging flags, and runs internal/server.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/kbprovider/backend/internal/server"
	"github.com/kbprovider/backend/internal/version"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

// testClockOffsetEnv, for tests only, offsets the clock of sessions and
// of the skew measurement (server.Config.Now) by a Go duration ("5s",
// "-5s"): test/replicas runs replicas whose clocks disagree with it. Read
// here only; never set it in a deployment.
const testClockOffsetEnv = "KUBE_BIND_BACKEND_TEST_CLOCK_OFFSET"

// run is the whole program; it returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "kube-bind-backend: invalid configuration:\n%v\nRun kube-bind-backend --help for the flags.\n", err)
		return exitUsage
	}
	if cfg.ShowVersion {
		fmt.Fprintln(stdout, version.Version)
		return exitOK
	}
	logger := newLogger(cfg, stderr)
	slog.SetDefault(logger)
	if soft := setMemoryLimit(cfg.MemoryLimit, getenv("GOMEMLIMIT")); soft > 0 {
		logger.Info("Go memory limit set from --memory-limit", "limit_bytes", cfg.MemoryLimit, "gomemlimit_bytes", soft)
	}
	// client-go logs through klog: route it through the same handler, so
	// that --log-format json gives one JSON object per line for all of it.
	klog.SetSlogLogger(logger.With("component", "client-go"))

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// A second signal, once shutdown began, kills the process the default way.
	context.AfterFunc(ctx, stop)

	warnDefaults(cfg, logger)
	cfg.Logger = logger
	if v := getenv(testClockOffsetEnv); v != "" {
		off, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintf(stderr, "kube-bind-backend: %s: %v\n", testClockOffsetEnv, err)
			return exitUsage
		}
		logger.Warn("test only: this process's clock is offset", "env", testClockOffsetEnv, "offset", off.String())
		cfg.Now = func() time.Time { return time.Now().Add(off) }
	}
	srv, err := server.New(ctx, cfg.Config)
	if err != nil {
		logger.Error("cannot start", "error", err)
		return exitFailed
	}
	if err := srv.Run(ctx); err != nil {
		return exitFailed
	}
	return exitOK
}

// warnDefaults warns of settings that work but are for local use only.
func warnDefaults(cfg *config, logger *slog.Logger) {
	if limit, ok := openFileLimit(); ok && cfg.MaxConnections > 0 && uint64(cfg.MaxConnections)+256 > limit {
		logger.Warn("--max-connections is close to or above the open-file limit: at the limit, new connections fail instead of waiting; "+
			"lower --max-connections or raise the limit (ulimit -n)", "max_connections", cfg.MaxConnections, "open_file_limit", limit)
	}
	for _, k := range cfg.Browser.KeysGenerated {
		logger.Warn("--"+k+" not set: using a random key; browser logins break on restart, and replicas must share one key", "flag", k)
	}
	if cfg.ExternalURL != nil && plainHTTPOffLoopback(cfg.ExternalURL) {
		logger.Warn("--external-url is http on a host that is not this machine (loopback): tokens and cookies would travel "+
			"unencrypted between browsers or clients and the backend (session secrets, the login cookie, the kubeconfig of "+
			"each binding); use https (TLS at the ingress or --tls-cert-file)", "flag", "external-url", "external_url", cfg.ExternalURL.String())
	}
	if cfg.OIDC.IssuerURL != "" {
		if u, err := url.Parse(cfg.OIDC.IssuerURL); err == nil && plainHTTPOffLoopback(u) {
			logger.Warn("--oidc-issuer-url is http on a host that is not this machine (loopback): tokens and cookies would travel "+
				"unencrypted between the backend and the identity provider, and to the browsers logging in there (the client "+
				"secret, codes, ID tokens, the provider's session cookies); use https", "flag", "oidc-issuer-url", "issuer_url", cfg.OIDC.IssuerURL)
		}
	}
	if cfg.OIDC.CallbackURL != "" {
		if u, err := url.Parse(cfg.OIDC.CallbackURL); err == nil && plainHTTPOffLoopback(u) {
			logger.Warn("--oidc-callback-url is http on a host that is not this machine (loopback): the identity provider "+
				"sends browsers there with their login codes and the backend's cookies unencrypted; use https",
				"flag", "oidc-callback-url", "callback_url", cfg.OIDC.CallbackURL)
		}
	}
	for _, e := range cfg.Browser.CallbackAllowList {
		// Released CLIs listen on loopback http, which is allowed
		// without an entry; an http entry elsewhere is a remote host.
		if u, err := url.Parse(e); err == nil && plainHTTPOffLoopback(u) {
			logger.Warn("--callback-allowed-urls has an http URL on a host that is not this machine (loopback): the callback "+
				"flow would send browsers there with the binding's response (tokens and the kubeconfig) unencrypted; use https",
				"flag", "callback-allowed-urls", "callback_url", e)
		}
	}
	if cfg.ClusterKey.Generated {
		logger.Warn("--cluster-secret-key not set: using a random key; the cluster secrets issued now stop proving their cluster IDs on restart "+
			"(those clients then bind into new provider namespaces), and replicas must share one key; for local use only", "flag", "cluster-secret-key")
	}
}

// plainHTTPOffLoopback reports whether u is http on a host that is not
// loopback (localhost, 127.0.0.0/8, ::1): what travels to it crosses a
// network unencrypted. http on loopback is for the demo and the tests.
func plainHTTPOffLoopback(u *url.URL) bool {
	if !strings.EqualFold(u.Scheme, "http") {
		return false
	}
	host := strings.TrimSuffix(u.Hostname(), ".")
	if strings.EqualFold(host, "localhost") {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.Unmap().IsLoopback()
}

func newLogger(cfg *config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// memoryLimitShare is the part of the container's memory limit the Go
// runtime aims to stay under: the rest is for memory it does not manage
// (stacks of threads, cgo) and for the time a collection takes.
const memoryLimitShare = 0.85

// setMemoryLimit sets the runtime's soft memory limit from the container's
// limit, unless GOMEMLIMIT (which the runtime read at start) says
// otherwise; it returns the limit set, or 0.
func setMemoryLimit(limit int64, gomemlimit string) int64 {
	if limit <= 0 || gomemlimit != "" {
		return 0
	}
	soft := int64(float64(limit) * memoryLimitShare)
	debug.SetMemoryLimit(soft)
	return soft
}
