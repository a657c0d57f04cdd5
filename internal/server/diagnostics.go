package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/server/diagnostics"
	"github.com/kbprovider/backend/internal/server/health"
)

// dependencyInterval is how often the dependencies every replica shares
// are looked at while they answer; the login trusts its own last look at
// the identity provider as long, so each look of the monitor is a real one.
const dependencyInterval = 10 * time.Second

// newDiagnostics listens on the diagnostics address and builds its
// server: probes, metrics and the status page, for the kubelet,
// Prometheus and the operator, never behind the public Service. Plain
// HTTP: it carries no secret, and the kubelet and Prometheus reach it
// on the pod's own address.
func (s *Server) newDiagnostics(ctx context.Context, reg *prometheus.Registry, readiness, dependencies []health.Check) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.cfg.DiagnosticsAddress)
	if err != nil {
		return fmt.Errorf("cannot listen on the diagnostics address %s: %w", s.cfg.DiagnosticsAddress, err)
	}
	s.diagLn = ln
	log := s.log.With("component", "diagnostics")
	mon, err := health.NewMonitor(reg, dependencies, health.MonitorOptions{Interval: dependencyInterval, Logger: log})
	if err != nil {
		return err
	}
	s.loops = append(s.loops, loop{"dependency monitor", mon.Run})
	s.diagSrv = &http.Server{
		Handler:           diagnostics.New(diagnostics.Config{Readiness: readiness, Dependencies: mon, Metrics: reg, Logger: log, Profiling: s.cfg.Profiling}),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return nil
}

// clusterCheck looks at whether the provider cluster answers; for a
// backend that uses it without the catalog (the ring's records only).
func clusterCheck(client kubernetes.Interface) health.Check {
	return health.CheckFunc("provider-cluster", func(ctx context.Context) error {
		// /version is readable by every client, authenticated or not.
		if err := client.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Error(); err != nil {
			return fmt.Errorf("provider cluster unreachable: %w", err)
		}
		return nil
	})
}
