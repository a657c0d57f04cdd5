package kbmanager

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
)

// inClusterNamespaceFile holds the pod's namespace in a pod.
var inClusterNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// LeaderOptions are the leader election flags.
type LeaderOptions struct {
	// Enabled is set by Complete: the flag asks for it and a namespace is
	// known.
	Enabled bool
	// Namespace of the Lease: the flag, else PodNamespace, else the pod's
	// namespace file (set by Complete).
	Namespace string
	LeaseName string
	// PodNamespace and PodName come from the environment (POD_NAMESPACE,
	// POD_NAME); PodName names this replica in the Lease.
	PodNamespace, PodName string

	enabled bool
}

// AddFlags registers the flags, with the defaults.
func (o *LeaderOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.enabled, "leader-election", true, "run the provider-side controllers on one replica at a time, holding a Lease; off when no namespace is known (no --leader-election-namespace, no POD_NAMESPACE, not in a pod)")
	fs.StringVar(&o.Namespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: $POD_NAMESPACE, else the pod's own namespace)")
	fs.StringVar(&o.LeaseName, "leader-election-lease-name", "kube-bind-backend", "name of the leader election Lease")
}

// Complete settles where the Lease lives; with no namespace known (a
// local run) leader election is off.
func (o *LeaderOptions) Complete() []error {
	o.Enabled = false
	if !o.enabled {
		return nil
	}
	ns := o.Namespace
	if ns == "" {
		ns = o.PodNamespace
	}
	if ns == "" {
		if b, err := os.ReadFile(inClusterNamespaceFile); err == nil {
			ns = strings.TrimSpace(string(b))
		}
	}
	if ns == "" {
		return nil
	}
	var errs []error
	if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--leader-election-namespace %q: %s", ns, strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsDNS1123Subdomain(o.LeaseName); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--leader-election-lease-name %q: %s", o.LeaseName, strings.Join(msgs, "; ")))
	}
	o.Enabled, o.Namespace = true, ns
	return errs
}
