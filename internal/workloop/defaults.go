package workloop

import (
	"log/slog"
	"time"

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
