package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/bindinghealth"
	"github.com/kbprovider/backend/internal/cleanup"
	"github.com/kbprovider/backend/internal/credentials"
	"github.com/kbprovider/backend/internal/exports"
	"github.com/kbprovider/backend/internal/leader"
)

// inClusterNamespaceFile holds the pod's namespace in a pod.
var inClusterNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// validateLeaderElection settles where the Lease lives: the flag, else
// POD_NAMESPACE (the chart sets it), else the pod's namespace file. With
// none of them (a local run) leader election is off.
func (r *rawFlags) validateLeaderElection(c *config) []error {
	c.LeaderElectionLeaseName = r.leaderElectionLeaseName
	c.PodName = r.podName
	if !r.leaderElection {
		return nil
	}
	ns := r.leaderElectionNamespace
	if ns == "" {
		ns = r.podNamespace
	}
	if ns == "" {
		if b, err := os.ReadFile(inClusterNamespaceFile); err == nil {
			ns = strings.TrimSpace(string(b))
		}
	}
	var errs []error
	if ns != "" {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--leader-election-namespace %q: %s", ns, strings.Join(msgs, "; ")))
		}
		if msgs := validation.IsDNS1123Subdomain(r.leaderElectionLeaseName); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--leader-election-lease-name %q: %s", r.leaderElectionLeaseName, strings.Join(msgs, "; ")))
		}
		c.LeaderElection, c.LeaderElectionNamespace = true, ns
	}
	return errs
}

// startControllers runs the provider-side controllers (internal/exports,
// internal/bindinghealth, internal/cleanup, internal/credentials) in the background until ctx ends: on the replica
// holding the Lease when leader election is on, else right here. A failing
// controller is started again; all of them stop when leadership ends.
func startControllers(ctx context.Context, cfg *config, rc *rest.Config, catalog *binding.Catalog, p *binding.Provisioner, w wiring) error {
	logger := w.logger
	log := logger.With("component", "exports")
	ctrl, err := exports.New(rc, exports.Config{
		Catalog:         catalog,
		GrantBackend:    p.GrantBackend,
		NamespacePrefix: cfg.NamespacePrefix,
		Logger:          log,
	})
	if err != nil {
		return err
	}
	healthLog := logger.With("component", "bindinghealth")
	health, err := bindinghealth.New(rc, bindinghealth.Config{Metrics: w.metrics, Logger: healthLog})
	if err != nil {
		return err
	}
	cleanupLog := logger.With("component", "cleanup")
	clean, err := cleanup.New(rc, cleanup.Config{
		Unbinder: p, GCAfter: cfg.GCUnusedBindingAfter, DryRun: cfg.GCDryRun, Metrics: w.metrics, Logger: cleanupLog,
	})
	if err != nil {
		return err
	}
	credLog := logger.With("component", "credentials")
	creds, err := credentials.New(rc, credentials.Config{
		Policy: credentials.Policy{
			Lifetime:      cfg.Credentials.Lifetime,
			RotationPoint: cfg.Credentials.RotationPoint,
			Overlap:       cfg.Credentials.Overlap,
		},
		Issuer:          p,
		NamespacePrefix: cfg.NamespacePrefix,
		Logger:          credLog,
	})
	if err != nil {
		return err
	}
	controllers := []controller{
		{"exports", ctrl.Run, log},
		{"binding health", health.Run, healthLog},
		{"cleanup", clean.Run, cleanupLog},
		{"credentials", creds.Run, credLog},
	}
	runUntilDone := func(ctx context.Context) {
		var wg sync.WaitGroup
		for _, c := range controllers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.runUntilDone(ctx)
			}()
		}
		wg.Wait()
	}
	if !cfg.LeaderElection {
		log.Warn("leader election off (no --leader-election-namespace, POD_NAMESPACE or pod namespace file, or --leader-election=false): " +
			"this process runs the provider-side controllers; run a single replica")
		go runUntilDone(ctx)
		return nil
	}
	le := leader.Config{
		Namespace: cfg.LeaderElectionNamespace,
		Name:      cfg.LeaderElectionLeaseName,
		Identity:  cfg.PodName,
		Logger:    log,
	}
	go func() {
		if err := leader.Run(ctx, rc, le, runUntilDone); err != nil {
			log.Error("leader election cannot run; the provider-side controllers are not running", "error", err)
		}
	}()
	return nil
}

// controller is one provider-side controller run under the leadership.
type controller struct {
	name string
	run  func(context.Context) error
	log  *slog.Logger
}

// runUntilDone runs the controller until ctx ends, starting it again 5s
// after it failed.
func (c controller) runUntilDone(ctx context.Context) {
	for ctx.Err() == nil {
		if err := c.run(ctx); err != nil && ctx.Err() == nil {
			c.log.Error(c.name+" controllers stopped; starting again in 5s", "error", err)
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
	}
}
