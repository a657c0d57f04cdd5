// Package binding is what the provider cluster sees of a binding: the
// catalog of exported APIs (CRDs labelled kube-bind.io/exported=true), and
// the provisioning of a consumer on bind (namespace, service account, token,
// RBAC, ClusterBinding, kubeconfig) and its removal on unbind.
package binding

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// userAgent names the backend in the provider cluster's audit logs.
const userAgent = "kube-bind-backend"

// RESTConfig connects to the provider cluster the way kubectl does:
// client-go's loading rules (an explicit kubeconfig path, else KUBECONFIG,
// else ~/.kube/config) with an optional context override; when none of
// those yields a configuration and the process runs in a pod, the in-cluster
// configuration (service account token, KUBERNETES_SERVICE_HOST).
// It does not contact the cluster.
func RESTConfig(kubeconfig, context string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: context}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading provider cluster configuration (kubeconfig %q, context %q): %w", kubeconfig, context, err)
	}
	cfg.UserAgent = userAgent
	// A bind makes about a dozen requests; the default 5 QPS would throttle
	// a handful of users binding at once.
	if cfg.QPS == 0 {
		cfg.QPS = 50
		cfg.Burst = 100
	}
	return cfg, nil
}
