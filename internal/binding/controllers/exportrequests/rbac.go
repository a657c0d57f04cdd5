package exportrequests

import (
	"context"
	"sort"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kbprovider/backend/internal/binding"
)

// ConsumerExportsRole names the Role (and its RoleBinding) that gives a
// consumer's service account the resources it bound, in its own provider
// namespace and in each namespace made for one of its APIServiceNamespaces.
const ConsumerExportsRole = binding.ConsumerExportsRole

// ConsumerClaimsRole names the Role (and its RoleBinding) that gives a
// consumer's service account the resources its exports claim, only in the
// namespaces made for its APIServiceNamespaces: never in its own provider
// namespace, which holds its kubeconfig and token Secrets. RBAC cannot
// match labels; the konnector applies the claims' selectors.
const ConsumerClaimsRole = binding.ConsumerClaimsRole

// consumerVerbs are what the konnector does with a bound resource's
// objects on the provider side: it creates and updates the spec, deletes,
// and watches the status the provider writes.
var consumerVerbs = binding.ConsumerVerbs

// claimVerbs are what konnector v0.8 does with claimed objects on the
// provider side: it watches them (list, watch; get through its cache),
// creates and updates the copies the consumer owns, deletes them when the
// consumer's are gone. It never patches them.
var claimVerbs = []string{"get", "list", "watch", "create", "update", "delete"}

// consumerRules grants the namespaced bound resources: the group and
// plural of each exported CRD, never a built-in group. Cluster-scoped
// ones cannot be granted with a Role (see docs/exports.md).
func consumerRules(bound []*apiextensionsv1.CustomResourceDefinition) []rbacv1.PolicyRule {
	rules := []rbacv1.PolicyRule{}
	for _, crd := range bound {
		if crd.Spec.Scope != apiextensionsv1.NamespaceScoped || binding.IsBuiltinGroup(crd.Spec.Group) {
			continue
		}
		rules = append(rules, rbacv1.PolicyRule{
			APIGroups: []string{crd.Spec.Group},
			Resources: []string{crd.Spec.Names.Plural},
			Verbs:     consumerVerbs,
		})
	}
	return rules
}

// claimRules grants every resource the exports (already narrowed to what
// the offers hold) claim, spelled as the provider's claimable resources
// spell it: a claim on anything else grants nothing.
func claimRules(exports []*wantedExport, claimable []schema.GroupResource) []rbacv1.PolicyRule {
	seen := map[schema.GroupResource]bool{}
	rules := []rbacv1.PolicyRule{}
	for _, w := range exports {
		for _, c := range w.spec.PermissionClaims {
			for _, gr := range claimable {
				if gr.Group != c.Group || gr.Resource != c.Resource || seen[gr] {
					continue
				}
				seen[gr] = true
				rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{gr.Group}, Resources: []string{gr.Resource}, Verbs: claimVerbs})
			}
		}
	}
	sort.Slice(rules, func(i, j int) bool {
		return rules[i].Resources[0]+"."+rules[i].APIGroups[0] < rules[j].Resources[0]+"."+rules[j].APIGroups[0]
	})
	return rules
}

// safeRules drops every rule a consumer's Role must never hold
// (binding.CheckConsumerRule): the rules above cannot produce one, so a
// drop is a bug, logged as an error. The chart's admission policy refuses
// such a Role as well.
func (r *run) safeRules(ns, name string, rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
	out := make([]rbacv1.PolicyRule, 0, len(rules))
	for _, rule := range rules {
		if err := binding.CheckConsumerRule(rule, r.cfg.ClaimableResources); err != nil {
			r.log.Error("exports: a rule beyond what the provider declared was kept out of a consumer's Role",
				"namespace", ns, "role", name, "rule", rule.String(), "error", err)
			continue
		}
		out = append(out, rule)
	}
	return out
}

// applyConsumerRBAC makes the Role name of rules and its RoleBinding to
// the service account of consumerNS, in ns, unless the cached ones are
// already so: a settled consumer costs no request.
func (r *run) applyConsumerRBAC(ctx context.Context, ns, consumerNS, name string, rules []rbacv1.PolicyRule) error {
	rules = r.safeRules(ns, name, rules)
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: binding.ServiceAccountName, Namespace: consumerNS}
	inStep, err := r.rbacInStep(ctx, ns, name, rules, subject)
	if err != nil || inStep {
		return err
	}
	labels := map[string]string{binding.LabelManagedBy: binding.ManagedByValue}
	role := rbacv1ac.Role(name, ns).WithLabels(labels)
	for _, rule := range rules {
		role.WithRules(rbacv1ac.PolicyRule().WithAPIGroups(rule.APIGroups...).WithResources(rule.Resources...).WithVerbs(rule.Verbs...))
	}
	// No rules: server-side apply drops the ones this manager set before.
	rb := rbacv1ac.RoleBinding(name, ns).WithLabels(labels).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(name)).
		WithSubjects(rbacv1ac.Subject().WithKind(subject.Kind).WithName(subject.Name).WithNamespace(subject.Namespace))
	opts := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}
	return retryForbidden(ctx, func() error {
		if _, err := r.kube.RbacV1().Roles(ns).Apply(ctx, role, opts); err != nil {
			return err
		}
		_, err := r.kube.RbacV1().RoleBindings(ns).Apply(ctx, rb, opts)
		return err
	})
}

// rbacInStep says whether the cached Role name in ns holds exactly rules
// and its RoleBinding binds it to subject alone.
func (r *run) rbacInStep(ctx context.Context, ns, name string, rules []rbacv1.PolicyRule, subject rbacv1.Subject) (bool, error) {
	key := client.ObjectKey{Namespace: ns, Name: name}
	role, rb := &rbacv1.Role{}, &rbacv1.RoleBinding{}
	for _, obj := range []client.Object{role, rb} {
		if err := r.cache.Get(ctx, key, obj); err != nil {
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return false, err
		}
		if obj.GetDeletionTimestamp() != nil {
			return false, nil
		}
	}
	return equality.Semantic.DeepEqual(role.Rules, rules) &&
		rb.RoleRef == (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}) &&
		len(rb.Subjects) == 1 && rb.Subjects[0] == subject, nil
}

// retryForbidden retries fn for a few seconds while it is forbidden: the
// API server's RBAC cache learns of the backend's own RoleBinding in a
// namespace it just made with a short delay.
func retryForbidden(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(10 * time.Second)
	delay := 10 * time.Millisecond
	for {
		err := fn()
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}
