package cleanup

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// Why an unused binding is collected (the reason label of the metric).
const (
	// ReasonIncomplete: the bind was cut short (a crash, an API server
	// outage) and nobody finished it: no ClusterBinding, the last step.
	ReasonIncomplete = "incomplete"
	// ReasonUndelivered: the bind completed but its response was never
	// handed out (the browser closed before the poll, the CLI gone).
	ReasonUndelivered = "undelivered"
)

// usage is what the garbage collection knows of a consumer namespace.
type usage struct {
	created time.Time // the namespace's creation
	// complete: ClusterBinding "cluster" exists; provisionedAt is its
	// AnnotationProvisionedAt (zero when absent: made by an older backend).
	complete      bool
	provisionedAt time.Time
	delivered     bool // AnnotationDeliveredAt is set
	heartbeat     bool // a konnector wrote status.lastHeartbeatTime
	used          bool // the consumer created a request or an APIServiceNamespace
}

// verdict says whether and from when a namespace may be collected.
type verdict struct {
	reason string    // "" = never (used, delivered, or cannot tell)
	at     time.Time // when it may be collected
}

// decide applies the rules of docs/binding.md, "Garbage collection":
// never a binding whose konnector heartbeated or whose credentials were
// used, never a delivered complete one, never one whose completion time
// is unknown; a complete one after GCAfter from its completion; a
// half-made one after GCAfter from the namespace's creation.
func decide(u usage, after time.Duration) verdict {
	switch {
	case u.heartbeat || u.used:
		return verdict{}
	case !u.complete:
		return verdict{reason: ReasonIncomplete, at: u.created.Add(after)}
	case u.delivered || u.provisionedAt.IsZero():
		return verdict{}
	}
	return verdict{reason: ReasonUndelivered, at: u.provisionedAt.Add(after)}
}

// usageOf reads the facts from a ClusterBinding (nil: none) and whether
// requests or APIServiceNamespaces exist.
func usageOf(ns *corev1.Namespace, cb *unstructured.Unstructured, used bool) usage {
	u := usage{created: ns.CreationTimestamp.Time, used: used}
	if cb == nil || cb.GetDeletionTimestamp() != nil {
		return u
	}
	u.complete = true
	a := cb.GetAnnotations()
	if t, err := time.Parse(time.RFC3339, a[binding.AnnotationProvisionedAt]); err == nil {
		u.provisionedAt = t
	}
	u.delivered = a[binding.AnnotationDeliveredAt] != ""
	if s, _, _ := unstructured.NestedString(cb.Object, "status", "lastHeartbeatTime"); s != "" {
		u.heartbeat = true
	}
	return u
}

// collect deletes (or, in a dry run, reports) an unused binding that is
// old enough, and otherwise says when to look again.
func (r *run) collect(ctx context.Context, ns *corev1.Namespace) (time.Duration, error) {
	cached, err := r.cachedUsage(ctx, ns)
	if err != nil {
		return 0, err
	}
	v := decide(cached, r.cfg.GCAfter)
	if v.reason == "" {
		return 0, nil
	}
	if wait := v.at.Sub(r.cfg.Clock.Now()); wait > 0 {
		return wait + 100*time.Millisecond, nil
	}
	// The caches may lag: decide again from the API server.
	live, err := r.liveUsage(ctx, ns)
	if err != nil {
		return 0, err
	}
	if v = decide(live, r.cfg.GCAfter); v.reason == "" {
		return 0, nil
	}
	if wait := v.at.Sub(r.cfg.Clock.Now()); wait > 0 {
		return wait + 100*time.Millisecond, nil
	}
	age := r.cfg.Clock.Since(ns.CreationTimestamp.Time).Round(time.Second).String()
	if r.cfg.DryRun {
		if r.once(r.dryRunReported, ns) {
			r.metrics.gc.WithLabelValues(actionWouldDelete, v.reason).Inc()
			r.log.Info("cleanup: garbage collection (dry run): would delete an unused binding", "namespace", ns.Name,
				"reason", v.reason, "consumer", consumerOf(ns), "age", age)
		}
		return 0, nil
	}
	err = r.cfg.Unbinder.UnbindNamespace(ctx, ns.Name, ns.UID)
	if errors.Is(err, binding.ErrNotBound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("garbage-collecting %s: %w", ns.Name, err)
	}
	r.once(r.removed, ns)
	r.metrics.gc.WithLabelValues(actionDeleted, v.reason).Inc()
	r.log.Info("cleanup: garbage collection: deleted an unused binding", "namespace", ns.Name, "reason", v.reason,
		"consumer", consumerOf(ns), "age", age)
	return 0, nil
}

func (r *run) cachedUsage(ctx context.Context, ns *corev1.Namespace) (usage, error) {
	cb, err := kbmanager.Get(ctx, r.cache, kbmanager.ClusterBinding, client.ObjectKey{Namespace: ns.Name, Name: binding.ClusterBindingName})
	if client.IgnoreNotFound(err) != nil {
		return usage{}, err
	}
	used := false
	for _, gvk := range []schema.GroupVersionKind{kbmanager.ExportRequest, kbmanager.APIServiceNamespace} {
		list, err := kbmanager.List(ctx, r.cache, gvk, client.InNamespace(ns.Name))
		if err != nil {
			return usage{}, err
		}
		used = used || len(list) > 0
	}
	return usageOf(ns, cb, used), nil
}

func (r *run) liveUsage(ctx context.Context, ns *corev1.Namespace) (usage, error) {
	cbs, err := r.dynamic.Resource(kbresources.ClusterBindings).Namespace(ns.Name).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", binding.ClusterBindingName).String(),
	})
	if err != nil {
		return usage{}, fmt.Errorf("reading the ClusterBinding of %s: %w", ns.Name, err)
	}
	var cb *unstructured.Unstructured
	if len(cbs.Items) > 0 {
		cb = &cbs.Items[0]
	}
	used := false
	for _, gvr := range []schema.GroupVersionResource{kbresources.APIServiceExportRequests, kbresources.APIServiceNamespaces} {
		list, err := r.dynamic.Resource(gvr).Namespace(ns.Name).List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return usage{}, fmt.Errorf("reading the %s of %s: %w", gvr.Resource, ns.Name, err)
		}
		used = used || len(list.Items) > 0
	}
	return usageOf(ns, cb, used), nil
}
