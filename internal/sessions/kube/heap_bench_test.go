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

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
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
	cp := controlplane.Get(b)
	admin := kubernetes.NewForConfigOrDie(cp.AdminConfig())
	ns := fmt.Sprintf("heap-%d", time.Now().UnixNano()%1e9)
	must(b, create(ctx, admin.CoreV1().Namespaces(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	b.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	must(b, create(ctx, admin.RbacV1().Roles(ns), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "sessions"}, Rules: storeRules}))
	must(b, create(ctx, admin.RbacV1().RoleBindings(ns), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "sessions"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "sessions"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: storeUser}},
	}))
	cfg := controlplane.ConfigForUser(b, cp, storeUser)
	limits := sessions.Limits{WriteRate: 1e6, WriteBurst: 1e6}

	writer := runStore(b, benchStoreOptions(cfg, ns, limits))
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
					writer.Complete(ctx, id, exp, resp),
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
	replica := runStore(b, benchStoreOptions(cfg, ns, limits))
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

// runStore runs a synced store until the benchmark ends.
func runStore(b *testing.B, opts Options) *Store {
	s, err := New(opts)
	must(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	syncCtx, syncDone := context.WithTimeout(ctx, 5*time.Minute)
	defer syncDone()
	must(b, s.WaitForSync(syncCtx))
	return s
}

func benchStoreOptions(cfg *rest.Config, ns string, limits sessions.Limits) Options {
	return Options{Config: cfg, Namespace: ns, Limits: limits}
}
