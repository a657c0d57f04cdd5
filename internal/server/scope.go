package server

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/scopecheck"
)

const (
	// scopeStartWait bounds how long the start waits for the API server to
	// answer the probes; after it the backend starts and the leader's
	// periodic check gives the answer.
	scopeStartWait = 30 * time.Second
	// scopeRecheck is how often the leader probes again: a policy deleted
	// while the backend runs is reported within this time.
	scopeRecheck = 5 * time.Minute
	// policyLoadGrace is how long an admitted probe at start is asked
	// again: the API server enforces a policy only once its admission
	// plugin has loaded it, a moment after it was created, and helm
	// creates the chart's policy and starts the pods together.
	policyLoadGrace = 15 * time.Second
)

func (s *Server) scopeOptions() scopecheck.Options {
	return scopecheck.Options{Policy: s.cfg.AdmissionPolicy, NamespacePrefix: s.cfg.NamespacePrefix, Role: binding.BackendNamespaceClusterRole}
}

// checkScopeAtStart refuses to start when the admission policy does not
// confine the backend (AdmissionPolicy set). An API server that does not
// answer is no reason to refuse: the backend starts and the leader checks
// again (scopeController).
func (s *Server) checkScopeAtStart(ctx context.Context, rc *rest.Config) error {
	if s.cfg.AdmissionPolicy == "" {
		s.log.Warn("--unsafe-skip-admission-policy-check: not checking that an admission policy confines the backend to the namespaces it made; " +
			"without one, whoever takes over the backend can grant itself Secrets and tokens in any namespace")
		return nil
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, scopeStartWait)
	defer cancel()
	unconfinedUntil := time.Now().Add(policyLoadGrace)
	for {
		err := scopecheck.Check(ctx, kube, s.scopeOptions())
		if err == nil {
			return nil
		}
		if errors.Is(err, scopecheck.ErrUnconfined) {
			if time.Now().After(unconfinedUntil) {
				return err
			}
			s.log.Info("a probe of the admission policy was admitted; asking again while the API server may still be loading it", "policy", s.cfg.AdmissionPolicy)
		}
		select {
		case <-ctx.Done():
			s.log.Warn("cannot check the admission policy at start; the leader checks again", "policy", s.cfg.AdmissionPolicy, "error", err)
			return nil
		case <-time.After(time.Second):
		}
	}
}

// scopeController probes every scopeRecheck while this replica leads, and
// reports through the log (ERROR) and the gauge
// kube_bind_backend_admission_policy_confined (1 confined, 0 not, absent
// before the first answer).
type scopeController struct {
	kube  kubernetes.Interface
	opts  scopecheck.Options
	gauge prometheus.Gauge
	log   *slog.Logger
	every time.Duration
}

func (s *Server) newScopeController(rc *rest.Config, reg *prometheus.Registry) (*scopeController, error) {
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "kube_bind_backend", Name: "admission_policy_confined",
		Help: "1 when the last dry-run probe of the leader was refused by the admission policy confining the backend to its namespaces, 0 when it was admitted.",
	})
	reg.MustRegister(g)
	return &scopeController{kube: kube, opts: s.scopeOptions(), gauge: g, log: s.log.With("component", "scopecheck"), every: scopeRecheck}, nil
}

func (c *scopeController) Run(ctx context.Context) error {
	t := time.NewTicker(c.every)
	defer t.Stop()
	for {
		err := scopecheck.Check(ctx, c.kube, c.opts)
		switch {
		case err == nil:
			c.gauge.Set(1)
		case errors.Is(err, scopecheck.ErrUnconfined):
			c.gauge.Set(0)
			c.log.Error("the backend runs unconfined", "policy", c.opts.Policy, "error", err)
		case ctx.Err() == nil:
			c.log.Warn("cannot check the admission policy", "policy", c.opts.Policy, "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
