package workloop

import (
	"log/slog"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
)

// DefaultResync is how often a controller re-checks every object when its
// Config leaves Resync unset.
const DefaultResync = 10 * time.Minute

// Defaults returns the options every controller's Config shares with their
// defaults filled in: DefaultResync for a resync that is not positive,
// slog.Default for a nil log, the real clock for a nil clk.
func Defaults(resync time.Duration, log *slog.Logger, clk clock.WithTicker) (time.Duration, *slog.Logger, clock.WithTicker) {
	if resync <= 0 {
		resync = DefaultResync
	}
	if log == nil {
		log = slog.Default()
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return resync, log, clk
}

// NewQueue is a controller's work queue: client-go's default controller
// rate limiter, named (for the queue's metrics) and timed by clk (nil: the
// real clock).
func NewQueue(name string, clk clock.WithTicker) workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: name, Clock: clk})
}

// Clients are the typed and the dynamic client of rc that the controllers
// read and write the cluster with; making them does not contact it.
func Clients(rc *rest.Config) (kubernetes.Interface, dynamic.Interface, error) {
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	return kube, dyn, nil
}

// OnChange is an event handler that calls f with every object an informer
// adds, updates or deletes; of a deletion seen only after a relist, with
// the object's last known state.
func OnChange(f func(obj any)) cache.ResourceEventHandlerFuncs {
	unwrap := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		f(obj)
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: unwrap, UpdateFunc: func(_, o any) { unwrap(o) }, DeleteFunc: unwrap}
}
