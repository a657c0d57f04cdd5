package server

import (
	"context"
	"errors"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/scopecheck"
)

const (
	// scopeStartWait bounds how long the start waits for the API server to
	// answer the probes; after it the backend starts and the leader's
	// periodic check gives the answer.
	scopeStartWait = 30 * time.Second
	// policyLoadGrace is how long an admitted probe at start is asked
	// again: the API server enforces a policy only once its admission
	// plugin has loaded it, a moment after it was created, and helm
	// creates the chart's policy and starts the pods together.
	policyLoadGrace = 15 * time.Second
)

func (s *Server) scopeOptions() scopecheck.Options {
	return scopecheck.Options{Policy: s.cfg.Provider.AdmissionPolicy, NamespacePrefix: s.cfg.Provider.NamespacePrefix, Role: binding.BackendNamespaceClusterRole,
		ConsumerRole: binding.ConsumerClaimsRole, ManagedBy: binding.LabelManagedBy + "=" + binding.ManagedByValue}
}

// checkScopeAtStart refuses to start when the admission policy does not
// confine the backend (AdmissionPolicy set). An API server that does not
// answer is no reason to refuse: the backend starts and the leader checks
// again (internal/binding/controllers).
func (s *Server) checkScopeAtStart(ctx context.Context, rc *rest.Config) error {
	if s.cfg.Provider.AdmissionPolicy == "" {
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
			s.log.Info("a probe of the admission policy was admitted; asking again while the API server may still be loading it", "policy", s.cfg.Provider.AdmissionPolicy)
		}
		select {
		case <-ctx.Done():
			s.log.Warn("cannot check the admission policy at start; the leader checks again", "policy", s.cfg.Provider.AdmissionPolicy, "error", err)
			return nil
		case <-time.After(time.Second):
		}
	}
}
