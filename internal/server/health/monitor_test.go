package health

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil"
)

// The Monitor asks each dependency on its own timer, sets its gauge, logs
// a change once (WARN when it fails, INFO when it answers again), and
// reading its state asks nobody.
func TestMonitor(t *testing.T) {
	var down atomic.Bool
	var calls atomic.Int64
	idp := CheckFunc("oidc", func(context.Context) error {
		calls.Add(1)
		if down.Load() {
			return errors.New("dial tcp 10.0.0.1:443: connection refused")
		}
		return nil
	})
	reg := prometheus.NewRegistry()
	logs := &procs.Buffer{}
	m, err := NewMonitor(reg, []Check{idp}, MonitorOptions{Interval: 20 * time.Millisecond, Retry: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if o := m.Observed(); len(o) != 1 || !errors.Is(o[0].Err, ErrNotChecked) {
		t.Fatalf("before Run: %+v", o)
	}
	gauge := func() float64 {
		return testutil.MetricValue(t, reg, "kube_bind_backend_dependency_up", "dependency", "oidc")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() { cancel(); <-done }()

	testutil.Await(t, "oidc up", func() bool { return gauge() == 1 && m.Observed()[0].Err == nil })
	down.Store(true)
	testutil.Await(t, "oidc down", func() bool { return gauge() == 0 && m.Observed()[0].Err != nil })
	time.Sleep(100 * time.Millisecond) // several more failed looks
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Errorf("%d WARN logs for one outage, want 1:\n%s", n, logs)
	}
	down.Store(false)
	testutil.Await(t, "oidc up again", func() bool { return gauge() == 1 })
	testutil.Await(t, "the recovery logged", func() bool { return strings.Contains(logs.String(), "dependency answering again") })

	// Reading the state makes no call.
	before := calls.Load()
	cancel()
	<-done
	n := calls.Load()
	for range 100 {
		m.Observed()
	}
	if calls.Load() != n || n < before {
		t.Errorf("reading the monitor called the check")
	}
}
