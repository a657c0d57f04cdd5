package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// objectsPerKind is how many objects of each consumer-writable kind the
// memory test stores: more than a consumer's quota allows, as if many
// consumers had each stored their share.
const objectsPerKind = 30

// keptPerObject bounds what the backend may keep of each such object:
// the few fields its controllers read, not the hundreds of kilobytes a
// consumer may store.
const keptPerObject = 32 << 10

// consumerKinds is how many kinds storeConsumerObjects makes.
const consumerKinds = 5

// liveHeapAllowance is the backend's live heap before it holds any
// consumer's object, with room.
const liveHeapAllowance = 32 << 20

// 30 objects of each kind a consumer can write, each as large as the
// schema admits and with 250 KB of annotations, leave the backend (all
// controllers running) under the chart's memory limit, and its live heap
// grows by what the controllers read, not by what the consumers stored:
// the caches keep only that. Kept whole, the objects would take the live
// heap well over the bound.
func TestConsumerObjectsStayWithinMemoryLimit(t *testing.T) {
	cp := controlplane.Get(t)
	prepareCluster(t, cp)
	limit := backendproc.ChartMemoryLimit(t)

	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(cp.AdminConfig())
	annotations := map[string]string{"example.com/filler": strings.Repeat("a", 250<<10)}
	long := func(n int, c string) string { return strings.Repeat(c, n) }
	// One entry short of the limit, so that the backend's own condition fits.
	conditions := make([]any, 15)
	for i := range conditions {
		conditions[i] = map[string]any{"type": fmt.Sprintf("C%d", i) + long(300, "t"), "status": "False",
			"lastTransitionTime": "2025-01-01T00:00:00Z", "reason": long(1024, "r"), "message": long(4096, "m")}
	}
	var wg sync.WaitGroup
	errs := make(chan error, objectsPerKind)
	sem := make(chan struct{}, 4)
	for i := range objectsPerKind {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := storeConsumerObjects(ctx, dyn, fmt.Sprintf("mem-%d", i), annotations, conditions); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// The backend starts with them stored, as a new leader does after the
	// previous one died.
	port := procs.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	idp := oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{base + "/callback"}, Users: []oidcprovider.User{alice}})
	// As the chart runs it: --memory-limit from the container's limit.
	args := append(backendproc.BrowserArgs(t, port, base, idp, cp.AdminKubeconfigPath(), prettyName, namespacePrefix),
		"--memory-limit", strconv.FormatInt(limit, 10))
	args = append(args, backendproc.DiagnosticsArgs(t)...)
	args = append(args, "--profiling")
	proc := backendproc.StartBinary(t, backendproc.Binary, base, args, 2*time.Minute)
	// The caches hold them all once the metric counts every request.
	deadline := time.Now().Add(2 * time.Minute)
	for metricSum(t, proc.Diagnostics, "kube_bind_backend_export_requests") < objectsPerKind {
		if time.Now().After(deadline) {
			t.Fatalf("the backend's caches did not see %d requests in time", objectsPerKind)
		}
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // the other controllers' caches
	live := backendproc.LiveHeap(t, proc.Diagnostics)
	rss, peak := procs.Memory(t, proc.PID)
	t.Logf("backend memory with %d objects of each kind: live heap %.1f MiB, VmRSS %.1f MiB, peak VmHWM %.1f MiB; chart limit %.0f MiB",
		objectsPerKind, mib(live), mib(rss), mib(peak), mib(limit))
	if peak >= limit {
		t.Errorf("peak VmHWM %.1f MiB reaches the chart's memory limit %.0f MiB", mib(peak), mib(limit))
	}
	if bound := int64(liveHeapAllowance + consumerKinds*objectsPerKind*keptPerObject); live > bound {
		t.Errorf("live heap %.1f MiB with %d objects of each kind, over %.1f MiB: the caches keep what the consumers stored",
			mib(live), objectsPerKind, mib(bound))
	}
}

