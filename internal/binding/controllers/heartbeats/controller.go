package heartbeats

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

const fieldManager = "kube-bind-backend"

// Config configures the controller.
type Config struct {
	// Metrics, if set, gets the binding metrics (reported only while the
	// controller runs, i.e. on the replica holding the leader election
	// Lease).
	Metrics prometheus.Registerer
	// Slack is added to twice the heartbeat interval; 0 means DefaultSlack.
	Slack time.Duration
	// NoLeases: no v2 konnector's Lease is read (the backend may not
	// list them).
	NoLeases bool
	// LeaseTolerance, if positive, is how long a renewal of a v2
	// konnector's Lease counts; 0: twice its leaseDurationSeconds plus
	// Slack, as for the other heartbeats.
	LeaseTolerance time.Duration
	Logger         *slog.Logger
	// Clock is for tests; nil means the real clock.
	Clock clock.WithTicker
}

// Controller keeps the Healthy condition of every ClusterBinding the
// backend made; Setup adds it to a leadership term's manager.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	current atomic.Pointer[run] // the running term's cache, for the metrics
}

// New checks the configuration and registers the metrics; it does not
// contact the cluster.
func New(cfg Config) (*Controller, error) {
	if cfg.Slack <= 0 {
		cfg.Slack = DefaultSlack
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	c := &Controller{cfg: cfg, log: cfg.Logger}
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(collector{c}); err != nil {
			return nil, fmt.Errorf("heartbeats: registering metrics: %w", err)
		}
	}
	return c, nil
}

type run struct {
	*Controller
	cache   client.Reader
	dynamic dynamic.Interface
	seen    seenLeases
}

// Setup adds the controller to m: a reconcile per ClusterBinding (only
// those Provision made: the cache holds no other), on every change of it
// or of a Lease stamped with its namespace, and when a healthy one would
// turn stale.
func (c *Controller) Setup(m *kbmanager.Manager) error {
	r := &run{Controller: c, cache: m.GetCache(), dynamic: m.Dynamic}
	watch := kbmanager.WatchKind(m, kbmanager.ClusterBinding, func(_ context.Context, cb client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(cb)}}
	})
	sources := []source.Source{watch}
	if !c.cfg.NoLeases {
		leases, err := r.setupLeases(m)
		if err != nil {
			return err
		}
		sources = append(sources, leases)
	}
	if err := m.AddController("bindinghealth", 1, r.reconcile, sources...); err != nil {
		return err
	}
	// The metrics are the leader's, from the term's cache.
	return m.AddRunnable(func(ctx context.Context) error {
		c.current.Store(r)
		defer c.current.CompareAndSwap(r, nil)
		c.log.Info("binding health: caches synced, watching heartbeats", "slack", c.cfg.Slack.String())
		<-ctx.Done()
		return nil
	})
}

// reconcile sets the condition of one ClusterBinding and says when to look
// again: at the moment a healthy binding would turn stale.
// It reads only the cache and writes only a condition that changed: a
// heartbeat costs the leader its event.
func (r *run) reconcile(ctx context.Context, req reconcile.Request) (time.Duration, error) {
	cb, err := kbmanager.Get(ctx, r.cache, kbmanager.ClusterBinding, req.NamespacedName)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return 0, nil
		}
		return 0, err
	}
	if cb.GetDeletionTimestamp() != nil {
		return 0, nil
	}
	now := r.cfg.Clock.Now()
	hb, err := r.heartbeat(ctx, heartbeatOf(cb.Object), cb.GetNamespace(), now)
	if err != nil {
		return 0, err
	}
	v := Evaluate(hb, now, r.cfg.Slack)
	var recheck time.Duration
	if v.Healthy {
		// A little past the limit, so that the next pass sees it crossed.
		recheck = v.StaleAt.Sub(now) + 100*time.Millisecond
	}
	have := healthyCondition(cb.Object)
	status := "False"
	if v.Healthy {
		status = "True"
	}
	if have != nil && have["status"] == status && have["reason"] == v.Reason && have["message"] == v.Message &&
		stringOr(have["severity"]) == v.Severity {
		return recheck, nil
	}
	transition := now.UTC().Format(time.RFC3339)
	if have != nil && have["status"] == status {
		if t, ok := have["lastTransitionTime"].(string); ok && t != "" {
			transition = t
		}
	}
	cond := map[string]any{
		"type": ConditionHealthy, "status": status, "lastTransitionTime": transition,
		"reason": v.Reason, "message": v.Message,
	}
	if v.Severity != "" {
		cond["severity"] = v.Severity
	}
	// Server-side apply of just this condition: conditions are a map list
	// keyed by type, so the konnector's own conditions are left alone.
	apply := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kbresources.ClusterBindings.GroupVersion().String(),
		"kind":       "ClusterBinding",
		"metadata":   map[string]any{"name": cb.GetName(), "namespace": cb.GetNamespace()},
		"status":     map[string]any{"conditions": []any{cond}},
	}}
	_, err = r.dynamic.Resource(kbresources.ClusterBindings).Namespace(cb.GetNamespace()).
		Apply(ctx, cb.GetName(), apply, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}, "status")
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("applying the Healthy condition of %s: %w", req, err)
	}
	log := r.log.Info
	if !v.Healthy && v.Reason == ReasonHeartbeatMissing {
		log = r.log.Warn
	}
	log("binding health: condition changed", "namespace", cb.GetNamespace(), "healthy", v.Healthy, "reason", v.Reason,
		"message", v.Message)
	return recheck, nil
}

// heartbeatOf reads the konnector's heartbeat fields; anything that does
// not parse counts as absent.
func heartbeatOf(obj map[string]any) Heartbeat {
	last, _, _ := unstructured.NestedString(obj, "status", "lastHeartbeatTime")
	interval, _, _ := unstructured.NestedString(obj, "status", "heartbeatInterval")
	return heartbeatFrom(last, interval)
}

// heartbeatFrom reads a ClusterBinding's status.lastHeartbeatTime and
// status.heartbeatInterval; what does not parse counts as absent.
func heartbeatFrom(last, interval string) Heartbeat {
	var hb Heartbeat
	if t, err := time.Parse(time.RFC3339, last); err == nil {
		hb.Last = t
	}
	if d, err := time.ParseDuration(interval); err == nil {
		hb.Interval = d
	}
	return hb
}

func healthyCondition(obj map[string]any) map[string]any {
	list, _, _ := unstructured.NestedSlice(obj, "status", "conditions")
	for _, c := range list {
		if m, ok := c.(map[string]any); ok && m["type"] == ConditionHealthy {
			return m
		}
	}
	return nil
}

func stringOr(v any) string {
	s, _ := v.(string)
	return s
}
