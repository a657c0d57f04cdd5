package health

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Monitor looks at the dependencies every replica shares (the identity
// provider, the provider cluster) on its own timer, never on a request:
// however often the diagnostics are read or probes come in, each
// dependency is asked at most once per interval. Their state is for the
// operator (a gauge per dependency, a WARN log when one fails, the
// diagnostics page), never for readiness: when a shared dependency is
// down it is down for every replica, and taking them all out of their
// Service would stop what still works (polls of finished binds,
// discovery).
type Monitor struct {
	checks []Check
	opts   MonitorOptions
	up     *prometheus.GaugeVec

	mu      sync.RWMutex
	results []Observed
}

// MonitorOptions tune a Monitor; zero values take the defaults.
type MonitorOptions struct {
	// Interval between looks while every dependency answers (default
	// 10s); Retry while one does not (default 2s), so a recovery shows
	// soon.
	Interval, Retry time.Duration
	// Timeout bounds each check (default 3s).
	Timeout time.Duration
	Logger  *slog.Logger
}

// Observed is a dependency's state as last looked at.
type Observed struct {
	Name string
	// Err is nil while the dependency answers; ErrNotChecked before the
	// first look.
	Err error
	// At is when it was last looked at (zero before the first look);
	// Since, when its state last changed.
	At, Since time.Time
}

// ErrNotChecked is the state of a dependency not looked at yet.
var ErrNotChecked = errNotChecked{}

type errNotChecked struct{}

func (errNotChecked) Error() string { return "not checked yet" }

// NewMonitor returns a Monitor of checks and registers its gauge
// kube_bind_backend_dependency_up{dependency} in reg (nil: none). Run
// runs it.
func NewMonitor(reg prometheus.Registerer, checks []Check, opts MonitorOptions) (*Monitor, error) {
	if opts.Interval <= 0 {
		opts.Interval = 10 * time.Second
	}
	if opts.Retry <= 0 {
		opts.Retry = 2 * time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 3 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Monitor{checks: checks, opts: opts,
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kube_bind_backend", Name: "dependency_up",
			Help: "1 while a dependency shared by every replica (identity provider, provider cluster) answered its last check, else 0. Not part of readiness.",
		}, []string{"dependency"})}
	for _, c := range checks {
		m.results = append(m.results, Observed{Name: c.Name(), Err: ErrNotChecked})
		m.up.WithLabelValues(c.Name()).Set(0)
	}
	if reg != nil {
		if err := reg.Register(m.up); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Run checks every dependency at once, then again after each interval,
// until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	for {
		wait := m.opts.Interval
		if !m.checkAll(ctx) {
			wait = m.opts.Retry
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// checkAll looks at every dependency once and reports whether all answered.
func (m *Monitor) checkAll(ctx context.Context) bool {
	results := Run(ctx, m.checks, m.opts.Timeout)
	if ctx.Err() != nil {
		return true // stopping: what a cancelled look says is not news
	}
	now := time.Now()
	all := true
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, r := range results {
		prev := m.results[i]
		cur := Observed{Name: r.Name, Err: r.Err, At: now, Since: prev.Since}
		changed := errors.Is(prev.Err, ErrNotChecked) || (prev.Err == nil) != (r.Err == nil)
		if changed {
			cur.Since = now
		}
		m.results[i] = cur
		if r.Err != nil {
			all = false
			m.up.WithLabelValues(r.Name).Set(0)
			if changed {
				m.opts.Logger.Warn("dependency not answering; this replica stays ready and serves what does not need it",
					"dependency", r.Name, "error", r.Err)
			}
			continue
		}
		m.up.WithLabelValues(r.Name).Set(1)
		if changed && !errors.Is(prev.Err, ErrNotChecked) {
			m.opts.Logger.Info("dependency answering again", "dependency", r.Name, "down_for", now.Sub(prev.Since).Round(time.Second).String())
		}
	}
	return all
}

// Observed returns every dependency's last known state, in the order of
// the checks.
func (m *Monitor) Observed() []Observed {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return append([]Observed(nil), m.results...)
}
