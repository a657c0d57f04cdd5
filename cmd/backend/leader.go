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
// internal/credentials) in the background until ctx ends: on the replica
// holding the Lease when leader election is on, else right here. A failing
// controller is started again.
func startControllers(ctx context.Context, cfg *config, rc *rest.Config, catalog *binding.Catalog, p *binding.Provisioner, logger *slog.Logger) error {
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
	keepRunning := func(ctx context.Context, name string, log *slog.Logger, run func(context.Context) error) {
		for ctx.Err() == nil {
			if err := run(ctx); err != nil && ctx.Err() == nil {
				log.Error(name+" stopped; starting again in 5s", "error", err)
				select {
				case <-ctx.Done():
				case <-time.After(5 * time.Second):
				}
			}
		}
	}
	runUntilDone := func(ctx context.Context) {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); keepRunning(ctx, "exports controllers", log, ctrl.Run) }()
		go func() { defer wg.Done(); keepRunning(ctx, "credentials controller", credLog, creds.Run) }()
		wg.Wait()
	}
	if !cfg.LeaderElection {
		log.Warn("leader election off (no --leader-election-namespace, POD_NAMESPACE or pod namespace file, or --leader-election=false): " +
			"this process runs the exports and credentials controllers; run a single replica")
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
			log.Error("leader election cannot run; the exports and credentials controllers are not running", "error", err)
		}
	}()
	return nil
}
