package kbmanager

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

// Two replicas: only one runs the controllers at a time; when the leader
// stops, Run returns only after it released the Lease, and the other
// takes over well before the lease duration.
func TestOneLeaderAndFastHandover(t *testing.T) {
	cp := controlplane.Get(t)
	rc := cp.AdminConfig()
	// The cache needs the kube-bind CRDs.
	if err := exampleapis.Prepare(context.Background(), cp); err != nil {
		t.Fatal(err)
	}
	if _, err := kubernetes.NewForConfigOrDie(rc).CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "leader-test"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var running, maxRunning atomic.Int32
	leading := make(chan int, 2)
	opts := Options{
		Leader:        LeaderOptions{Enabled: true, Namespace: "leader-test", LeaseName: "test-lease", PodName: "replica"},
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 200 * time.Millisecond,
	}
	cancels := make([]context.CancelFunc, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		wg.Go(func() {
			Run(ctx, Budgeted(rc), opts, func(m *Manager) error {
				return m.AddRunnable(func(ctx context.Context) error {
					if n := running.Add(1); n > maxRunning.Load() {
						maxRunning.Store(n)
					}
					leading <- i
					<-ctx.Done()
					running.Add(-1)
					return nil
				})
			})
		})
	}
	var first int
	select {
	case first = <-leading:
	case <-time.After(60 * time.Second):
		t.Fatal("no replica became leader within 60s")
	}
	time.Sleep(time.Second) // the other keeps trying meanwhile
	start := time.Now()
	cancels[first]()
	select {
	case second := <-leading:
		if second == first {
			t.Fatal("the stopped replica led again")
		}
		took := time.Since(start)
		t.Logf("handover after the leader stopped: %v (lease duration %v)", took.Round(time.Millisecond), opts.LeaseDuration)
		if took >= opts.LeaseDuration {
			t.Errorf("handover took %v: the Lease was not released", took)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no handover within 60s")
	}
	cancels[1-first]()
	wg.Wait()
	if maxRunning.Load() != 1 {
		t.Errorf("%d replicas ran at once", maxRunning.Load())
	}
}
