package cleanup

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Values of the action label of kube_bind_backend_gc_bindings_total.
const (
	actionDeleted     = "deleted"
	actionWouldDelete = "would_delete"
)

type metrics struct {
	gc      *prometheus.CounterVec
	revoked prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		gc: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kube_bind_backend", Name: "gc_bindings_total",
			Help: "Unused bindings garbage-collected (action deleted) or, with --gc-dry-run, found (action would_delete), " +
				"by reason (incomplete: a bind cut short; undelivered: a response never handed out).",
		}, []string{"action", "reason"}),
		revoked: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kube_bind_backend", Name: "revoked_bindings_total",
			Help: "Consumers unbound because the provider labelled their namespace kube-bind.io/revoked=true.",
		}),
	}
	for _, a := range []string{actionDeleted, actionWouldDelete} {
		for _, r := range []string{ReasonIncomplete, ReasonUndelivered} {
			m.gc.WithLabelValues(a, r)
		}
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.gc, m.revoked} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("cleanup: registering metrics: %w", err)
			}
		}
	}
	return m, nil
}
