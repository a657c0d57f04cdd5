package apply

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/dynamic"
)

// konnectorPlan is what becomes of Deployment kube-bind/konnector: the
// image that will run there and the generation it speaks.
type konnectorPlan struct {
	gen     generation
	image   string // what will run
	want    *appsv1.Deployment
	current *appsv1.Deployment // nil: none yet
	replace bool
}

// planKonnector decides, without changing anything, whether the konnector
// of the bind's generation is deployed, or the one running is kept (one
// of the same or a newer version, read from its image tag as the released
// CLI does). There is one konnector per cluster, the Deployment the
// released CLI looks for, so the two never run side by side.
func (bd *Binder) planKonnector(ctx context.Context, gen generation) (*konnectorPlan, error) {
	image := bd.o.KonnectorImage
	if image == "" {
		image = gen.konnector
	}
	kgen := konnectorGeneration(image, gen)
	p := &konnectorPlan{gen: kgen, image: image, want: konnectorDeploymentOf(kgen, image)}
	cur, err := bd.kube.AppsV1().Deployments(Namespace).Get(ctx, KonnectorName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return p, nil
	case err != nil:
		return nil, err
	}
	p.current = cur
	var running string
	if cs := cur.Spec.Template.Spec.Containers; len(cs) > 0 {
		running = cs[0].Image
	}
	if newer(image, running) {
		p.replace = true
		return p, nil
	}
	p.image = running
	p.gen = konnectorGeneration(running, gen)
	return p, nil
}

// ensureKonnectorRBAC writes the konnector's ServiceAccount, Role and
// ClusterRole for the konnector generation kgen (naming every API bound
// in this cluster, old and new) and their bindings. Objects of these names
// that this client did not make (the released CLI's) are left as they are.
func (bd *Binder) ensureKonnectorRBAC(ctx context.Context, reqs []request, kgen generation) (string, error) {
	bs, err := bd.boundState(ctx, reqs, kgen)
	if err != nil {
		return "", err
	}
	var objs []runtime.Object
	if kgen.protocol == ProtocolV1alpha2 {
		objs = []runtime.Object{konnectorRoleV1alpha2(), konnectorClusterRoleV1alpha2(bs), konnectorRoleBinding(), konnectorClusterRoleBinding()}
	} else {
		objs = []runtime.Object{konnectorRole(), konnectorClusterRole(bs.bound), konnectorRoleBinding(), konnectorClusterRoleBinding()}
	}
	// The ServiceAccount last: once it exists, so do its rights (a
	// konnector started with its token then never meets a Forbidden).
	objs = append(objs, konnectorServiceAccount())
	what := fmt.Sprintf("%d bound APIs", len(bs.bound))
	if len(bs.claims) > 0 {
		what += fmt.Sprintf(", %d claimed resources", len(bs.claims))
	}
	if bd.dryRun {
		for _, o := range objs {
			bd.plan(o)
		}
		return fmt.Sprintf("would write ServiceAccount, Role, ClusterRole (konnector %s: %s) and bindings", kgen.protocol, what), nil
	}
	var foreign []string
	for _, o := range objs {
		kept, err := bd.apply(ctx, o)
		if err != nil {
			return "", err
		}
		if kept != "" {
			foreign = append(foreign, kept)
		}
	}
	msg := fmt.Sprintf("ServiceAccount %s/%s; Role and ClusterRole %s (konnector %s: %s)", Namespace, KonnectorName, KonnectorRoleName, kgen.protocol, what)
	if len(foreign) > 0 {
		msg += "; kept " + strings.Join(foreign, ", ") + " made by another tool (their rules stand)"
	}
	return msg, nil
}

// boundState is what the konnector's ClusterRole names: every API bound
// in the cluster, every claimed resource, and whether the konnector may
// create namespaces.
type boundState struct {
	bound      []GroupResource
	claims     []GroupResource
	namespaces bool
}

