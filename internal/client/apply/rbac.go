package apply

import (
	"slices"
	"sort"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GroupResource is a bound API: resource (plural) in group.
type GroupResource struct {
	Group    string `json:"group"`
	Resource string `json:"resource"`
}

// Name is <resource>.<group>: the name of the APIServiceBinding, the
// APIServiceExportRequest and the CRD of the API.
func (g GroupResource) Name() string { return g.Resource + "." + g.Group }

// konnectorClusterRole is what the released konnector needs cluster-wide,
// and no more (docs/client.md explains each rule). Unlike the released
// CLI's "*" on "*/*", the bound APIs are named one by one: bound lists
// every API bound in this cluster, so each bind rewrites the role with the
// union of old and new bindings.
//
//   - CRDs: it installs the APIServiceBinding CRD at start and creates the
//     CRD of each bound API; it may change only those.
//   - APIServiceBindings: it reads them, adds finalizers, writes status.
//   - namespaces: it watches them to sync namespaced objects.
//   - events: it records events about what it syncs.
//   - secrets, list and watch only: its informer of Secrets is
//     cluster-wide (a limit of the released konnector: it then reads only
//     the kubeconfig Secrets in kube-bind, where the Role lets it change
//     them).
//   - the bound APIs: it syncs spec to the provider and status back, and
//     removes finalizers and objects deleted upstream.
func konnectorClusterRole(bound []GroupResource) *rbacv1.ClusterRole {
	crdNames := []string{BindingCRDName}
	for _, b := range bound {
		crdNames = append(crdNames, b.Name())
	}
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, Verbs: []string{"get", "list", "watch", "create"}},
		{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, ResourceNames: crdNames, Verbs: []string{"update", "patch"}},
		{APIGroups: []string{"kube-bind.io"}, Resources: []string{"apiservicebindings"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
		{APIGroups: []string{"kube-bind.io"}, Resources: []string{"apiservicebindings/status"}, Verbs: []string{"get", "update", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "update", "patch"}},
	}
	byGroup := map[string][]string{}
	for _, b := range bound {
		byGroup[b.Group] = append(byGroup[b.Group], b.Resource)
	}
	groups := make([]string, 0, len(byGroup))
	for g := range byGroup {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	for _, g := range groups {
		res := dedupSorted(byGroup[g])
		status := make([]string, len(res))
		for i, r := range res {
			status[i] = r + "/status"
		}
		rules = append(rules,
			rbacv1.PolicyRule{APIGroups: []string{g}, Resources: res, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			rbacv1.PolicyRule{APIGroups: []string{g}, Resources: status, Verbs: []string{"get", "update", "patch"}},
		)
	}
	return &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: KonnectorRoleName, Labels: managedLabels()},
		Rules:      rules,
	}
}

// konnectorRole is what the konnector needs in kube-bind only: the
// kubeconfig Secrets (it reads them and copies the provider's newer copy
// over them) and its leader-election Lease.
func konnectorRole() *rbacv1.Role {
	return &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: metav1.ObjectMeta{Name: KonnectorRoleName, Namespace: Namespace, Labels: managedLabels()},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "update", "patch"}},
		},
	}
}

func dedupSorted(in []string) []string {
	slices.Sort(in)
	return slices.Compact(in)
}

// konnectorClusterRoleV1alpha2 is what konnector v0.8 needs cluster-wide,
// read from its source and checked by the consumer test (docs/client.md
// explains each rule):
//
//   - CRDs: its informer watches all; at start it creates or updates the
//     APIServiceBinding and APIServiceBindingBundle CRDs and waits for
//     them, then creates the CRD of each bound API from the provider's
//     BoundSchemas. Create cannot be limited by name; update only those.
//   - APIServiceBindings: it reads them, patches finalizers, conditions,
//     the bound schemas and the claims into their status. It creates or
//     deletes bindings only for APIServiceBindingBundles, which this
//     client does not make: no create or delete.
//   - APIServiceBindingBundles: its informer lists them and it patches
//     the status of any there is.
//   - namespaces: it watches them; it creates one only for a namespace
//     the provider asks for (a request's spec.namespaces).
//   - secrets, list and watch: its Secret informer is cluster-wide (the
//     Role lets it change those in kube-bind only).
//   - the bound APIs and the claimed resources: it syncs them both ways.
//
// It records no events.
func konnectorClusterRoleV1alpha2(bs boundState) *rbacv1.ClusterRole {
	crdNames := []string{BindingCRDName, BundleCRDName}
	for _, b := range bs.bound {
		crdNames = append(crdNames, b.Name())
	}
	nsVerbs := []string{"get", "list", "watch"}
	if bs.namespaces {
		nsVerbs = append(nsVerbs, "create")
	}
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, Verbs: []string{"get", "list", "watch", "create"}},
		{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, ResourceNames: crdNames, Verbs: []string{"update", "patch"}},
		{APIGroups: []string{"kube-bind.io"}, Resources: []string{"apiservicebindings", "apiservicebindingbundles"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
		{APIGroups: []string{"kube-bind.io"}, Resources: []string{"apiservicebindings/status", "apiservicebindingbundles/status"}, Verbs: []string{"get", "update", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: nsVerbs},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list", "watch"}},
	}
	rules = append(rules, resourceRules(bs.bound, true)...)
	rules = append(rules, resourceRules(bs.claims, false)...)
	return &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: KonnectorRoleName, Labels: managedLabels()},
		Rules:      rules,
	}
}

// resourceRules grants syncing grs, grouped by API group, with their
// status subresource when withStatus.
func resourceRules(grs []GroupResource, withStatus bool) []rbacv1.PolicyRule {
	byGroup := map[string][]string{}
	for _, b := range grs {
		byGroup[b.Group] = append(byGroup[b.Group], b.Resource)
	}
	groups := make([]string, 0, len(byGroup))
	for g := range byGroup {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	var rules []rbacv1.PolicyRule
	for _, g := range groups {
		res := dedupSorted(byGroup[g])
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{g}, Resources: res, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}})
		if withStatus {
			status := make([]string, len(res))
			for i, r := range res {
				status[i] = r + "/status"
			}
			rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{g}, Resources: status, Verbs: []string{"get", "update", "patch"}})
		}
	}
	return rules
}

// konnectorRoleV1alpha2 is what konnector v0.8 needs in kube-bind only:
// the kubeconfig Secrets (it reads them, and writes the provider's newer
// copy over the consumer's, creating it if gone) and its leader-election
// Lease.
func konnectorRoleV1alpha2() *rbacv1.Role {
	return &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: metav1.ObjectMeta{Name: KonnectorRoleName, Namespace: Namespace, Labels: managedLabels()},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
		},
	}
}
