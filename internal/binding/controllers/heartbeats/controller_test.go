package heartbeats_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/binding/controllers/heartbeats"
	"github.com/kbprovider/backend/internal/binding/controllers/kbmanager"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/internal/testutil/backendcluster"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

func TestMain(m *testing.M) { os.Exit(controlplane.RunMain(m)) }

const backendUser = "kube-bind-backend-health-test"

// The whole life of the condition against a real API server, with the
// controller running as a user holding only the backend's ClusterRoles:
// NoHeartbeat after the bind, True after a konnector-style heartbeat (its
// own condition kept), HeartbeatMissing once the heartbeat is older than
// 2 x interval + slack, and the metrics saying the same.
func TestHealthyConditionFollowsHeartbeats(t *testing.T) {
	cp := controlplane.Get(t)
	ctx := context.Background()
	backend := backendcluster.Backend(t, cp, backendUser, exampleapis.MangoDB)
	cat := backendcluster.Catalog(t, backend, exampleapis.MangoDB)
	prov, err := binding.NewProvisioner(backend, cat, binding.Config{NamespacePrefix: "kbh-", ProviderPrettyName: "Health Test"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := prov.Provision(ctx, binding.Consumer{Issuer: "https://idp.example.com", Subject: fmt.Sprint("hb-", time.Now().UnixNano())},
		"cluster1", []binding.Resource{exampleapis.MangoDB.Resource()})
	if err != nil {
		t.Fatal(err)
	}
	consumerRC, ns := testutil.IssuedConfig(t, r.Kubeconfig)
	// The konnector's view: the issued kubeconfig.
	konnector := dynamic.NewForConfigOrDie(consumerRC).Resource(kbresources.ClusterBindings).Namespace(ns)

	reg := prometheus.NewRegistry()
	const slack = time.Second
	ctrl, err := heartbeats.New(heartbeats.Config{Metrics: reg, Slack: slack})
	if err != nil {
		t.Fatal(err)
	}
	// What the controller asks of the consumer's namespace (a
	// cluster-wide list or watch names none), and how often it looked at
	// the ClusterBinding.
	var (
		mu          sync.Mutex
		made        []string
		reconciles  int
		counted     = rest.CopyConfig(backend)
		bindingName = ns + "/" + binding.ClusterBindingName
	)
	counted.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if strings.Contains(r.URL.Path+"/", "/namespaces/"+ns+"/") {
				mu.Lock()
				made = append(made, r.Method+" "+r.URL.Path)
				mu.Unlock()
			}
			return rt.RoundTrip(r)
		})
	})
	opts := kbmanager.Options{Reconciled: func(_ string, req reconcile.Request, err error) {
		if req.String() == bindingName && err == nil {
			mu.Lock()
			reconciles++
			mu.Unlock()
		}
	}}
	backendcluster.Run(t, "the heartbeats controller", func(ctx context.Context) error {
		kbmanager.Run(ctx, counted, opts, ctrl.Setup)
		return nil
	})

	cond := func() map[string]any {
		cb, err := konnector.Get(ctx, binding.ClusterBindingName, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return healthyCondition(cb)
	}
	var c map[string]any
	testutil.Await(t, "a Healthy condition appears", func() bool { c = cond(); return c != nil })
	if c["status"] != "False" || c["reason"] != heartbeats.ReasonNoHeartbeat || c["severity"] != heartbeats.SeverityInfo ||
		c["lastTransitionTime"] == "" || c["message"] == "" {
		t.Fatalf("before any heartbeat: %v, want False/NoHeartbeat/Info with a time and message", c)
	}

	// A heartbeat as the released konnector writes it: read, set the
	// heartbeat fields and its own condition, PUT the status.
	const interval = 2 * time.Second
	heartbeat := func() time.Time {
		t.Helper()
		var at time.Time
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			cb, err := konnector.Get(ctx, binding.ClusterBindingName, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			at = time.Now().Truncate(time.Second)
			status, _, _ := unstructured.NestedMap(cb.Object, "status")
			if status == nil {
				status = map[string]any{}
			}
			status["lastHeartbeatTime"] = at.UTC().Format(time.RFC3339)
			status["heartbeatInterval"] = interval.String()
			conds, _ := status["conditions"].([]any)
			kept := []any{map[string]any{"type": "Ready", "status": "True", "lastTransitionTime": at.UTC().Format(time.RFC3339)}}
			for _, c := range conds {
				if c.(map[string]any)["type"] != "Ready" {
					kept = append(kept, c)
				}
			}
			status["conditions"] = kept
			cb.Object["status"] = status
			_, err = konnector.UpdateStatus(ctx, cb, metav1.UpdateOptions{})
			return err == nil, nil // a conflict with the controller: read again
		})
		if err != nil {
			t.Fatalf("the konnector's heartbeat: %v", err)
		}
		return at
	}
	at := heartbeat()
	testutil.Await(t, "Healthy turns True", func() bool { c = cond(); return c != nil && c["status"] == "True" })
	if c["reason"] != heartbeats.ReasonHeartbeatRecent {
		t.Errorf("healthy: %v", c)
	}
	cb, _ := konnector.Get(ctx, binding.ClusterBindingName, metav1.GetOptions{})
	list, _, _ := unstructured.NestedSlice(cb.Object, "status", "conditions")
	if len(list) != 2 {
		t.Errorf("conditions %v: want the konnector's Ready and our Healthy", list)
	}
	if n := testutil.MetricValue(t, reg, "kube_bind_backend_cluster_bindings", "health", "healthy"); n != 1 {
		t.Errorf("cluster_bindings{health=healthy} = %v, want 1", n)
	}

	// No more heartbeats: stale after 2 x 2s + 1s, not before, without any
	// event on the object (the controller requeues itself for that moment).
	staleAt := at.Add(heartbeats.Tolerance(interval, slack))
	var flipped time.Time
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		c = cond()
		if c != nil && c["status"] == "False" {
			flipped = time.Now()
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the condition never turned False after the heartbeats stopped: %v", c)
	}
	t.Logf("stale at %s (heartbeat %s + %s), condition False seen %s after that", staleAt.Format(time.RFC3339),
		at.Format(time.RFC3339), heartbeats.Tolerance(interval, slack), flipped.Sub(staleAt).Round(time.Millisecond))
	if flipped.Before(staleAt) {
		t.Errorf("turned False at %s, before the tolerance ran out at %s", flipped, staleAt)
	}
	if c["reason"] != heartbeats.ReasonHeartbeatMissing || c["severity"] != heartbeats.SeverityWarning ||
		!strings.Contains(c["message"].(string), at.UTC().Format(time.RFC3339)) {
		t.Errorf("stale: %v", c)
	}
	if n := testutil.MetricValue(t, reg, "kube_bind_backend_cluster_bindings", "health", "heartbeat_missing"); n != 1 {
		t.Errorf("cluster_bindings{health=heartbeat_missing} = %v, want 1", n)
	}
	if age := testutil.MetricValue(t, reg, "kube_bind_backend_oldest_heartbeat_age_seconds"); age < 5 {
		t.Errorf("oldest heartbeat age %v s, want at least the 5 s tolerance", age)
	}

	// Requests by phase: one created by the consumer, no exports
	// controller running here, so it stays Pending.
	req := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kube-bind.io/v1alpha1", "kind": "APIServiceExportRequest",
		"metadata": map[string]any{"name": "mangodbs.mangodb.com"},
		"spec":     map[string]any{"resources": []any{map[string]any{"group": "mangodb.com", "resource": "mangodbs"}}},
	}}
	if _, err := dynamic.NewForConfigOrDie(consumerRC).Resource(kbresources.APIServiceExportRequests).Namespace(ns).Create(ctx, req, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "the request is counted as Pending", func() bool {
		return testutil.MetricValue(t, reg, "kube_bind_backend_export_requests", "phase", "Pending") == 1
	})
	if n := testutil.MetricValue(t, reg, "kube_bind_backend_export_requests", "phase", "Succeeded"); n != 0 {
		t.Errorf("Succeeded requests %v, want 0", n)
	}

	// A heartbeat again: healthy again.
	heartbeat()
	testutil.Await(t, "Healthy turns True again", func() bool { c = cond(); return c != nil && c["status"] == "True" })

	// Heartbeats of a healthy binding cost the controller their events:
	// a look at the cache each, no request.
	testutil.Await(t, "the condition's own change was looked at", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(made) > 0 && reconciles > 0
	})
	mu.Lock()
	before, looks := len(made), reconciles
	mu.Unlock()
	for range 3 {
		time.Sleep(time.Second) // a heartbeat time of its own (seconds)
		heartbeat()
		testutil.Await(t, "the heartbeat is looked at", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return reconciles > looks
		})
		mu.Lock()
		looks = reconciles
		mu.Unlock()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(made) != before {
		t.Errorf("3 heartbeats of a healthy binding cost %d requests: %v", len(made)-before, made[before:])
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// healthyCondition is cb's Healthy condition, nil when it has none.
func healthyCondition(cb *unstructured.Unstructured) map[string]any {
	list, _, _ := unstructured.NestedSlice(cb.Object, "status", "conditions")
	for _, c := range list {
		if m, ok := c.(map[string]any); ok && m["type"] == heartbeats.ConditionHealthy {
			return m
		}
	}
	return nil
}
