package chart_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/scopecheck"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
)

// testEscalationWithoutPolicy removes the chart's admission policy binding
// (a cluster before 1.30, or a deleted policy) and tries, as the chart's
// ServiceAccount, what a compromised backend would: bind cluster-admin,
// admin or edit, make a ClusterRoleBinding, make a Role with rights it
// lacks, bind a Role to itself. RBAC alone must refuse each. What RBAC
// cannot refuse (granting itself its namespace role in any namespace) is
// why the backend then refuses to start. The binding is restored at the end.
func testEscalationWithoutPolicy(t *testing.T, cp *controlplane.ControlPlane, admin kubernetes.Interface) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	asSA := backendSAConfig(ctx, t, cp, admin)
	as := kubernetes.NewForConfigOrDie(asSA)

	policy := fullname + "-scope"
	vapb, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, policy, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's ValidatingAdmissionPolicyBinding %s: %v", policy, err)
	}
	if err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, policy, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	selfGrant := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "self-grant"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: binding.BackendNamespaceClusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: saUser}},
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	t.Cleanup(func() {
		restore := &admissionv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: vapb.Name, Labels: vapb.Labels, Annotations: vapb.Annotations},
			Spec:       vapb.Spec,
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, restore, metav1.CreateOptions{}); err != nil {
			t.Fatalf("restoring the policy binding: %v", err)
		}
		for {
			if _, err := as.RbacV1().RoleBindings("kube-system").Create(ctx, selfGrant, dry); apierrors.IsForbidden(err) {
				return
			}
			if ctx.Err() != nil {
				t.Fatal("the restored policy never took effect")
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	// The policy is gone once the API server admits the self-grant.
	for {
		_, err := as.RbacV1().RoleBindings("kube-system").Create(ctx, selfGrant, dry)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the self-grant in kube-system is still refused without the policy binding: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A namespace as the backend makes one: its label, its RoleBinding of
	// the namespace role to the backend.
	ns := "kube-bind-escalation"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{binding.LabelManagedBy: binding.ManagedByValue}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	grant := selfGrant.DeepCopy()
	grant.Name = "kube-bind-backend"
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, grant, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A Role with rights the backend lacks, made by someone else.
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pods"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"*"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The backend's RBAC cache needs a moment for the new RoleBinding.
	for !canI(t, cp, ns, "get", "secrets") {
		if ctx.Err() != nil {
			t.Fatal("the backend never got its namespace role")
		}
		time.Sleep(100 * time.Millisecond)
	}

	me := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: saUser}
	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("without the admission policy, the backend could %s: %v, want Forbidden", what, err)
		}
	}
	// This control plane runs no ClusterRole aggregation: admin and edit
	// get their usual rules here, or binding them would grant nothing.
	for _, role := range []string{"admin", "edit"} {
		cr, err := admin.RbacV1().ClusterRoles().Get(ctx, role, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cr.AggregationRule = nil
		cr.Rules = []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "secrets", "serviceaccounts"}, Verbs: []string{"*"}},
			{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"*"}},
		}
		if _, err := admin.RbacV1().ClusterRoles().Update(ctx, cr, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, target := range []string{ns, "kube-system"} {
		for _, role := range []string{"cluster-admin", "admin", "edit"} {
			_, err := as.RbacV1().RoleBindings(target).Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "grab-" + role},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
				Subjects:   []rbacv1.Subject{me},
			}, metav1.CreateOptions{})
			forbidden("bind "+role+" to itself in "+target, err)
			if err == nil {
				_ = admin.RbacV1().RoleBindings(target).Delete(ctx, "grab-"+role, metav1.DeleteOptions{})
			}
		}
	}
	_, err = as.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-bind-backend-grab"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: binding.BackendNamespaceClusterRole},
		Subjects:   []rbacv1.Subject{me},
	}, metav1.CreateOptions{})
	forbidden("create a ClusterRoleBinding", err)
	_, err = as.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "grab"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}}}, metav1.CreateOptions{})
	forbidden("create a Role with rights it does not hold in "+ns, err)
	_, err = as.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "grab-pods"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pods"},
		Subjects:   []rbacv1.Subject{me},
	}, metav1.CreateOptions{})
	forbidden("bind a Role with rights it lacks to itself in "+ns, err)
	if canI(t, cp, ns, "create", "pods") {
		t.Errorf("after the attempts, the backend may create pods in %s", ns)
	}
	// RBAC lets the backend write its consumer Roles by name with any
	// rule in a namespace it made: the Role probe sees that.
	if err := scopecheck.CheckRoles(ctx, as, scopeOptions); !errors.Is(err, scopecheck.ErrUnconfined) || !strings.Contains(err.Error(), "granting Pods") {
		t.Errorf("the Role probe without the policy: %v, want ErrUnconfined", err)
	}

	// What RBAC cannot refuse: the backend granting itself its namespace
	// role anywhere. So it refuses to start.
	kubeconfig := controlplane.KubeconfigFile(t, asSA)
	cmd := exec.CommandContext(ctx, backendBinary(t), "--listen-address=127.0.0.1:0", "--log-format=text",
		"--oidc-issuer-url=https://login.example.com", "--oidc-issuer-client-id=kube-bind", "--oidc-issuer-client-secret=x",
		"--kubeconfig="+kubeconfig, "--leader-election=false", "--admission-policy="+policy)
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), policy) ||
		!strings.Contains(string(out), "not confined") {
		t.Errorf("the backend without its admission policy: exit %d (%v), want 1 with an error naming %s:\n%s", code, err, policy, out)
	}
}

