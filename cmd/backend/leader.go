package main

import (
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
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
