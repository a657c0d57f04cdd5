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
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/workloop"
	"github.com/kbprovider/backend/internal/binding/kbcache"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

const fieldManager = "kube-bind-backend"

// Config configures the controller.
type Config struct {
	// Metrics, if set, gets the binding metrics (reported only while Run
	// runs, i.e. on the replica holding the leader election Lease).
	Metrics prometheus.Registerer
	// Slack is added to twice the heartbeat interval; 0 means DefaultSlack.
	Slack time.Duration
	// Resync re-checks every binding this often; 0 means 10 minutes.
	Resync time.Duration
	Logger *slog.Logger
	// Clock is for tests; nil means the real clock.
	Clock clock.WithTicker
}

// Controller keeps the Healthy condition of every ClusterBinding the
// backend made. Run may be called again after it returned.
type Controller struct {
	cfg     Config
	dynamic dynamic.Interface
	log     *slog.Logger
	current atomic.Pointer[run] // the caches of the running Run, for the metrics
}

// New checks the configuration and registers the metrics; it does not
// contact the cluster.
func New(rc *rest.Config, cfg Config) (*Controller, error) {
	if cfg.Slack <= 0 {
		cfg.Slack = DefaultSlack
	}
	cfg.Resync, cfg.Logger, cfg.Clock = workloop.Defaults(cfg.Resync, cfg.Logger, cfg.Clock)
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, dynamic: dyn, log: cfg.Logger}
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(collector{c}); err != nil {
			return nil, fmt.Errorf("heartbeats: registering metrics: %w", err)
		}
	}
	return c, nil
}

type run struct {
	*Controller
	queue    workqueue.TypedRateLimitingInterface[string]
	bindings cache.SharedIndexInformer
	requests cache.SharedIndexInformer
}

// Run keeps the conditions until ctx ends. It returns an error only when
// the caches could not be set up; a cluster that is down is waited for.
func (c *Controller) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &run{
		Controller: c,
		queue:      workloop.NewQueue("bindinghealth", c.cfg.Clock),
	}
	defer r.queue.ShutDown()
	// Only the ClusterBindings Provision made (it labels them); the
	// backend could not write others anyway.
	managed := dynamicinformer.NewFilteredDynamicSharedInformerFactory(c.dynamic, c.cfg.Resync, metav1.NamespaceAll,
		func(o *metav1.ListOptions) { o.LabelSelector = binding.LabelManagedBy + "=" + binding.ManagedByValue })
	all := dynamicinformer.NewDynamicSharedInformerFactory(c.dynamic, 0)
	r.bindings = managed.ForResource(kbresources.ClusterBindings).Informer()
	r.requests = all.ForResource(kbresources.APIServiceExportRequests).Informer()
	// The caches keep only what is read (heartbeats, conditions, phases):
	// consumers write these objects.
	if err := r.bindings.SetTransform(kbcache.Transform(kbcache.Options{Drop: [][]string{{"spec"}}})); err != nil {
		return err
	}
	if err := r.requests.SetTransform(kbcache.Transform(kbcache.Options{Drop: [][]string{{"spec"}, {"status", "conditions"}}})); err != nil {
		return err
	}
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			r.queue.Add(key)
		}
	}
	if _, err := r.bindings.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) },
	}); err != nil {
		return err
	}
	managed.Start(ctx.Done())
	all.Start(ctx.Done())
	defer managed.Shutdown()
	defer all.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), r.bindings.HasSynced, r.requests.HasSynced) {
		return ctx.Err()
	}
	c.current.Store(r)
	defer c.current.CompareAndSwap(r, nil)
	c.log.Info("binding health: caches synced, watching heartbeats", "slack", c.cfg.Slack.String())

	workloop.Run(ctx, r.queue, 1, r.reconcile, r.log, "binding health")
	return nil
}

// reconcile sets the condition of one ClusterBinding and says when to look
// again: at the moment a healthy binding would turn stale.
func (r *run) reconcile(ctx context.Context, key string) (time.Duration, error) {
	o, ok, _ := r.bindings.GetStore().GetByKey(key)
	if !ok {
		return 0, nil
	}
	cb := o.(*unstructured.Unstructured)
	if cb.GetDeletionTimestamp() != nil {
		return 0, nil
	}
	now := r.cfg.Clock.Now()
	v := Evaluate(heartbeatOf(cb.Object), now, r.cfg.Slack)
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
	_, err := r.dynamic.Resource(kbresources.ClusterBindings).Namespace(cb.GetNamespace()).
		Apply(ctx, cb.GetName(), apply, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}, "status")
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("applying the Healthy condition of %s: %w", key, err)
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
	var hb Heartbeat
	if s, ok, _ := unstructured.NestedString(obj, "status", "lastHeartbeatTime"); ok {
		if t, err := time.Parse(time.RFC3339, s); err == nil {
			hb.Last = t
		}
	}
	if s, ok, _ := unstructured.NestedString(obj, "status", "heartbeatInterval"); ok {
		if d, err := time.ParseDuration(s); err == nil {
			hb.Interval = d
		}
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
