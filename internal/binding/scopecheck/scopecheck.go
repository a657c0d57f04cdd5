// Package scopecheck proves, by asking the API server, that an admission
// policy confines the backend to the namespaces it made.
//
// The backend's RBAC cannot say "only namespaces I made": its cluster-wide
// "create rolebindings" plus "bind" of its namespace role, and "delete
// namespaces", would let whoever takes over the backend grant itself
// Secrets and ServiceAccount tokens in any namespace (kube-system too), or
// delete any namespace. The chart's ValidatingAdmissionPolicy closes that.
// Check sends dry-run requests as the backend itself that only such a
// policy (or tighter RBAC) refuses; an admitted one means the backend runs
// unconfined. A dry run persists nothing but passes admission.
//
// The policy also holds the Roles the backend makes for consumers to what
// a provider can declare. That probe needs a namespace the backend made
// (labelled, with the backend's namespace role): it is sent in the first
// such namespace found, and skipped while there is none (a fresh install
// has no consumer, so no Role to hold yet); the leader's periodic check
// sends it once one exists.
package scopecheck

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/kubernetes"
)

// ProbeNamespace is a namespace every cluster has and the backend never
// makes: granting itself anything there must be refused.
const ProbeNamespace = "kube-system"

// ErrUnconfined is wrapped by Check's error when the API server admitted a
// probe: the backend's RBAC is not confined.
var ErrUnconfined = errors.New("the backend is not confined to the namespaces it made")

// Options are what Check probes with.
type Options struct {
	// Policy names the ValidatingAdmissionPolicy expected to refuse the
	// probes, for the error message only.
	Policy string
	// NamespacePrefix is the backend's --namespace-prefix: the probe
	// namespace carries it, so only the missing label should get it refused.
	NamespacePrefix string
	// Role is the ClusterRole the backend binds to itself in its namespaces.
	Role string
	// ConsumerRole names a Role the backend makes for consumers (it may
	// escalate only by name); "" skips the Role probe.
	ConsumerRole string
	// ManagedBy is the label (key=value) on the namespaces the backend made.
	ManagedBy string
}

// Check sends the probes. It returns nil when both were Forbidden (by the
// policy, or by RBAC), an error wrapping ErrUnconfined
// when one was admitted, and another error when the API server could not
// answer (the caller may try again).
func Check(ctx context.Context, kube kubernetes.Interface, o Options) error {
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "kube-bind-backend-scopecheck"}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-bind-backend-scope-probe"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: o.Role},
		// The subject is irrelevant to the policy; a user nobody is keeps a
		// dry run that was wrongly persisted harmless.
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "kube-bind-backend-scope-probe"}},
	}
	_, err := kube.RbacV1().RoleBindings(ProbeNamespace).Create(ctx, rb, dry)
	if err := judge(err, o, fmt.Sprintf("a RoleBinding granting %s in %s", o.Role, ProbeNamespace)); err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.NamespacePrefix + "scope-probe-" + fmt.Sprint(time.Now().UnixNano()%1e6)}}
	_, err = kube.CoreV1().Namespaces().Create(ctx, ns, dry)
	if err := judge(err, o, "a namespace without the backend's label"); err != nil {
		return err
	}
	return CheckRoles(ctx, kube, o)
}

// CheckRoles applies, as a dry run, the consumer Role granting Pods in a
// namespace the backend made: only the policy refuses it there. A refusal
// by RBAC (the backend's namespace role not bound there, or not yet) says
// nothing about the policy, so the next such namespace is tried. It
// returns nil when the policy refused, or when no namespace could tell.
func CheckRoles(ctx context.Context, kube kubernetes.Interface, o Options) error {
	if o.ConsumerRole == "" || o.ManagedBy == "" {
		return nil
	}
	list, err := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: o.ManagedBy, Limit: 50})
	if err != nil {
		return fmt.Errorf("checking that the ValidatingAdmissionPolicy %q holds consumer Roles (listing the backend's namespaces): %w", o.Policy, err)
	}
	for _, ns := range list.Items {
		if ns.DeletionTimestamp != nil || !strings.HasPrefix(ns.Name, o.NamespacePrefix) {
			continue
		}
		role := rbacv1ac.Role(o.ConsumerRole, ns.Name).WithRules(rbacv1ac.PolicyRule().
			WithAPIGroups("").WithResources("pods").WithVerbs("create"))
		_, err := kube.RbacV1().Roles(ns.Name).Apply(ctx, role, metav1.ApplyOptions{
			DryRun: []string{metav1.DryRunAll}, FieldManager: "kube-bind-backend-scopecheck", Force: true})
		switch {
		case err == nil:
			return fmt.Errorf("%w: a dry run of the Role %s granting Pods in %s was admitted, so the ValidatingAdmissionPolicy %q does not hold "+
				"the Roles the backend makes for consumers to what a provider declares: a bug in its controllers could grant a consumer anything. "+
				"Upgrade the chart (admissionPolicy.enabled=true), or, knowing that risk, start with --unsafe-skip-admission-policy-check",
				ErrUnconfined, o.ConsumerRole, ns.Name, o.Policy)
		case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"):
			return nil
		case apierrors.IsForbidden(err), apierrors.IsNotFound(err):
			continue // RBAC, or deleted meanwhile: this namespace cannot tell
		default:
			return fmt.Errorf("checking that the ValidatingAdmissionPolicy %q holds consumer Roles (dry run in %s): %w", o.Policy, ns.Name, err)
		}
	}
	return nil
}

func judge(err error, o Options, what string) error {
	switch {
	case err == nil:
		return fmt.Errorf("%w: a dry run of %s was admitted, so the ValidatingAdmissionPolicy %q (or its binding) is missing or does not match this backend's user. "+
			"Without it, whoever takes over the backend can grant itself Secrets and ServiceAccount tokens in any namespace and delete any namespace. "+
			"Install the chart with admissionPolicy.enabled=true (Kubernetes 1.30 or newer), or, knowing that risk, start with --unsafe-skip-admission-policy-check",
			ErrUnconfined, what, o.Policy)
	case apierrors.IsForbidden(err):
		return nil
	default:
		return fmt.Errorf("checking that the ValidatingAdmissionPolicy %q confines the backend (dry run of %s): %w", o.Policy, what, err)
	}
}
