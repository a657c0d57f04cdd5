package binding

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// What a kbind v2 konnector needs on the provider beyond its own
// namespace (docs/v2.md, "Health"): the reads it makes before it
// heartbeats, and its heartbeat Lease in one namespace that every
// consumer shares.
const (
	// V2LeaseNamespace holds the v2 konnectors' heartbeat Leases; the
	// released konnector has the name built in.
	V2LeaseNamespace = "kbind"
	// LabelLeaseConsumer attributes a Lease in V2LeaseNamespace to the
	// provider namespace whose service account created it. Only the
	// admission policy (charts/kube-bind-backend/files/kbind-v2-lease-policy.yaml)
	// sets it, and no consumer may change it; the heartbeat controller
	// trusts nothing else of a Lease to say whose it is.
	LabelLeaseConsumer = "kube-bind.io/lease-consumer"
	// V2KonnectorClusterRole is what a v2 konnector reads before it
	// heartbeats: the provider's identity and the CRDs.
	V2KonnectorClusterRole = "kube-bind-v2-konnector"
	// V2LeaseRole is the consumers' Role in V2LeaseNamespace.
	V2LeaseRole = "kube-bind-v2-lease"
	// BackendLeasesRole is the backend's Role in V2LeaseNamespace: the
	// heartbeat controller's cache.
	BackendLeasesRole = "kube-bind-backend-leases"
	// AllServiceAccounts is the group the v2 grants name: RBAC has no
	// group of the consumers' service accounts alone, so the Leases'
	// admission policy tells consumers from others.
	AllServiceAccounts = "system:serviceaccounts"
)

// V2LeaseRoles returns the Roles in V2LeaseNamespace, as the chart makes
// them: the consumers' (create any Lease, get and update one: the
// admission policy confines both to the consumer's own; never delete,
// list or watch) and the backend's (list and watch).
func V2LeaseRoles() []*rbacv1.Role {
	role := func(name string, verbs ...string) *rbacv1.Role {
		return &rbacv1.Role{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: V2LeaseNamespace, Labels: map[string]string{LabelManagedBy: managedByValue}},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: verbs}},
		}
	}
	return []*rbacv1.Role{role(V2LeaseRole, "create", "get", "update"), role(BackendLeasesRole, "list", "watch")}
}

// InstallV2Access makes, for the local demo and tests, what the chart
// makes for v2 konnectors: the Lease namespace, the consumers' Role there
// and both grants of v2 konnectors to every service account (the chart's
// admission policy, applied apart, confines the Lease writes). The
// backend runs as an admin there, so its own Role is not bound. It needs
// a cluster-admin-like identity and the ClusterRoles (InstallClusterRoles).
func InstallV2Access(ctx context.Context, cfg *rest.Config) error {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	labels := map[string]string{LabelManagedBy: managedByValue}
	group := []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: AllServiceAccounts}}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: V2LeaseNamespace, Labels: labels}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", V2LeaseNamespace, err)
	}
	for _, r := range V2LeaseRoles() {
		if _, err := client.RbacV1().Roles(V2LeaseNamespace).Create(ctx, r, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating Role %s: %w", r.Name, err)
		}
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: V2LeaseRole, Namespace: V2LeaseNamespace, Labels: labels},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: V2LeaseRole},
		Subjects:   group,
	}
	if _, err := client.RbacV1().RoleBindings(V2LeaseNamespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating RoleBinding %s: %w", rb.Name, err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: V2KonnectorClusterRole, Labels: labels},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: V2KonnectorClusterRole},
		Subjects:   group,
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ClusterRoleBinding %s: %w", crb.Name, err)
	}
	return nil
}
