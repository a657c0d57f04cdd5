// Command kube-bind-backend is a kube-bind provider backend: it serves
// discovery, binding sessions and polls (docs/protocol.md), the browser
// login, and provisions consumers on the provider cluster.
//
// Configuration is by flags or KUBE_BIND_* environment variables; see
// docs/configuration.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/klog/v2"

	"github.com/kbprovider/backend/internal/connlimit"
	"github.com/kbprovider/backend/internal/health"
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

// run is the whole program; it returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
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
	// client-go logs through klog: route it through the same handler, so
	// that --log-format json gives one JSON object per line for all of it.
	klog.SetSlogLogger(logger.With("component", "client-go"))

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	ln, err := net.Listen("tcp", cfg.ListenAddress)
	if err != nil {
		logger.Error("cannot listen", "address", cfg.ListenAddress, "error", err)
		return exitFailed
	}
	// One client must not hold every connection (or file descriptor).
	ln = connlimit.New(ln, cfg.MaxConnections, cfg.MaxConnsPerClient)
	if limit, ok := openFileLimit(); ok && cfg.MaxConnections > 0 && uint64(cfg.MaxConnections)+256 > limit {
		logger.Warn("--max-connections is close to or above the open-file limit: at the limit, new connections fail instead of waiting; "+
			"lower --max-connections or raise the limit (ulimit -n)", "max_connections", cfg.MaxConnections, "open_file_limit", limit)
	}
	ext, derived := cfg.externalURLFor(ln.Addr())
	if derived {
		logger.Warn("--external-url not set: advertising "+ext.String()+", which only works for clients on this machine; "+
			"set --external-url to the public URL clients use", "external_url", ext.String())
	}
	for _, k := range cfg.CookieKeysGenerated {
		logger.Warn("--"+k+" not set: using a random key; browser logins break on restart, and replicas must share one key", "flag", k)
	}
	if cfg.ClusterSecretKeyGenerated {
		logger.Warn("--cluster-secret-key not set: using a random key; the cluster secrets issued now stop proving their cluster IDs on restart "+
			"(those clients then bind into new provider namespaces), and replicas must share one key; for local use only", "flag", "cluster-secret-key")
	}

	store, err := newSessionStore(cfg, logger)
	if err != nil {
		logger.Error("cannot set up the session store", "store", cfg.Store.Kind, "error", err)
		return exitFailed
	}
	defer store.Close()
	// Background parts that serve requests (certificate reload) live as
	// long as the servers, through the graceful shutdown.
	srvCtx, cancelSrv := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelSrv()
	tlsConfig, err := servingTLS(srvCtx, cfg, logger)
	if err != nil {
		logger.Error("cannot load the TLS serving certificate", "error", err)
		return exitFailed
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Readiness fails as soon as shutdown begins, so load balancers stop
	// sending new requests while in-flight ones finish.
	shuttingDown := health.NewStatus("shutdown", nil)
	handler, err := newHandler(ctx, cfg, wiring{
		logger:    logger,
		ext:       ext,
		store:     store,
		metrics:   reg,
		readiness: append([]health.Check{shuttingDown}, store.checks...),
	})
	if err != nil {
		logger.Error("cannot build the HTTP handler", "error", err)
		return exitFailed
	}

	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		TLSConfig:         tlsConfig,
	}
	errc := make(chan error, 2)
	go func() {
		if tlsConfig != nil {
			errc <- srv.ServeTLS(ln, "", "")
		} else {
			errc <- srv.Serve(ln)
		}
	}()
	store.start(ctx, errc)
	logger.Info("serving", "version", version.Version, "address", ln.Addr().String(),
		"external_url", ext.String(), "tls", cfg.TLSCertFile != "")

	select {
	case err := <-errc:
		logger.Error("server failed", "error", err)
		return exitFailed
	case <-ctx.Done():
	}
	stop() // a second signal now kills the process the default way
	shuttingDown.Set(errors.New("shutting down"))
	logger.Info("shutting down: finishing in-flight requests", "timeout", cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		logger.Error("in-flight requests did not finish in time", "error", err)
		srv.Close()
		return exitFailed
	}
	if err := store.shutdown(sctx); err != nil {
		logger.Error("in-flight peer requests did not finish in time", "error", err)
		return exitFailed
	}
	logger.Info("stopped")
	return exitOK
}

func newLogger(cfg *config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
