package heartbeats

import (
	"context"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
)

// byConsumer indexes the cached Leases by their stamp, the consumer
// namespace the admission policy attributed them to.
const byConsumer = "leaseConsumer"

// setupLeases indexes the Leases and returns the source that queues a
// binding's reconcile when a Lease stamped with its namespace changes.
func (r *run) setupLeases(m *kbmanager.Manager) (source.Source, error) {
	err := m.GetFieldIndexer().IndexField(context.Background(), &coordinationv1.Lease{}, byConsumer, func(o client.Object) []string {
		if ns := o.GetLabels()[binding.LabelLeaseConsumer]; ns != "" {
			return []string{ns}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	src := kbmanager.Watch(m, &coordinationv1.Lease{}, func(_ context.Context, l *coordinationv1.Lease) []reconcile.Request {
		ns := l.Labels[binding.LabelLeaseConsumer]
		if ns == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: ns, Name: binding.ClusterBindingName}}}
	})
	return src, nil
}

// seenLeases remembers when this term first saw each version of a Lease:
// the backend's own clock, which a consumer cannot set.
type seenLeases struct {
	mu sync.Mutex
	m  map[client.ObjectKey]seenVersion
}

type seenVersion struct {
	resourceVersion string
	at              time.Time
}

// at returns when l's version was first seen, now if not before.
func (s *seenLeases) at(l *coordinationv1.Lease, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[client.ObjectKey]seenVersion{}
	}
	k := client.ObjectKeyFromObject(l)
	if v, ok := s.m[k]; ok && v.resourceVersion == l.ResourceVersion {
		return v.at
	}
	s.m[k] = seenVersion{resourceVersion: l.ResourceVersion, at: now}
	return now
}

// leaseHeartbeat is the newest heartbeat among the Leases stamped with
// ns. A renewal counts from the earlier of its renewTime (the consumer's
// clock) and the moment this term first saw it (the backend's): a
// consumer clock ahead earns nothing, and after a restart an old Lease
// is as old as its renewTime says. Its interval is the Lease's
// leaseDurationSeconds.
func (r *run) leaseHeartbeat(ctx context.Context, ns string, now time.Time) (Heartbeat, error) {
	if r.cfg.NoLeases {
		return Heartbeat{}, nil
	}
	var list coordinationv1.LeaseList
	if err := r.cache.List(ctx, &list, client.InNamespace(binding.V2LeaseNamespace), client.MatchingFields{byConsumer: ns}); err != nil {
		return Heartbeat{}, err
	}
	var hb Heartbeat
	for i := range list.Items {
		l := &list.Items[i]
		if l.Labels[binding.LabelLeaseConsumer] != ns || l.Spec.RenewTime == nil {
			continue
		}
		last := l.Spec.RenewTime.Time
		if seen := r.seen.at(l, now); seen.Before(last) {
			last = seen
		}
		if !last.After(hb.Last) {
			continue
		}
		hb = Heartbeat{Last: last, Tolerance: r.cfg.LeaseTolerance}
		if d := l.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
			hb.Interval = time.Duration(*d) * time.Second
		}
	}
	return hb, nil
}

// heartbeat is the binding's newest heartbeat: the v0.8 konnector's on
// the ClusterBinding, or a renewal of a v2 konnector's Lease.
func (r *run) heartbeat(ctx context.Context, hb Heartbeat, ns string, now time.Time) (Heartbeat, error) {
	lease, err := r.leaseHeartbeat(ctx, ns, now)
	if err != nil {
		return Heartbeat{}, err
	}
	if lease.Last.After(hb.Last) {
		return lease, nil
	}
	return hb, nil
}
