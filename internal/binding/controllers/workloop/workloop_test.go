package workloop

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// The three outcomes of a reconcile: done (forgotten), again later (not a
// failure, so no back-off is counted), failed (retried with back-off and
// logged); and Run returns only after the worker finished.
func TestOutcomes(t *testing.T) {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Millisecond, 10*time.Millisecond))
	logs := &procs.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))

	var mu sync.Mutex
	calls := map[string]int{}
	requeues := map[string]int{}
	done := make(chan struct{})
	reconcile := func(ctx context.Context, key string) (time.Duration, error) {
		mu.Lock()
		defer mu.Unlock()
		calls[key]++
		requeues[key] = q.NumRequeues(key)
		if calls["fail"] == 3 && calls["later"] == 2 && calls["ok"] == 1 {
			select {
			case <-done:
			default:
				close(done)
			}
		}
		switch {
		case key == "fail" && calls[key] < 3:
			return 0, errors.New("boom")
		case key == "later" && calls[key] == 1:
			return 5 * time.Millisecond, nil
		}
		return 0, nil
	}
	q.Add("ok")
	q.Add("later")
	q.Add("fail")
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	go func() { Run(ctx, q, 2, reconcile, log, "test"); close(finished) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("not every outcome happened: %v", calls)
	}
	cancel()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after ctx ended")
	}
	if !q.ShuttingDown() {
		t.Error("the queue was not shut down")
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["ok"] != 1 || calls["later"] != 2 || calls["fail"] != 3 {
		t.Errorf("calls %v, want ok 1, later 2, fail 3", calls)
	}
	if requeues["later"] != 0 {
		t.Errorf("a later look counted as %d failures", requeues["later"])
	}
	if requeues["fail"] != 2 {
		t.Errorf("the third try of a failing key saw %d failures, want 2", requeues["fail"])
	}
	if n := strings.Count(logs.String(), "test: reconcile failed, retrying"); n != 2 {
		t.Errorf("%d failure lines logged, want 2:\n%s", n, logs.String())
	}
}

// Unset options get the shared defaults; set ones are kept.
func TestDefaults(t *testing.T) {
	resync, log, clk := Defaults(-time.Second, nil, nil)
	if resync != DefaultResync || log != slog.Default() || clk == nil {
		t.Errorf("Defaults(-1s, nil, nil) = %v, %p, %v; want %v, slog.Default(), the real clock", resync, log, clk, DefaultResync)
	}
	mine := slog.New(slog.DiscardHandler)
	fake := testingclock.NewFakeClock(time.Unix(0, 0))
	resync, log, clk = Defaults(time.Minute, mine, fake)
	if resync != time.Minute || log != mine || clk != fake {
		t.Errorf("Defaults kept %v, %p, %v; want 1m, the given logger and clock", resync, log, clk)
	}
}

// OnChange hands f the object of every add, update and delete, and the
// last known state of a deletion seen only after a relist.
func TestOnChangeUnwrapsTombstones(t *testing.T) {
	var got []any
	h := OnChange(func(obj any) { got = append(got, obj) })
	h.OnAdd("added", false)
	h.OnUpdate("old", "updated")
	h.OnDelete("deleted")
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/x", Obj: "last known"})
	if want := []any{"added", "updated", "deleted", "last known"}; !slices.Equal(got, want) {
		t.Errorf("OnChange handed %v, want %v", got, want)
	}
}