// testConsumerRolesWithinDeclared applies, as the chart's ServiceAccount,
// the consumer Roles the backend makes, in a namespace it made: Roles of a
// CRD's resource and of the claimable resources pass the chart's policy;
// a Role granting Pods, a wildcard, RBAC, kube-bind.io or a verb beyond
// the consumer verbs is refused by it, although RBAC (escalate by name)
// would let the backend write it. scopecheck.Check, as the backend runs it
// at start, sees the policy confine it.
func testConsumerRolesWithinDeclared(t *testing.T, cp *controlplane.ControlPlane, admin kubernetes.Interface) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	as := kubernetes.NewForConfigOrDie(backendSAConfig(ctx, t, cp, admin))
	ns := "kube-bind-roles-within"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{binding.LabelManagedBy: binding.ManagedByValue}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-bind-backend"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: binding.BackendNamespaceClusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: saUser}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for !canI(t, cp, ns, "patch", "roles") {
		if ctx.Err() != nil {
			t.Fatal("the backend never got its namespace role")
		}
		time.Sleep(100 * time.Millisecond)
	}
	apply := func(rules ...*rbacv1ac.PolicyRuleApplyConfiguration) error {
		_, err := as.RbacV1().Roles(ns).Apply(ctx, rbacv1ac.Role(binding.ConsumerClaimsRole, ns).WithRules(rules...),
			metav1.ApplyOptions{FieldManager: "kube-bind-backend", Force: true})
		return err
	}
	rule := func(group string, resources []string, verbs ...string) *rbacv1ac.PolicyRuleApplyConfiguration {
		return rbacv1ac.PolicyRule().WithAPIGroups(group).WithResources(resources...).WithVerbs(verbs...)
	}
	if err := apply(); err != nil {
		t.Errorf("a consumer Role without rules: %v, want admitted", err)
	}
	for what, r := range map[string]*rbacv1ac.PolicyRuleApplyConfiguration{
		"a CRD's resource":        rule("mangodb.com", []string{"mangodbs"}, binding.ConsumerVerbs...),
		"the claimable resources": rule("", []string{"secrets", "configmaps"}, "get", "list", "watch", "create", "update", "delete"),
	} {
		if err := apply(r); err != nil {
			t.Errorf("a consumer Role of %s: %v, want admitted", what, err)
		}
	}
	for what, r := range map[string]*rbacv1ac.PolicyRuleApplyConfiguration{
		"pods":                          rule("", []string{"pods"}, "create"),
		"secrets and pods":              rule("", []string{"secrets", "pods"}, "get"),
		"every resource":                rule("*", []string{"*"}, "get"),
		"every resource of a CRD group": rule("mangodb.com", []string{"*"}, "get"),
		"every verb":                    rule("mangodb.com", []string{"mangodbs"}, "*"),
		"escalate":                      rule("mangodb.com", []string{"mangodbs"}, "escalate"),
		"roles":                         rule("rbac.authorization.k8s.io", []string{"roles"}, "create"),
		"kube-bind.io":                  rule("kube-bind.io", []string{"apiserviceexports"}, "create"),
		"deployments":                   rule("apps", []string{"deployments"}, "create"),
		"a built-in group with a dot":   rule("admissionregistration.k8s.io", []string{"validatingadmissionpolicies"}, "delete"),
	} {
		err := apply(r)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exported CRDs and the claimable resources") {
			t.Errorf("a consumer Role of %s: %v, want Forbidden by the chart's policy", what, err)
		}
	}
	if canI(t, cp, ns, "create", "pods") {
		t.Errorf("after the attempts, the backend may create pods in %s", ns)
	}
	if err := scopecheck.Check(ctx, as, scopeOptions); err != nil {
		t.Errorf("scopecheck.Check with the chart's policy: %v", err)
	}
}

// scopeOptions are the probes' options as the backend sets them.
var scopeOptions = scopecheck.Options{Policy: fullname + "-scope", NamespacePrefix: "kube-bind-",
	Role: binding.BackendNamespaceClusterRole, ConsumerRole: binding.ConsumerClaimsRole,
	ManagedBy: binding.LabelManagedBy + "=" + binding.ManagedByValue}