// storeConsumerObjects makes one of each consumer-writable kind in ns,
// as large as the schemas admit.
func storeConsumerObjects(ctx context.Context, dyn dynamic.Interface, ns string,
	annotations map[string]string, conditions []any) error {
	nsObj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}
	if _, err := dyn.Resource(corev1.SchemeGroupVersion.WithResource("namespaces")).Create(ctx, nsObj, metav1.CreateOptions{}); err != nil {
		return err
	}
	long := func(n int, c string) string { return strings.Repeat(c, n) }
	list := func(n int, f func(i int) any) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = f(i)
		}
		return out
	}
	str := func(n, l int) []any {
		return list(n, func(i int) any { return fmt.Sprintf("%02d", i) + long(l-2, "v") })
	}
	params := map[string]any{}
	for i := range 32 {
		params[fmt.Sprintf("p%02d", i)+long(60, "k")] = long(1024, "x")
	}
	matchLabels := map[string]any{}
	for i := range 16 {
		matchLabels[fmt.Sprintf("l%02d.example.com/", i)+long(63, "k")] = long(63, "v")
	}
	claim := map[string]any{
		"group": long(253, "g"), "resource": long(63, "r"),
		"selector": map[string]any{
			"namedResources": list(16, func(int) any { return map[string]any{"name": long(253, "n"), "namespace": long(63, "s")} }),
			"labelSelector": map[string]any{
				"matchLabels": matchLabels,
				"matchExpressions": list(8, func(int) any {
					return map[string]any{"key": long(317, "k"), "operator": "In", "values": str(16, 63)}
				}),
			},
			"references": list(4, func(int) any {
				return map[string]any{"group": long(253, "g"), "resource": long(63, "r"), "versions": str(8, 63),
					"jsonPath": map[string]any{"name": long(256, "n"), "namespace": long(256, "s")}}
			}),
		},
	}
	meta := func(name string, labels map[string]any) map[string]any {
		a := map[string]any{}
		for k, v := range annotations {
			a[k] = v
		}
		m := map[string]any{"name": name, "annotations": a}
		if labels != nil {
			m["labels"] = labels
		}
		return m
	}
	managed := map[string]any{binding.LabelManagedBy: binding.ManagedByValue}
	status := map[string]any{"conditions": conditions}
	objs := []struct {
		res    string
		obj    map[string]any
		status map[string]any
	}{
		{"apiserviceexportrequests", map[string]any{"kind": "APIServiceExportRequest", "metadata": meta("big.example.com", nil),
			"spec": map[string]any{
				"resources": list(16, func(i int) any {
					return map[string]any{"group": fmt.Sprintf("%02d", i) + long(251, "g"), "resource": long(63, "r"), "versions": str(8, 63)}
				}),
				"permissionClaims": list(8, func(int) any { return claim }),
				"parameters":       params,
			}}, nil},
		{"apiservicenamespaces", map[string]any{"kind": "APIServiceNamespace", "metadata": meta("big", nil), "spec": map[string]any{}},
			map[string]any{"namespace": long(63, "n")}},
		{"clusterbindings", map[string]any{"kind": "ClusterBinding", "metadata": meta("cluster", managed), "spec": map[string]any{
			"kubeconfigSecretRef": map[string]any{"name": "kubeconfig", "key": "kubeconfig"}, "providerPrettyName": "Big"}},
			map[string]any{"conditions": conditions, "lastHeartbeatTime": "2025-01-01T00:00:00Z", "heartbeatInterval": "5m",
				"konnectorVersion": long(128, "v")}},
		{"apiserviceexports", map[string]any{"kind": "APIServiceExport", "metadata": meta("bigs.example.com", managed), "spec": map[string]any{
			"informerScope": "Namespaced", "resources": []any{map[string]any{"group": "example.com", "resource": "bigs"}}}}, status},
		{"boundschemas", map[string]any{"kind": "BoundSchema", "metadata": meta("bigs.example.com", managed), "spec": map[string]any{
			"informerScope": "Namespaced", "group": "example.com", "scope": "Namespaced",
			"names": map[string]any{"plural": "bigs", "kind": "Big"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object"}}}}}}, status},
	}
	for _, o := range objs {
		g := kbresources.APIServiceExportRequestsV1alpha2.GroupVersion().WithResource(o.res)
		o.obj["apiVersion"] = g.GroupVersion().String()
		u, err := dyn.Resource(g).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: o.obj}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("%s in %s: %w", o.res, ns, err)
		}
		if o.status != nil {
			u.Object["status"] = o.status
			if _, err := dyn.Resource(g).Namespace(ns).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("status of %s in %s: %w", o.res, ns, err)
			}
		}
	}
	return nil
}

// metricSum sums every series of the metric name (with or without
// labels) on the diagnostics listener diag; a metric absent sums to 0.
func metricSum(t *testing.T, diag, name string) int {
	t.Helper()
	resp, err := http.Get(diag + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	n := 0
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += int(v)
		}
	}
	return n
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
