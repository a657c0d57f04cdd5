package binding

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

// MarkDelivered writes the mark once, as the backend's least-privilege
// identity: a second call finds it and writes nothing; a namespace whose
// ClusterBinding is gone is NotFound.
func TestMarkDelivered(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p := newProvisioner(t, e, e.backend, ScopeNamespaced)
	res, err := p.Provision(ctx, Consumer{Issuer: issuer, Subject: "delivered"}, "cid", []Resource{widgets})
	if err != nil {
		t.Fatal(err)
	}
	cbs := dynamic.NewForConfigOrDie(e.admin).Resource(kbresources.ClusterBindings).Namespace(res.Namespace)
	read := func() (string, string) {
		t.Helper()
		cb, err := cbs.Get(ctx, ClusterBindingName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cb.GetAnnotations()[AnnotationDeliveredAt], cb.GetResourceVersion()
	}
	if at, _ := read(); at != "" {
		t.Fatalf("marked delivered (%s) by Provision", at)
	}
	if err := p.MarkDelivered(ctx, res.Namespace); err != nil {
		t.Fatal(err)
	}
	at, version := read()
	if at == "" {
		t.Fatal("MarkDelivered left no mark")
	}
	if err := p.MarkDelivered(ctx, res.Namespace); err != nil {
		t.Fatal(err)
	}
	if again, v := read(); again != at || v != version {
		t.Errorf("a second MarkDelivered wrote: %s (version %s), was %s (version %s)", again, v, at, version)
	}
	if err := cbs.Delete(ctx, ClusterBindingName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.MarkDelivered(ctx, res.Namespace); !apierrors.IsNotFound(err) {
		t.Errorf("MarkDelivered of a namespace without a binding: %v, want NotFound", err)
	}
}
