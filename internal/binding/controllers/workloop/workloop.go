// Package workloop is the worker loop that the provider-side controllers
// (exportrequests, heartbeats, cleanup, credentials) share: take a key off a
// rate-limited work queue, reconcile it, and either forget it, look at it
// again later, or retry it with back-off.
package workloop

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
)

// Reconcile handles one key. A positive duration asks for another look
// that much later without counting as a failure; an error retries the key
// with the queue's back-off.
type Reconcile func(ctx context.Context, key string) (again time.Duration, err error)

// Run reconciles the keys of q with workers goroutines (at least one) until
// ctx ends; then it shuts q down and returns once every worker has
// finished its key. Failures are logged at WARN as "<what>: reconcile
// failed, retrying" (not once ctx has ended: shutdown cancels work in
// flight).
func Run(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], workers int, reconcile Reconcile, log *slog.Logger, what string) {
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next(ctx, q, reconcile, log, what) {
			}
		}()
	}
	<-ctx.Done()
	q.ShutDown()
	wg.Wait()
}

// next handles one key; false when q has shut down.
func next(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], reconcile Reconcile, log *slog.Logger, what string) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	again, err := reconcile(ctx, key)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			log.Warn(what+": reconcile failed, retrying", "key", key, "error", err, "retries", q.NumRequeues(key))
		}
		q.AddRateLimited(key)
	case again > 0:
		q.Forget(key)
		q.AddAfter(key, again)
	default:
		q.Forget(key)
	}
	return true
}
