package exportrequests

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// LabelAPIServiceNamespace is, on a namespace made for an
// APIServiceNamespace, that object's name (a DNS label, so a valid label
// value); binding.LabelConsumerNamespace names the consumer namespace.
const LabelAPIServiceNamespace = kbmanager.LabelAPIServiceNamespace

var nameEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// ChildNamespaceName is the provider namespace of APIServiceNamespace name
// in consumer namespace consumerNS: the prefix and 16 characters of a hash
// of both (length-prefixed, with a domain tag so it never equals a
// consumer namespace's hash). Deterministic, so two replicas or two passes
// race on one Create; at most 47+16 characters.
func ChildNamespaceName(prefix, consumerNS, name string) string {
	h := sha256.New()
	for _, part := range []string{"apiservicenamespace", consumerNS, name} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	return prefix + nameEncoding.EncodeToString(h.Sum(nil))[:16]
}

// errOwnedByOther: a namespace of the derived name belongs to something else.
var errOwnedByOther = errors.New("namespace exists and belongs to another owner")

// ensureRequestedNamespaces creates the APIServiceNamespaces the succeeded
// requests of consumerNS ask for (spec.namespaces); the konnector creates
// the others. They are never deleted here: the konnector may own them.
func (r *run) ensureRequestedNamespaces(ctx context.Context, consumerNS string, exports []*wantedExport) error {
	apiNS, err := r.inNamespace(ctx, kbmanager.APIServiceNamespace, consumerNS)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, a := range apiNS {
		have[a.GetName()] = true
	}
	for _, w := range exports {
		for _, n := range w.spec.Namespaces {
			if have[n.Name] {
				continue
			}
			have[n.Name] = true
			obj := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": kbresources.APIServiceNamespacesV1alpha2.GroupVersion().String(),
				"kind":       "APIServiceNamespace",
				"metadata": map[string]any{
					"name":   n.Name,
					"labels": map[string]any{binding.LabelManagedBy: binding.ManagedByValue},
				},
				"spec": map[string]any{},
			}}
			_, err := r.dynamic.Resource(kbresources.APIServiceNamespacesV1alpha2).Namespace(consumerNS).
				Create(ctx, obj, metav1.CreateOptions{FieldManager: fieldManager})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("creating APIServiceNamespace %s/%s of export %s: %w", consumerNS, n.Name, w.name, err)
			}
			r.log.Info("exports: APIServiceNamespace created for a request", "namespace", consumerNS,
				"apiservicenamespace", n.Name, "export", w.name)
		}
	}
	return nil
}

// syncAPIServiceNamespaces makes a namespace for each APIServiceNamespace
// of consumerNS, grants the consumer its bound resources and its claimed
// ones there, reports the name in status.namespace, and deletes the
// namespaces whose APIServiceNamespace is gone.
func (r *run) syncAPIServiceNamespaces(ctx context.Context, consumerNS string, rules, claims []rbacv1.PolicyRule) error {
	apiNS, err := r.inNamespace(ctx, kbmanager.APIServiceNamespace, consumerNS)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	var later *requeueAfter
	for _, a := range apiNS {
		if a.GetDeletionTimestamp() != nil {
			continue
		}
		keep[a.GetName()] = true
		child := ChildNamespaceName(r.cfg.NamespacePrefix, consumerNS, a.GetName())
		terminating, err := r.ensureChild(ctx, consumerNS, a.GetName(), child)
		if errors.Is(err, errOwnedByOther) {
			r.log.Error("exports: cannot make the namespace of an APIServiceNamespace", "namespace", consumerNS,
				"apiservicenamespace", a.GetName(), "provider_namespace", child, "error", err)
			continue
		}
		if err != nil {
			return err
		}
		if terminating {
			later = &requeueAfter{d: 2 * time.Second, reason: "namespace " + child + " is still being deleted"}
			continue
		}
		if granted, err := r.backendGranted(ctx, child); err != nil || !granted {
			if err == nil {
				err = r.cfg.GrantBackend(ctx, child)
			}
			if err != nil {
				return err
			}
		}
		if err := r.applyConsumerRBAC(ctx, child, consumerNS, ConsumerExportsRole, rules); err != nil {
			return fmt.Errorf("granting the consumer its resources in %s: %w", child, err)
		}
		if err := r.applyConsumerRBAC(ctx, child, consumerNS, ConsumerClaimsRole, claims); err != nil {
			return fmt.Errorf("granting the consumer its claimed resources in %s: %w", child, err)
		}
		if have, _, _ := unstructured.NestedString(a.Object, "status", "namespace"); have != child {
			patch, _ := json.Marshal(map[string]any{"status": map[string]any{"namespace": child}})
			_, err := r.dynamic.Resource(kbresources.APIServiceNamespacesV1alpha2).Namespace(consumerNS).
				Patch(ctx, a.GetName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager}, "status")
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("setting the status of APIServiceNamespace %s/%s: %w", consumerNS, a.GetName(), err)
			}
			r.log.Info("exports: APIServiceNamespace ready", "namespace", consumerNS, "apiservicenamespace", a.GetName(),
				"provider_namespace", child, "since_creation", time.Since(a.GetCreationTimestamp().Time).Round(time.Millisecond).String())
		}
	}
	if err := r.removeChildren(ctx, consumerNS, keep); err != nil {
		return err
	}
	if later != nil {
		return later
	}
	return nil
}

