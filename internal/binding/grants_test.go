package binding

import (
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// A consumer's Role holds CRD groups and claimable resources with the
// consumer verbs, nothing else: no wildcard, no built-in group beyond the
// claimable resources, no RBAC, no kube-bind.io, no non-resource URL.
func TestCheckConsumerRule(t *testing.T) {
	claimable := []schema.GroupResource{{Resource: "secrets"}, {Resource: "configmaps"}}
	rule := func(groups, resources, verbs []string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: groups, Resources: resources, Verbs: verbs}
	}
	s := func(v ...string) []string { return v }
	for _, tc := range []struct {
		what string
		rule rbacv1.PolicyRule
		ok   bool
	}{
		{"a CRD's resource", rule(s("mangodb.com"), s("mangodbs"), ConsumerVerbs), true},
		{"a claimable resource", rule(s(""), s("secrets", "configmaps"), s("get", "list", "watch", "create", "update", "delete")), true},
		{"the Gateway API (a CRD group under k8s.io)", rule(s("gateway.networking.k8s.io"), s("httproutes"), s("get")), true},
		{"every group", rule(s("*"), s("mangodbs"), s("get")), false},
		{"a wildcard in a group", rule(s("*.com"), s("mangodbs"), s("get")), false},
		{"every resource", rule(s("mangodb.com"), s("*"), s("get")), false},
		{"every subresource", rule(s("mangodb.com"), s("mangodbs/*"), s("get")), false},
		{"every verb", rule(s("mangodb.com"), s("mangodbs"), s("*")), false},
		{"escalate", rule(s("mangodb.com"), s("mangodbs"), s("escalate")), false},
		{"impersonate", rule(s("mangodb.com"), s("mangodbs"), s("impersonate")), false},
		{"pods", rule(s(""), s("pods"), s("create")), false},
		{"a claimable resource beside pods", rule(s(""), s("secrets", "pods"), s("get")), false},
		{"a claimable resource under two groups", rule(s("", "apps"), s("secrets"), s("get")), false},
		{"deployments", rule(s("apps"), s("deployments"), s("create")), false},
		{"roles", rule(s("rbac.authorization.k8s.io"), s("roles"), s("create")), false},
		{"kube-bind.io", rule(s("kube-bind.io"), s("apiserviceexports"), s("get")), false},
		{"a built-in group with a dot", rule(s("admissionregistration.k8s.io"), s("validatingadmissionpolicies"), s("delete")), false},
		{"no groups", rule(nil, s("secrets"), s("get")), false},
		{"no verbs", rule(s("mangodb.com"), s("mangodbs"), nil), false},
		{"non-resource URLs", rbacv1.PolicyRule{NonResourceURLs: s("/metrics"), Verbs: s("get")}, false},
		{"non-resource URLs beside a resource", rbacv1.PolicyRule{APIGroups: s("mangodb.com"), Resources: s("mangodbs"), NonResourceURLs: s("*"), Verbs: s("get")}, false},
	} {
		if err := CheckConsumerRule(tc.rule, claimable); (err == nil) != tc.ok {
			t.Errorf("%s: CheckConsumerRule = %v, want allowed %v", tc.what, err, tc.ok)
		}
	}
	// What the provider did not declare claimable is refused even in the
	// core group.
	if err := CheckConsumerRule(rule(s(""), s("secrets"), s("get")), nil); err == nil {
		t.Error("secrets allowed with nothing claimable")
	}
}
