// Package controllers builds the provider-side controllers (exportrequests,
// heartbeats, cleanup, credentials, the templates' status of
// internal/binding/offers and the periodic admission policy check) and
// runs them on one replica at a time, under leader election, on one
// manager with one cache and one request budget (kbmanager).
package controllers

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/cleanup"
	"github.com/kbprovider/backend/internal/binding/controllers/credentials"
	"github.com/kbprovider/backend/internal/binding/controllers/exportrequests"
	"github.com/kbprovider/backend/internal/binding/controllers/heartbeats"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/binding/scopecheck"
)

// Options are the controllers' flags.
type Options struct {
	Credentials credentials.Policy
	GC          cleanup.Options
	Health      heartbeats.Options
	Leader      kbmanager.LeaderOptions
}

// AddFlags registers the flags, with the defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Credentials.AddFlags(fs)
	o.GC.AddFlags(fs)
	o.Health.AddFlags(fs)
	o.Leader.AddFlags(fs)
}

// Complete checks the flags; the garbage collection must wait longer than
// a session lives (sessionTTL).
func (o *Options) Complete(sessionTTL time.Duration) error {
	errs := o.Credentials.Validate()
	errs = append(errs, o.GC.Validate(sessionTTL)...)
	errs = append(errs, o.Health.Validate()...)
	errs = append(errs, o.Leader.Complete()...)
	return errors.Join(errs...)
}

// Config is what the controllers work with.
type Config struct {
	// Options, completed.
	Options         Options
	NamespacePrefix string
	Catalog         *binding.Catalog
	Provisioner     *binding.Provisioner
	// Offers, if set, also gets its templates' status kept.
	Offers *offers.Source
	// Allowed judges a binding's recorded identity by the logins'
	// allow-list; nil: everybody may bind.
	Allowed func(binding.BoundBy) bool
	// Scope, with a Policy, is checked periodically (scopeCheck).
	Scope   scopecheck.Options
	Metrics prometheus.Registerer
	Logger  *slog.Logger
}

// restartAfter is the pause before a failed controller starts again.
const restartAfter = 5 * time.Second

// Controllers are the built controllers; Run runs them.
type Controllers struct {
	rc     *rest.Config
	leader kbmanager.LeaderOptions
	log    *slog.Logger
	setups []kbmanager.Setup
}

// controller is one provider-side controller that keeps a cache of its
// own, run under the leadership as a runnable of the manager.
type controller struct {
	name string
	run  func(context.Context) error
	log  *slog.Logger
}

// New builds the controllers; it does not contact the cluster. Every
// controller's client shares one request budget (kbmanager.Budgeted).
func New(rc *rest.Config, cfg Config) (*Controllers, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	rc = kbmanager.Budgeted(rc)
	// The controllers' writes through the provisioner (grants, rotations,
	// unbinds) spend the controllers' budget, not the one of users' binds.
	prov, err := cfg.Provisioner.WithClientsOf(rc)
	if err != nil {
		return nil, err
	}
	logFor := func(component string) *slog.Logger { return cfg.Logger.With("component", component) }
	exportsLog := logFor("exports")
	exportsCfg := exportrequests.Config{
		Catalog:         cfg.Catalog,
		GrantBackend:    prov.GrantBackend,
		NamespacePrefix: cfg.NamespacePrefix,
		Logger:          exportsLog,
	}
	if cfg.Offers != nil {
		// A nil *offers.Source in the interface would not be nil.
		exportsCfg.Offers = cfg.Offers
		exportsCfg.ClaimableResources = cfg.Offers.ClaimableResources()
	}
	exports, err := exportrequests.New(exportsCfg)
	if err != nil {
		return nil, err
	}
	health, err := heartbeats.New(heartbeats.Config{Metrics: cfg.Metrics, NoLeases: !cfg.Options.Health.Leases, LeaseTolerance: cfg.Options.Health.LeaseTolerance, Logger: logFor("bindinghealth")})
	if err != nil {
		return nil, err
	}
	if cfg.Metrics != nil {
		if err := kbmanager.RegisterMetrics(cfg.Metrics); err != nil {
			return nil, err
		}
	}
	cleanupLog := logFor("cleanup")
	gc := cfg.Options.GC
	clean, err := cleanup.New(cleanup.Config{
		Unbinder: prov, GCAfter: gc.UnusedBindingAfter, DryRun: gc.DryRun, Metrics: cfg.Metrics, Logger: cleanupLog,
	})
	if err != nil {
		return nil, err
	}
	credLog := logFor("credentials")
	creds, err := credentials.New(credentials.Config{
		Policy:          cfg.Options.Credentials,
		Issuer:          prov,
		NamespacePrefix: cfg.NamespacePrefix,
		Allowed:         cfg.Allowed,
		Logger:          credLog,
	})
	if err != nil {
		return nil, err
	}
	var own []controller
	if cfg.Scope.Policy != "" {
		scope, err := newScopeCheck(rc, cfg.Scope, cfg.Metrics, logFor("scopecheck"))
		if err != nil {
			return nil, err
		}
		own = append(own, controller{"admission policy check", scope.Run, scope.log})
	}
	if cfg.Offers != nil {
		own = append(own, controller{"template status", cfg.Offers.RunStatus, logFor("offers")})
	}
	c := &Controllers{rc: rc, leader: cfg.Options.Leader, log: logFor("controllers"), setups: []kbmanager.Setup{exports.Setup, health.Setup, creds.Setup, clean.Setup}}
	for _, ctrl := range own {
		c.setups = append(c.setups, func(m *kbmanager.Manager) error {
			return m.AddRunnable(func(ctx context.Context) error { ctrl.runUntilDone(ctx); return nil })
		})
	}
	return c, nil
}

// Run runs the controllers until ctx ends: on the replica holding the
// Lease when leader election is on, else right here. A failing controller
// is started again; all of them stop when leadership ends, and Run
// returns only after the Lease was released.
func (c *Controllers) Run(ctx context.Context) {
	if !c.leader.Enabled {
		c.log.Warn("leader election off (no --leader-election-namespace, POD_NAMESPACE or pod namespace file, or --leader-election=false): " +
			"this process runs the provider-side controllers; run a single replica")
	}
	kbmanager.Run(ctx, c.rc, kbmanager.Options{Leader: c.leader, Logger: c.log}, c.setups...)
}

// runUntilDone runs the controller until ctx ends, starting it again
// restartAfter a failure.
func (c controller) runUntilDone(ctx context.Context) {
	for ctx.Err() == nil {
		if err := c.run(ctx); err != nil && ctx.Err() == nil {
			c.log.Error(c.name+" controllers stopped; starting again in 5s", "error", err)
			select {
			case <-ctx.Done():
			case <-time.After(restartAfter):
			}
		}
	}
}
