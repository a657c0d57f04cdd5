package kbmanager

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/exampleapis"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// The cache holds the kube-bind kinds compactly and reads them back as
// the API server has them (less what the transforms trim); an
// unstructured read of such a kind is refused instead of starting a
// second, whole-object informer.
func TestCachedKindsReadBackAsWritten(t *testing.T) {
	cp := controlplane.Get(t)
	rc := cp.AdminConfig()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := exampleapis.Prepare(ctx, cp); err != nil {
		t.Fatal(err)
	}
	const ns = "cache-test"
	if _, err := kubernetes.NewForConfigOrDie(rc).CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	m, err := newManager(rc, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.GetCache().Start(ctx) }()
	defer func() { cancel(); <-done }()
	if !m.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}

	req := unstructuredOf(ExportRequest)
	req.SetName("widgets")
	req.SetAnnotations(map[string]string{"dropped": strings.Repeat("x", 4096)})
	req.Object["spec"] = map[string]any{
		"resources":  []any{map[string]any{"group": "example.com", "resource": "widgets", "versions": []any{"v1"}}},
		"parameters": map[string]any{"size": strings.Repeat("p", 1024)},
	}
	made, err := dynamic.NewForConfigOrDie(rc).Resource(kbresources.APIServiceExportRequestsV1alpha2).Namespace(ns).
		Create(ctx, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got *unstructured.Unstructured
	for got == nil || got.GetResourceVersion() != made.GetResourceVersion() {
		if ctx.Err() != nil {
			t.Fatalf("the request never reached the cache: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
		got, err = Get(ctx, m.GetCache(), ExportRequest, client.ObjectKey{Namespace: ns, Name: "widgets"})
		if client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
	}
	if got.GroupVersionKind() != ExportRequest || got.GetUID() != made.GetUID() || !got.GetCreationTimestamp().Time.Equal(made.GetCreationTimestamp().Time) {
		t.Errorf("identity: %s %s %v", got.GroupVersionKind(), got.GetUID(), got.GetCreationTimestamp())
	}
	if len(got.GetAnnotations()) != 0 || got.GetManagedFields() != nil {
		t.Errorf("trimmed metadata kept: %v", got.Object["metadata"])
	}
	wantSpec := made.Object["spec"].(map[string]any)
	delete(wantSpec, "parameters")
	if !equality.Semantic.DeepEqual(got.Object["spec"], wantSpec) {
		t.Errorf("spec %v, want %v", got.Object["spec"], wantSpec)
	}
	list, err := List(ctx, m.GetCache(), ExportRequest, client.InNamespace(ns))
	if err != nil || len(list) != 1 || !equality.Semantic.DeepEqual(list[0].Object, got.Object) {
		t.Errorf("list %v, %v", list, err)
	}
	// Readers own what they got.
	got.Object["spec"].(map[string]any)["resources"] = nil
	again, err := Get(ctx, m.GetCache(), ExportRequest, client.ObjectKey{Namespace: ns, Name: "widgets"})
	if err != nil || again.Object["spec"].(map[string]any)["resources"] == nil {
		t.Errorf("a reader's change reached the cache: %v %v", again, err)
	}
	if err := m.GetCache().Get(ctx, client.ObjectKey{Namespace: ns, Name: "widgets"}, unstructuredOf(ExportRequest)); err == nil {
		t.Error("an unstructured read was served: a second informer of the kind")
	}
}

func unstructuredOf(gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u
}

// Every cached kind has its compact form and reads back as itself.
func TestCachedKinds(t *testing.T) {
	for gvk := range cachedKinds {
		u, err := Expand(Cached(gvk))
		if err != nil || u.GroupVersionKind() != gvk {
			t.Errorf("%s: %v %v", gvk, u, err)
		}
	}
	if _, err := Expand(&corev1.Namespace{}); err == nil {
		t.Error("a typed object expanded")
	}
}
