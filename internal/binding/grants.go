package binding

import (
	"fmt"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// BuiltinGroups are the API groups with a dot that the API server serves
// itself, and kube-bind.io: a Role made for a consumer never names them.
// A group without a dot is built in as well (the core group, apps, batch,
// policy...): a CRD's group must contain a dot. The chart's admission
// policy (templates/admissionpolicy.yaml) holds the same list.
var BuiltinGroups = []string{
	"admissionregistration.k8s.io", "apiextensions.k8s.io", "apiregistration.k8s.io", "authentication.k8s.io",
	"authorization.k8s.io", "certificates.k8s.io", "coordination.k8s.io", "discovery.k8s.io", "events.k8s.io",
	"flowcontrol.apiserver.k8s.io", "internal.apiserver.k8s.io", "metrics.k8s.io", "networking.k8s.io", "node.k8s.io",
	"rbac.authorization.k8s.io", "resource.k8s.io", "scheduling.k8s.io", "storage.k8s.io", "storagemigration.k8s.io",
	kubeBindGroup,
}

// ConsumerVerbs are the most a consumer's Role grants on a resource.
var ConsumerVerbs = []string{"get", "list", "watch", "create", "update", "patch", "delete"}

// IsBuiltinGroup says whether group is served by the API server itself
// (or is kube-bind.io), so no exported CRD can be of it.
func IsBuiltinGroup(group string) bool {
	return !strings.Contains(group, ".") || slices.Contains(BuiltinGroups, group)
}

// CheckConsumerRule says why rule may not be part of a Role made for a
// consumer, or nil: it must name groups, resources and verbs (no '*'),
// only ConsumerVerbs, no non-resource URLs, never RBAC or kube-bind.io,
// and either only CRD groups or exactly one group that is a claimable
// resource's.
func CheckConsumerRule(rule rbacv1.PolicyRule, claimable []schema.GroupResource) error {
	if len(rule.NonResourceURLs) > 0 {
		return fmt.Errorf("non-resource URLs %v", rule.NonResourceURLs)
	}
	if len(rule.APIGroups) == 0 || len(rule.Resources) == 0 || len(rule.Verbs) == 0 {
		return fmt.Errorf("a rule without groups, resources or verbs")
	}
	for _, v := range rule.Verbs {
		if !slices.Contains(ConsumerVerbs, v) {
			return fmt.Errorf("verb %q", v)
		}
	}
	for _, r := range rule.Resources {
		if r == "" || strings.Contains(r, "*") {
			return fmt.Errorf("resource %q", r)
		}
	}
	for _, g := range rule.APIGroups {
		if strings.Contains(g, "*") || g == rbacv1.GroupName || g == kubeBindGroup {
			return fmt.Errorf("group %q", g)
		}
		if !IsBuiltinGroup(g) {
			continue
		}
		for _, r := range rule.Resources {
			if len(rule.APIGroups) != 1 || !slices.Contains(claimable, schema.GroupResource{Group: g, Resource: r}) {
				return fmt.Errorf("resource %q of the built-in group %q, which is not claimable", r, g)
			}
		}
	}
	return nil
}
