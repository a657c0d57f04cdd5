package binding

import (
	"context"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Names of the ClusterRoles the backend works with. The Helm chart ships
// them with exactly these names (see docs/binding.md).
const (
	// ConsumerClusterRole is what a consumer's service account may do,
	// granted only in its own provider namespace by a RoleBinding.
	ConsumerClusterRole = "kube-bind-consumer"
	// BackendNamespaceClusterRole is what the backend needs inside a
	// consumer namespace; the backend binds it to itself there right after
	// creating the namespace, so it never needs these rights cluster-wide.
	BackendNamespaceClusterRole = "kube-bind-backend-namespace"
	// BackendClusterRole is the backend's cluster-wide role, bound to its
	// service account by a ClusterRoleBinding.
	BackendClusterRole = "kube-bind-backend"
	// ConsumerExportsRole and ConsumerClaimsRole name the Roles (and their
	// RoleBindings) the controllers make in the backend's namespaces for a
	// consumer's bound and claimed resources (internal/binding/controllers/exportrequests).
	ConsumerExportsRole = "kube-bind-consumer-exports"
	ConsumerClaimsRole  = "kube-bind-consumer-claims"
)

const kubeBindGroup = "kube-bind.io"

// ClusterRoles returns the ClusterRoles, as the chart must create them.
func ClusterRoles() []*rbacv1.ClusterRole {
	role := func(name string, rules ...rbacv1.PolicyRule) *rbacv1.ClusterRole {
		return &rbacv1.ClusterRole{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelManagedBy: managedByValue}},
			Rules:      rules,
		}
	}
	rule := func(group string, resources []string, verbs ...string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{group}, Resources: resources, Verbs: verbs}
	}
	return []*rbacv1.ClusterRole{
		role(BackendClusterRole,
			// The catalog's informer.
			rule("apiextensions.k8s.io", []string{"customresourcedefinitions"}, "get", "list", "watch"),
			// One namespace per consumer, and one per APIServiceNamespace;
			// names are not known in advance. list and watch: the
			// controllers (internal/binding/controllers/exportrequests) keep the backend's namespaces
			// in a cache and remove those whose owner is gone, without
			// finalizers that could block a consumer's namespace deletion.
			rule("", []string{"namespaces"}, "get", "list", "watch", "create", "delete"),
			// The first RoleBinding in a new namespace (granting the backend
			// BackendNamespaceClusterRole there) must be created before the
			// backend has any right in that namespace.
			rule("rbac.authorization.k8s.io", []string{"rolebindings"}, "create"),
			// Lets the backend grant exactly these two roles without
			// holding their rights itself (RBAC escalation check).
			rbacv1.PolicyRule{
				APIGroups:     []string{"rbac.authorization.k8s.io"},
				Resources:     []string{"clusterroles"},
				Verbs:         []string{"bind"},
				ResourceNames: []string{ConsumerClusterRole, BackendNamespaceClusterRole},
			},
			// Finding its own user name, to bind roles to itself.
			rule("authentication.k8s.io", []string{"selfsubjectreviews"}, "create"),
			// The controllers' caches (internal/binding/controllers/exportrequests, heartbeats,
			// cleanup, credentials); every write to these is made through
			// BackendNamespaceClusterRole, in the backend's namespaces only.
			rule(kubeBindGroup, []string{"apiserviceexportrequests", "apiserviceexports", "apiservicenamespaces", "clusterbindings", "boundschemas"}, "list", "watch"),
			// The controllers' cache of the consumers' Roles and
			// RoleBindings (only the backend's, by label), compared with
			// what they should be instead of applied again.
			rule("rbac.authorization.k8s.io", []string{"roles", "rolebindings"}, "list", "watch"),
			// The offers (internal/binding/offers): the provider's templates and
			// collections, and the Ready condition of each template.
			rule(kubeBindGroup, []string{"apiserviceexporttemplates", "collections"}, "get", "list", "watch"),
			rule(kubeBindGroup, []string{"apiserviceexporttemplates/status"}, "patch", "update"),
		),
		role(BackendNamespaceClusterRole,
			rule("", []string{"serviceaccounts", "secrets"}, "get", "create", "patch", "delete"),
			// Consumer credentials (internal/binding/controllers/credentials): list the
			// per-token Secrets and issue TokenRequest tokens bound to
			// them (the CredentialsValid condition is written through the
			// clusterbindings/status rule below).
			rule("", []string{"secrets"}, "list"),
			rule("", []string{"serviceaccounts/token"}, "create"),
			rule("", []string{"resourcequotas"}, "get", "create", "patch"),
			rule("rbac.authorization.k8s.io", []string{"rolebindings"}, "get", "create", "patch"),
			rule(kubeBindGroup, []string{"clusterbindings"}, "get", "create", "patch"),
			// Answering requests and APIServiceNamespaces; the Healthy and
			// CredentialsValid conditions of ClusterBindings
			// (internal/binding/controllers/heartbeats, internal/binding/controllers/credentials).
			rule(kubeBindGroup, []string{"apiserviceexportrequests/status", "apiservicenamespaces/status", "clusterbindings/status"}, "patch"),
			// Mirroring exported CRDs.
			rule(kubeBindGroup, []string{"apiserviceexports"}, "create", "patch", "delete"),
			// The requests of a consumer whose konnector makes none (kbind
			// v2, RequestAPIs).
			rule(kubeBindGroup, []string{"apiserviceexportrequests"}, "create"),
			// The schemas of the bound resources for konnector v0.8, and
			// the APIServiceNamespaces a request's spec.namespaces asks for.
			rule(kubeBindGroup, []string{"boundschemas"}, "get", "create", "patch", "update", "delete"),
			rule(kubeBindGroup, []string{"apiservicenamespaces"}, "get", "create", "patch"),
			// The consumer's rights on the resources it bound: a Role of
			// exactly those resources, which the backend does not hold
			// itself. escalate and bind only for the two Roles it makes, by
			// name (it applies them with their name in the URL): no other
			// Role, and no ClusterRole, can carry rights it lacks.
			rule("rbac.authorization.k8s.io", []string{"roles"}, "create", "patch"),
			rbacv1.PolicyRule{
				APIGroups:     []string{"rbac.authorization.k8s.io"},
				Resources:     []string{"roles"},
				Verbs:         []string{"escalate", "bind"},
				ResourceNames: []string{ConsumerExportsRole, ConsumerClaimsRole},
			},
		),
		role(ConsumerClusterRole,
			rule(kubeBindGroup, []string{"apiserviceexportrequests", "apiservicenamespaces"},
				"create", "delete", "patch", "update", "get", "list", "watch"),
			rule("", []string{"namespaces"}, "get"),
			rule("", []string{"secrets"}, "get", "list", "watch"),
			rule(kubeBindGroup, []string{"clusterbindings", "apiserviceexports"}, "get", "list", "watch"),
			rule(kubeBindGroup, []string{"clusterbindings/status", "apiserviceexports/status"}, "get", "patch", "update"),
			// Konnector v0.8 makes the consumer's CRDs from BoundSchemas
			// and reports on them.
			rule(kubeBindGroup, []string{"boundschemas"}, "get", "list", "watch"),
			rule(kubeBindGroup, []string{"boundschemas/status"}, "get", "patch", "update"),
		),
		// A kbind v2 konnector reads these before it heartbeats (it stops
		// at the first Forbidden): the provider's identity, and the CRDs
		// it finds exported APIs among, whose schemas discovery and
		// /openapi/v3 show every authenticated user anyway.
		role(V2KonnectorClusterRole,
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}, ResourceNames: []string{"kube-system"}},
			rule("apiextensions.k8s.io", []string{"customresourcedefinitions"}, "get", "list", "watch"),
		),
	}
}

// InstallClusterRoles creates or updates the ClusterRoles, for the local
// demo and tests (the chart does this in production). It needs a
// cluster-admin-like identity.
func InstallClusterRoles(ctx context.Context, cfg *rest.Config) error {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	api := client.RbacV1().ClusterRoles()
	for _, want := range ClusterRoles() {
		_, err := api.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				have, err := api.Get(ctx, want.Name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				have.Rules = want.Rules
				_, err = api.Update(ctx, have, metav1.UpdateOptions{})
				return err
			})
		}
		if err != nil {
			return fmt.Errorf("installing ClusterRole %s: %w", want.Name, err)
		}
	}
	return nil
}