// boundState collects the new requests' resources and those of the
// bindings already in the cluster: their status.boundSchemas and
// status.permissionClaims (v1alpha2), their names (<resource>.<group>,
// v1alpha1), and the CRDs an APIServiceBinding owns. Creating namespaces
// once granted stays granted (the requests asking for them are not kept
// in the consumer cluster).
func (bd *Binder) boundState(ctx context.Context, reqs []request, kgen generation) (boundState, error) {
	bound, claims := map[GroupResource]bool{}, map[GroupResource]bool{}
	var st boundState
	for _, r := range reqs {
		for _, gr := range r.resources {
			bound[GroupResource{Group: gr.Group, Resource: gr.Resource}] = true
		}
		for _, gr := range r.claims {
			claims[GroupResource{Group: gr.Group, Resource: gr.Resource}] = true
		}
		st.namespaces = st.namespaces || r.namespaces
	}
	list, err := bd.listBindings(ctx, kgen)
	if err != nil {
		return st, fmt.Errorf("listing APIServiceBindings: %w", err)
	}
	for _, it := range list {
		schemas, _, _ := unstructured.NestedSlice(it.Object, "status", "boundSchemas")
		for _, s := range schemas {
			if gr, ok := groupResourceOf(s); ok {
				bound[gr] = true
			}
		}
		if len(schemas) == 0 {
			if gr, ok := groupResourceOfName(it.GetName()); ok {
				bound[gr] = true
			}
		}
		pcs, _, _ := unstructured.NestedSlice(it.Object, "status", "permissionClaims")
		for _, c := range pcs {
			if gr, ok := groupResourceOf(c); ok {
				claims[gr] = true
			}
		}
	}
	// The CRDs the konnector made (a binding's name need not say them).
	if crds, err := bd.crds.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{}); err == nil {
		for _, crd := range crds.Items {
			for _, ref := range crd.OwnerReferences {
				if ref.Kind == "APIServiceBinding" && strings.HasPrefix(ref.APIVersion, BindingGVR.Group+"/") {
					bound[GroupResource{Group: crd.Spec.Group, Resource: crd.Spec.Names.Plural}] = true
				}
			}
		}
	} else if !apierrors.IsForbidden(err) {
		return st, fmt.Errorf("listing CRDs: %w", err)
	}
	if !st.namespaces && kgen.protocol == ProtocolV1alpha2 {
		if cr, err := bd.kube.RbacV1().ClusterRoles().Get(ctx, KonnectorRoleName, metav1.GetOptions{}); err == nil && cr.Labels[LabelManagedBy] == managedBy {
			for _, r := range cr.Rules {
				if slices.Contains(r.Resources, "namespaces") && slices.Contains(r.Verbs, "create") {
					st.namespaces = true
				}
			}
		}
	}
	st.bound, st.claims = sortedKeys(bound), sortedKeys(claims)
	return st, nil
}

func groupResourceOf(v any) (GroupResource, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		return GroupResource{}, false
	}
	g, _ := m["group"].(string)
	r, _ := m["resource"].(string)
	if r == "" || strings.ContainsAny(g+r, "/ *") {
		return GroupResource{}, false
	}
	return GroupResource{Group: g, Resource: r}, true
}

func sortedKeys(m map[GroupResource]bool) []GroupResource {
	out := make([]GroupResource, 0, len(m))
	for gr := range m {
		out = append(out, gr)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// listBindings lists the APIServiceBindings through the version gen
// writes, or the other one while the cluster serves only that (a v0.4.8
// konnector's CRD before the swap); none when neither is served.
func (bd *Binder) listBindings(ctx context.Context, gen generation) ([]unstructured.Unstructured, error) {
	for _, gvr := range bindingVersions(gen) {
		list, err := bd.dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		if err == nil {
			return list.Items, nil
		}
		if !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
			return nil, err
		}
	}
	return nil, nil
}

// getBinding reads APIServiceBinding name through either served version
// (the fields this client reads are the same in both); nil when there is
// none.
func (bd *Binder) getBinding(ctx context.Context, name string, gen generation) (*unstructured.Unstructured, error) {
	for _, gvr := range bindingVersions(gen) {
		got, err := bd.dyn.Resource(gvr).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return got, nil
		}
		if !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
			return nil, err
		}
	}
	return nil, nil
}

func bindingVersions(gen generation) []schema.GroupVersionResource {
	if gen.protocol == ProtocolV1alpha2 {
		return []schema.GroupVersionResource{BindingV1alpha2GVR, BindingGVR}
	}
	return []schema.GroupVersionResource{BindingGVR, BindingV1alpha2GVR}
}

// ensureKonnector carries out planKonnector's plan.
func (bd *Binder) ensureKonnector(ctx context.Context, p *konnectorPlan) (string, error) {
	deployments := bd.kube.AppsV1().Deployments(Namespace)
	switch {
	case p.current == nil:
		if bd.dryRun {
			bd.plan(p.want)
			return "would deploy " + p.image, nil
		}
		if _, err := deployments.Create(ctx, p.want, metav1.CreateOptions{}); err != nil {
			return "", err
		}
		return "deployed " + p.image, nil
	case !p.replace:
		return "kept " + p.image + " (same or newer)", nil
	}
	running := p.current.Spec.Template.Spec.Containers[0].Image
	if bd.dryRun {
		bd.plan(p.want)
		return "would replace " + running + " by " + p.image, nil
	}
	cur := p.current.DeepCopy()
	cur.Spec = p.want.Spec
	if cur.Labels == nil {
		cur.Labels = map[string]string{}
	}
	for k, v := range p.want.Labels {
		cur.Labels[k] = v
	}
	if _, err := deployments.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return "", err
	}
	return "replaced " + running + " by " + p.image, nil
}

