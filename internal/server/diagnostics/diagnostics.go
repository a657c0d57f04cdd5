// Package diagnostics is the operator's HTTP surface, for a listener of
// its own that the public Service and Ingress never reach: the kubelet's
// probes (/healthz, /readyz), Prometheus' scrape (/metrics) and a status
// page (/statusz) with each readiness check and each shared dependency.
// What it shows (internal errors, addresses) is for the operator only.
// Nothing here asks a dependency: readiness checks read this replica's
// state, and the dependencies' state is the Monitor's last look.
package diagnostics

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kbprovider/backend/internal/server/health"
)

// Config configures the handler New returns.
type Config struct {
	// Readiness are this replica's own conditions; /readyz is 200 when
	// all hold.
	Readiness []health.Check
	// Dependencies, if set, is shown on /statusz.
	Dependencies *health.Monitor
	// Metrics is what /metrics serves (default: nothing but an empty page).
	Metrics prometheus.Gatherer
	// Logger receives errors of the metrics handler (default: discard).
	Logger *slog.Logger
	// Now is the clock of the ages on /statusz (default time.Now).
	Now func() time.Time
	// Profiling serves Go's runtime profiles under /debug/pprof/ (heap,
	// goroutines, CPU): what sizing at scale needs. Off by default: a
	// CPU profile costs the replica while it runs.
	Profiling bool
}

// readinessTimeout bounds each readiness check; they read memory only.
const readinessTimeout = time.Second

// New returns the diagnostics handler.
func New(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { text(w, http.StatusOK, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		ready := writeReadiness(&b, health.Run(r.Context(), cfg.Readiness, readinessTimeout))
		text(w, status(ready), b.String())
	})
	mux.HandleFunc("GET /statusz", func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		b.WriteString("readiness (this replica):\n")
		ready := writeReadiness(&b, health.Run(r.Context(), cfg.Readiness, readinessTimeout))
		if cfg.Dependencies != nil {
			b.WriteString("\ndependencies (shared by every replica; not part of readiness):\n")
			now := cfg.Now()
			for _, o := range cfg.Dependencies.Observed() {
				writeDependency(&b, o, now)
			}
		}
		// The page is the operator's to read whatever the state: 200,
		// with readiness's own code in a header for scripts.
		w.Header().Set("X-Ready", fmt.Sprint(ready))
		text(w, http.StatusOK, b.String())
	})
	if cfg.Profiling {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Metrics, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelError)}))
	return mux
}

// writeReadiness lists each check as "[+]name ok" or "[-]name failed:
// why", then "ready" or "not ready", and reports whether all held.
func writeReadiness(b *strings.Builder, results []health.Result) bool {
	ready := true
	for _, res := range results {
		if res.Err != nil {
			ready = false
			b.WriteString("[-]" + res.Name + " failed: " + oneLine(res.Err.Error()) + "\n")
		} else {
			b.WriteString("[+]" + res.Name + " ok\n")
		}
	}
	if ready {
		b.WriteString("ready\n")
	} else {
		b.WriteString("not ready\n")
	}
	return ready
}

func writeDependency(b *strings.Builder, o health.Observed, now time.Time) {
	switch {
	case o.At.IsZero():
		b.WriteString("[?]" + o.Name + " not checked yet\n")
	case o.Err != nil:
		fmt.Fprintf(b, "[-]%s failed: %s (since %s, checked %s ago)\n", o.Name, oneLine(o.Err.Error()),
			o.Since.UTC().Format(time.RFC3339), age(now, o.At))
	default:
		fmt.Fprintf(b, "[+]%s ok (since %s, checked %s ago)\n", o.Name, o.Since.UTC().Format(time.RFC3339), age(now, o.At))
	}
}

func age(now, t time.Time) string { return now.Sub(t).Round(time.Second).String() }

func status(ready bool) int {
	if ready {
		return http.StatusOK
	}
	return http.StatusServiceUnavailable
}

func text(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write([]byte(body))
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
