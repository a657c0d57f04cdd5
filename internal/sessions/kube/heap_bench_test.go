package kube

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kbprovider/backend/internal/sessions"
)

// benchResponseBytes is about a BindingResponse's size: a kubeconfig with
// a CA certificate and a token.
const benchResponseBytes = 6 << 10

// BenchmarkReplicaHeap writes the records of binds (two marks, an
// outcome, a delivery each) through one store, then starts another, as a
// replica restarted with that backlog, and reports the heap its cache
// holds once synced, the peak while syncing, and how fast one collection
// deletes the records once they are all past their time. Run with
// -benchtime=1x.
func BenchmarkReplicaHeap(b *testing.B) {
	for _, binds := range []int{1000, 5000} {
		b.Run(fmt.Sprint(binds, "-binds"), func(b *testing.B) {
			for b.Loop() {
				benchReplicaHeap(b, binds)
			}
		})
	}
}

func benchReplicaHeap(b *testing.B, binds int) {
	ctx := context.Background()
	e := newEnv(b)
	admin, ns, cfg := e.admin, e.ns, e.user
	limits := sessions.Limits{WriteRate: 1e6, WriteBurst: 1e6}

	writer := e.startStore(b, storeOpts{limits: limits})
	raw := make([]byte, benchResponseBytes*3/4)
	exp := time.Now().Add(time.Hour)
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(binds); i = next.Add(1) {
				id := fmt.Sprint("bind-", i)
				_, _ = rand.Read(raw)
				resp := fmt.Appendf(nil, `{"kubeconfig":%q}`, base64.StdEncoding.EncodeToString(raw))
				for _, err := range []error{
					writer.UseOnce(ctx, "link\n"+id, exp), writer.UseOnce(ctx, "state\n"+id, exp),
					writer.Complete(ctx, id, exp, "kb-ns", resp),
				} {
					must(b, err)
				}
				for {
					_, err := writer.Deliver(ctx, id, exp)
					if err == nil {
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	b.Logf("%d binds written in %v", binds, time.Since(start))

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak atomic.Uint64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	syncStart := time.Now()
	replica := e.startStore(b, storeOpts{limits: limits})
	synced := time.Since(syncStart)
	close(stop)
	sampler.Wait()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	b.ReportMetric(float64(held)/float64(binds), "heap-B/bind")
	b.ReportMetric(float64(held)/(1<<20), "heap-MiB")
	b.ReportMetric(float64(peak.Load()-before.HeapAlloc)/(1<<20), "peak-MiB")
	b.ReportMetric(synced.Seconds(), "sync-s")
	b.Logf("cache holds %d objects", len(replica.informer.GetStore().List()))
	runtime.KeepAlive(replica)

	// Every record past its collection time: one replica collects them.
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	collector, err := New(Options{Config: cfg, Namespace: ns, Limits: limits, Now: later})
	must(b, err)
	collectStart := time.Now()
	collector.collect(ctx)
	took := time.Since(collectStart)
	left, err := admin.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: RecordLabel})
	must(b, err)
	if len(left.Items) != 0 {
		b.Fatalf("%d records left after collection", len(left.Items))
	}
	b.ReportMetric(float64(4*binds)/took.Seconds(), "collected/s")
}
