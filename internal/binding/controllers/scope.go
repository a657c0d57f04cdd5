package controllers

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/binding/scopecheck"
)

// scopeRecheck is how often the leader probes again: a policy deleted
// while the backend runs is reported within this time.
const scopeRecheck = 5 * time.Minute

// scopeCheck probes every scopeRecheck while this replica leads, and
// reports through the log (ERROR) and the gauge
// kube_bind_backend_admission_policy_confined (1 confined, 0 not, absent
// before the first answer).
type scopeCheck struct {
	kube  kubernetes.Interface
	opts  scopecheck.Options
	gauge prometheus.Gauge
	log   *slog.Logger
	every time.Duration
}

func newScopeCheck(rc *rest.Config, opts scopecheck.Options, reg prometheus.Registerer, log *slog.Logger) (*scopeCheck, error) {
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "kube_bind_backend", Name: "admission_policy_confined",
		Help: "1 when the last dry-run probe of the leader was refused by the admission policy confining the backend to its namespaces, 0 when it was admitted.",
	})
	if reg != nil {
		if err := reg.Register(g); err != nil {
			return nil, err
		}
	}
	return &scopeCheck{kube: kube, opts: opts, gauge: g, log: log, every: scopeRecheck}, nil
}

func (c *scopeCheck) Run(ctx context.Context) error {
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