// backendGranted says whether the cache holds the RoleBinding that gives
// the backend its namespace role in ns.
func (r *run) backendGranted(ctx context.Context, ns string) (bool, error) {
	list := &rbacv1.RoleBindingList{}
	if err := r.cache.List(ctx, list, client.InNamespace(ns)); err != nil {
		return false, err
	}
	for _, rb := range list.Items {
		if rb.RoleRef.Kind == "ClusterRole" && rb.RoleRef.Name == binding.BackendNamespaceClusterRole && rb.DeletionTimestamp == nil {
			return true, nil
		}
	}
	return false, nil
}

// ensureChild creates the namespace of an APIServiceNamespace, or finds
// it; it says whether it is still terminating from an earlier deletion.
func (r *run) ensureChild(ctx context.Context, consumerNS, name, child string) (terminating bool, err error) {
	owned := func(ns *corev1.Namespace) error {
		if ns.Labels[binding.LabelManagedBy] != binding.ManagedByValue ||
			ns.Labels[binding.LabelConsumerNamespace] != consumerNS || ns.Labels[LabelAPIServiceNamespace] != name {
			return fmt.Errorf("%w: %s", errOwnedByOther, ns.Name)
		}
		return nil
	}
	ns, err := r.namespace(ctx, child)
	if err != nil {
		return false, err
	}
	if ns != nil {
		return ns.DeletionTimestamp != nil, owned(ns)
	}
	want := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: child,
		Labels: map[string]string{
			binding.LabelManagedBy:         binding.ManagedByValue,
			binding.LabelConsumerNamespace: consumerNS,
			LabelAPIServiceNamespace:       name,
		},
	}}
	_, err = r.kube.CoreV1().Namespaces().Create(ctx, want, metav1.CreateOptions{FieldManager: fieldManager})
	if err == nil {
		r.log.Info("exports: namespace made for APIServiceNamespace", "namespace", consumerNS, "apiservicenamespace", name,
			"provider_namespace", child)
		return false, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return false, fmt.Errorf("creating namespace %s for APIServiceNamespace %s/%s: %w", child, consumerNS, name, err)
	}
	have, err := r.kube.CoreV1().Namespaces().Get(ctx, child, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("reading namespace %s: %w", child, err)
	}
	return have.DeletionTimestamp != nil, owned(have)
}

// removeChildren deletes the namespaces made for APIServiceNamespaces of
// consumerNS whose name is not in keep (nil: all of them).
func (r *run) removeChildren(ctx context.Context, consumerNS string, keep map[string]bool) error {
	children := &corev1.NamespaceList{}
	if err := r.cache.List(ctx, children, client.MatchingFields{kbmanager.IndexConsumerNamespace: consumerNS}); err != nil {
		return err
	}
	for i := range children.Items {
		ns := &children.Items[i]
		if ns.DeletionTimestamp != nil || keep[ns.Labels[LabelAPIServiceNamespace]] {
			continue
		}
		wanted, err := r.stillWanted(ctx, consumerNS, ns.Labels[LabelAPIServiceNamespace], keep == nil)
		if err != nil {
			return err
		}
		if wanted {
			// The cache lags the cluster; the APIServiceNamespace's own
			// event brings this namespace back here.
			continue
		}
		uid := ns.UID
		err = r.kube.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting namespace %s of APIServiceNamespace %s/%s: %w", ns.Name, consumerNS,
				ns.Labels[LabelAPIServiceNamespace], err)
		}
		r.log.Info("exports: namespace of a removed APIServiceNamespace deleted", "namespace", consumerNS,
			"apiservicenamespace", ns.Labels[LabelAPIServiceNamespace], "provider_namespace", ns.Name)
	}
	return nil
}

// stillWanted reads the API server, not the caches, before a namespace
// made for APIServiceNamespace name of consumerNS is deleted: the caches
// of namespaces and of APIServiceNamespaces are filled by separate
// watches, and during a leader handover another controller may have made
// the namespace for an APIServiceNamespace this one has not seen yet. A
// namespace is wanted while its APIServiceNamespace exists (whole: while
// consumerNS is still a consumer's namespace).
func (r *run) stillWanted(ctx context.Context, consumerNS, name string, whole bool) (bool, error) {
	if whole {
		ns, err := r.kube.CoreV1().Namespaces().Get(ctx, consumerNS, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("reading namespace %s: %w", consumerNS, err)
		}
		if ns.DeletionTimestamp != nil || !binding.IsConsumerNamespace(ns) {
			return false, nil
		}
	}
	a, err := r.dynamic.Resource(kbresources.APIServiceNamespacesV1alpha2).Namespace(consumerNS).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading APIServiceNamespace %s/%s: %w", consumerNS, name, err)
	}
	return a.GetDeletionTimestamp() == nil, nil
}