// newer reports whether image want should replace image running: when the
// tags are versions, only if want's is higher; otherwise when they differ.
func newer(want, running string) bool {
	if want == running {
		return false
	}
	wv, werr := version.ParseSemantic(tag(want))
	rv, rerr := version.ParseSemantic(tag(running))
	if werr != nil || rerr != nil {
		return true
	}
	return rv.LessThan(wv)
}

func tag(image string) string {
	if i := strings.LastIndex(image, ":"); i >= 0 && !strings.Contains(image[i:], "/") {
		return image[i+1:]
	}
	return ""
}

func (bd *Binder) waitForBindingsAPI(ctx context.Context, gen generation) (string, error) {
	served := "v0.4 or newer"
	if gen.protocol == ProtocolV1alpha2 {
		served = "v0.5 or newer"
	}
	ifNot := fmt.Sprintf("the konnector installs that CRD when it starts: are its pods running? "+
		"(kubectl -n %s get pods -l app=%s; kubectl -n %s logs deployment/%s)", Namespace, KonnectorName, Namespace, KonnectorName)
	if bd.o.SkipKonnector {
		ifNot = fmt.Sprintf("with --skip-konnector, the konnector you run must be %s and running against this cluster; "+
			"start it, or leave out --skip-konnector to deploy one", served)
	}
	var lastErr error
	err := bd.await(ctx, wait{
		what:  fmt.Sprintf("the konnector to install the CRD serving %s APIServiceBindings (konnector %s)", gen.groupVersion, served),
		ifNot: ifNot,
		seen:  func() string { return lastErr.Error() },
	}, func(ctx context.Context) (bool, error) {
		_, lastErr = bd.dyn.Resource(gen.bindingGVR).List(ctx, metav1.ListOptions{Limit: 1})
		return lastErr == nil, nil
	})
	if err != nil {
		return "", err
	}
	return "yes", nil
}

// ensureBinding creates APIServiceBinding name, or keeps the one of this
// provider, and returns it as the cluster has it.
func (bd *Binder) ensureBinding(ctx context.Context, name, secretName string, gen generation) (*unstructured.Unstructured, string, error) {
	want := bindingOf(gen, name, secretName)
	created, err := bd.dyn.Resource(gen.bindingGVR).Create(ctx, want, metav1.CreateOptions{})
	if err == nil {
		return created, "created", nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, "", err
	}
	got, err := bd.getBinding(ctx, name, gen)
	if err != nil {
		return nil, "", err
	}
	if got == nil {
		return nil, "", fmt.Errorf("APIServiceBinding %s exists but cannot be read", name)
	}
	if n, _, _ := unstructured.NestedString(got.Object, "spec", "kubeconfigSecretRef", "name"); n != secretName {
		return nil, "", fmt.Errorf("APIServiceBinding %s appeared meanwhile with Secret %s; refusing to take it over", name, n)
	}
	return got, "exists", nil
}

// apply creates o or, when it exists and this client made it, updates it
// to o (RBAC and ServiceAccounts of ours). One of the same name that
// another tool made is left alone: its name is returned.
func (bd *Binder) apply(ctx context.Context, o runtime.Object) (string, error) {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		return "", err
	}
	obj := &unstructured.Unstructured{Object: u}
	gvk := obj.GroupVersionKind()
	gvr, ok := map[string]string{"ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings",
		"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}[gvk.Kind]
	if !ok {
		return "", fmt.Errorf("consumer: apply does not know %s", gvk.Kind)
	}
	var client dynamic.ResourceInterface = bd.dyn.Resource(gvk.GroupVersion().WithResource(gvr))
	if obj.GetNamespace() != "" {
		client = bd.dyn.Resource(gvk.GroupVersion().WithResource(gvr)).Namespace(obj.GetNamespace())
	}
	cur, err := client.Get(ctx, obj.GetName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = client.Create(ctx, obj, metav1.CreateOptions{})
		return "", err
	}
	if err != nil {
		return "", err
	}
	changed := false
	for _, field := range []string{"rules", "roleRef", "subjects"} {
		if v, ok := obj.Object[field]; ok {
			cur.Object[field] = v
			changed = true
		}
	}
	if !changed {
		return "", nil // a ServiceAccount: nothing of ours to update
	}
	if cur.GetLabels()[LabelManagedBy] != managedBy {
		// The released CLI binds "*" on "*/*" under the same names;
		// narrowing it would break the bindings it made.
		return gvk.Kind + " " + obj.GetName(), nil
	}
	_, err = client.Update(ctx, cur, metav1.UpdateOptions{})
	return "", err
}
