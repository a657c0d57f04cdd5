// Package controllers builds the provider-side controllers (exportrequests,
// heartbeats, cleanup, credentials, the templates' status of
// internal/binding/offers and the periodic admission policy check) and
// runs them on one replica at a time, under leader election (leader).
package controllers

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/cleanup"
	"github.com/kbprovider/backend/internal/binding/controllers/credentials"
	"github.com/kbprovider/backend/internal/binding/controllers/exportrequests"
	"github.com/kbprovider/backend/internal/binding/controllers/heartbeats"
	"github.com/kbprovider/backend/internal/binding/controllers/leader"
	"github.com/kbprovider/backend/internal/binding/offers"
	"github.com/kbprovider/backend/internal/binding/scopecheck"
)

// Options are the controllers' flags.
type Options struct {
	Credentials credentials.Policy
	GC          cleanup.Options
	Leader      leader.Options
}

// AddFlags registers the flags, with the defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Credentials.AddFlags(fs)
	o.GC.AddFlags(fs)
	o.Leader.AddFlags(fs)
}

// Complete checks the flags; the garbage collection must wait longer than
// a session lives (sessionTTL).
func (o *Options) Complete(sessionTTL time.Duration) error {
	errs := o.Credentials.Validate()
	errs = append(errs, o.GC.Validate(sessionTTL)...)
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
	leader leader.Options
	log    *slog.Logger
	all    []controller
}

// controller is one provider-side controller run under the leadership.
type controller struct {
	name string
	run  func(context.Context) error
	log  *slog.Logger
}

// New builds the controllers; it does not contact the cluster.
func New(rc *rest.Config, cfg Config) (*Controllers, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	logFor := func(component string) *slog.Logger { return cfg.Logger.With("component", component) }
	exportsLog := logFor("exports")
	exportsCfg := exportrequests.Config{
		Catalog:         cfg.Catalog,
		GrantBackend:    cfg.Provisioner.GrantBackend,
		NamespacePrefix: cfg.NamespacePrefix,
		Logger:          exportsLog,
	}
	if cfg.Offers != nil {
		// A nil *offers.Source in the interface would not be nil.
		exportsCfg.Offers = cfg.Offers
		exportsCfg.ClaimableResources = cfg.Offers.ClaimableResources()
	}
	exports, err := exportrequests.New(rc, exportsCfg)
	if err != nil {
		return nil, err
	}
	healthLog := logFor("bindinghealth")
	health, err := heartbeats.New(rc, heartbeats.Config{Metrics: cfg.Metrics, Logger: healthLog})
	if err != nil {
		return nil, err
	}
	cleanupLog := logFor("cleanup")
	gc := cfg.Options.GC
	clean, err := cleanup.New(rc, cleanup.Config{
		Unbinder: cfg.Provisioner, GCAfter: gc.UnusedBindingAfter, DryRun: gc.DryRun, Metrics: cfg.Metrics, Logger: cleanupLog,
	})
	if err != nil {
		return nil, err
	}
	credLog := logFor("credentials")
	creds, err := credentials.New(rc, credentials.Config{
		Policy:          cfg.Options.Credentials,
		Issuer:          cfg.Provisioner,
		NamespacePrefix: cfg.NamespacePrefix,
		Allowed:         cfg.Allowed,
		Logger:          credLog,
	})
	if err != nil {
		return nil, err
	}
	c := &Controllers{rc: rc, leader: cfg.Options.Leader, log: exportsLog, all: []controller{
		{"exports", exports.Run, exportsLog},
		{"binding health", health.Run, healthLog},
		{"cleanup", clean.Run, cleanupLog},
		{"credentials", creds.Run, credLog},
	}}
	if cfg.Scope.Policy != "" {
		scope, err := newScopeCheck(rc, cfg.Scope, cfg.Metrics, logFor("scopecheck"))
		if err != nil {
			return nil, err
		}
		c.all = append(c.all, controller{"admission policy check", scope.Run, scope.log})
	}
	if cfg.Offers != nil {
		c.all = append(c.all, controller{"template status", cfg.Offers.RunStatus, logFor("offers")})
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
		c.runAll(ctx)
		return
	}
	le := leader.Config{Namespace: c.leader.Namespace, Name: c.leader.LeaseName, Identity: c.leader.PodName, Logger: c.log}
	if err := leader.Run(ctx, c.rc, le, c.runAll); err != nil {
		c.log.Error("leader election cannot run; the provider-side controllers are not running", "error", err)
	}
}

func (c *Controllers) runAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, ctrl := range c.all {
		wg.Go(func() { ctrl.runUntilDone(ctx) })
	}
	wg.Wait()
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
