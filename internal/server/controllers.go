package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/bindinghealth"
	"github.com/kbprovider/backend/internal/cleanup"
	"github.com/kbprovider/backend/internal/clitoken"
	"github.com/kbprovider/backend/internal/credentials"
	"github.com/kbprovider/backend/internal/exports"
	"github.com/kbprovider/backend/internal/leader"
	"github.com/kbprovider/backend/internal/offers"
	"github.com/kbprovider/backend/internal/oidc"
)

// controllerRestart is the pause before a failed controller starts again.
const controllerRestart = 5 * time.Second

// newControllers builds the provider-side controllers (internal/exports,
// internal/bindinghealth, internal/cleanup, internal/credentials, and the
// templates' Ready condition of internal/offers) and
// returns what runs them until its ctx ends: on the replica holding the
// Lease when leader election is on, else right here. A failing controller
// is started again; all of them stop when leadership ends, and the
// returned function returns only after the Lease was released.
func (s *Server) newControllers(rc *rest.Config, catalog *binding.Catalog, src *offers.Source, p *binding.Provisioner, reg *prometheus.Registry) (func(context.Context), error) {
	cfg := s.cfg
	log := s.log.With("component", "exports")
	ctrl, err := exports.New(rc, exports.Config{
		Catalog:         catalog,
		Offers:          src,
		GrantBackend:    p.GrantBackend,
		NamespacePrefix: cfg.NamespacePrefix,
		Logger:          log,
	})
	if err != nil {
		return nil, err
	}
	healthLog := s.log.With("component", "bindinghealth")
	health, err := bindinghealth.New(rc, bindinghealth.Config{Metrics: reg, Logger: healthLog})
	if err != nil {
		return nil, err
	}
	cleanupLog := s.log.With("component", "cleanup")
	clean, err := cleanup.New(rc, cleanup.Config{
		Unbinder: p, GCAfter: cfg.GCUnusedBindingAfter, DryRun: cfg.GCDryRun, Metrics: reg, Logger: cleanupLog,
	})
	if err != nil {
		return nil, err
	}
	credLog := s.log.With("component", "credentials")
	creds, err := credentials.New(rc, credentials.Config{
		Policy:          cfg.Credentials,
		Issuer:          p,
		NamespacePrefix: cfg.NamespacePrefix,
		Allowed:         stillAllowed(oidc.AllowList{Users: cfg.OIDCAllowedUsers, Groups: cfg.OIDCAllowedGroups}),
		Logger:          credLog,
	})
	if err != nil {
		return nil, err
	}
	controllers := []controller{
		{"exports", ctrl.Run, log},
		{"binding health", health.Run, healthLog},
		{"cleanup", clean.Run, cleanupLog},
		{"credentials", creds.Run, credLog},
	}
	if cfg.AdmissionPolicy != "" {
		scope, err := s.newScopeController(rc, reg)
		if err != nil {
			return nil, err
		}
		controllers = append(controllers, controller{"admission policy check", scope.Run, scope.log})
	}
	if src != nil {
		offersLog := s.log.With("component", "offers")
		controllers = append(controllers, controller{"template status", src.RunStatus, offersLog})
	}
	runAll := func(ctx context.Context) {
		var wg sync.WaitGroup
		for _, c := range controllers {
			wg.Go(func() { c.runUntilDone(ctx) })
		}
		wg.Wait()
	}
	if !cfg.LeaderElection {
		log.Warn("leader election off (no --leader-election-namespace, POD_NAMESPACE or pod namespace file, or --leader-election=false): " +
			"this process runs the provider-side controllers; run a single replica")
		return runAll, nil
	}
	le := leader.Config{
		Namespace: cfg.LeaderElectionNamespace,
		Name:      cfg.LeaderElectionLeaseName,
		Identity:  cfg.PodName,
		Logger:    log,
	}
	return func(ctx context.Context) {
		if err := leader.Run(ctx, rc, le, runAll); err != nil {
			log.Error("leader election cannot run; the provider-side controllers are not running", "error", err)
		}
	}, nil
}

// controller is one provider-side controller run under the leadership.
type controller struct {
	name string
	run  func(context.Context) error
	log  *slog.Logger
}

// runUntilDone runs the controller until ctx ends, starting it again
// controllerRestart after it failed.
func (c controller) runUntilDone(ctx context.Context) {
	for ctx.Err() == nil {
		if err := c.run(ctx); err != nil && ctx.Err() == nil {
			c.log.Error(c.name+" controllers stopped; starting again in 5s", "error", err)
			select {
			case <-ctx.Done():
			case <-time.After(controllerRestart):
			}
		}
	}
}

// stillAllowed judges the recorded identity of a binding by the
// allow-list the logins use; nil when everybody may bind.
func stillAllowed(l oidc.AllowList) func(binding.BoundBy) bool {
	if l.Open() {
		return nil
	}
	return func(b binding.BoundBy) bool {
		id := oidc.Identity{Issuer: b.Issuer, Subject: b.Subject, Email: b.Email, EmailVerified: b.Email != "", Groups: b.Groups}
		return l.AllowsRecorded(id, b.GroupsKnown)
	}
}

// cliUserAllowed judges the user a CLI token names by the same
// allow-list; nil when everybody may bind.
func cliUserAllowed(l oidc.AllowList) func(clitoken.User) bool {
	if l.Open() {
		return nil
	}
	return func(u clitoken.User) bool {
		id := oidc.Identity{Subject: u.Subject, Email: u.Email, EmailVerified: u.Email != "", Groups: u.Groups}
		return l.AllowsRecorded(id, u.GroupsKnown)
	}
}
