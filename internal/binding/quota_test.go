package binding

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kbprovider/backend/internal/testutil"
	"github.com/kbprovider/backend/pkg/apis/kbresources"
)

func TestQuotaValidate(t *testing.T) {
	for _, q := range []Quota{{0, 1}, {1, 0}, {-1, 5}, {5, maxQuota + 1}} {
		if err := q.Validate(); err == nil {
			t.Errorf("%+v accepted", q)
		}
	}
	if err := DefaultQuota().Validate(); err != nil {
		t.Error(err)
	}
}

// A consumer can create as many export requests and APIServiceNamespaces
// as its quota allows, and no more: the API server refuses the next one
// with a message naming the quota, whatever the backend's caches hold.
func TestProvisionQuotaBoundsConsumerObjects(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	cat := startCatalog(t, e.backend, ScopeCluster)
	testutil.Await(t, "catalog offers widgets", func() bool { _, ok := cat.Lookup(widgets.Group, widgets.Resource); return ok })
	p, err := NewProvisioner(e.backend, cat, Config{NamespacePrefix: "kb-", ProviderPrettyName: "Test Provider",
		Quota: Quota{ExportRequests: 3, Namespaces: 2}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Provision(ctx, Consumer{Issuer: issuer, Subject: "quota-tester"}, "clusterQ", []Resource{widgets})
	if err != nil {
		t.Fatal(err)
	}
	_, dyn, ns := consumerClients(t, res.Kubeconfig)

	create := func(kind string, i int) error {
		var obj *unstructured.Unstructured
		gvr := kbresources.APIServiceExportRequests
		if kind == "namespace" {
			gvr = kbresources.APIServiceNamespaces
			obj = &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "kube-bind.io/v1alpha1", "kind": "APIServiceNamespace",
				"metadata": map[string]any{"name": fmt.Sprintf("ns-%d", i)},
			}}
		} else {
			obj = exportRequest(fmt.Sprintf("req-%d", i))
		}
		_, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{})
		return err
	}
	for _, c := range []struct {
		kind  string
		limit int
	}{{"request", 3}, {"namespace", 2}} {
		for i := range c.limit {
			// The quota admits nothing until kube-controller-manager has
			// counted its namespace: a fresh consumer retries as the
			// konnector does.
			testutil.Await(t, fmt.Sprintf("%s %d admitted", c.kind, i), func() bool {
				err := create(c.kind, i)
				if err != nil && !strings.Contains(err.Error(), "status unknown for quota") {
					t.Fatalf("%s %d of %d: %v", c.kind, i+1, c.limit, err)
				}
				return err == nil
			})
		}
		// Counting the created ones takes the controller a moment, but
		// admission counts them itself: the next is refused at once.
		err := create(c.kind, c.limit)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exceeded quota: "+QuotaName) {
			t.Errorf("%s %d beyond the limit of %d: want Forbidden naming quota %s, got %v", c.kind, c.limit+1, c.limit, QuotaName, err)
		}
	}

	// A rebind with other limits updates the quota.
	p2, err := NewProvisioner(e.backend, cat, Config{NamespacePrefix: "kb-", ProviderPrettyName: "Test Provider",
		Quota: Quota{ExportRequests: 5, Namespaces: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Provision(ctx, Consumer{Issuer: issuer, Subject: "quota-tester"}, "clusterQ", []Resource{widgets}); err != nil {
		t.Fatal(err)
	}
	q, err := e.kube.CoreV1().ResourceQuotas(ns).Get(ctx, QuotaName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := q.Spec.Hard["count/apiserviceexportrequests.kube-bind.io"]; got.Value() != 5 {
		t.Errorf("quota after rebind: %v", q.Spec.Hard)
	}
}
