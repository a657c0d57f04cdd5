package apirequests

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		method, url, contentType string
		want                     Key
	}{
		{"GET", "/api/v1/namespaces", "", Key{"list", "namespaces"}},
		{"GET", "/api/v1/namespaces?labelSelector=a%3Db&limit=500", "", Key{"list", "namespaces"}},
		{"GET", "/api/v1/namespaces/kb-x", "", Key{"get", "namespaces"}},
		{"PUT", "/api/v1/namespaces/kb-x/finalize", "", Key{"update", "namespaces/finalize"}},
		{"GET", "/api/v1/namespaces/kb-x/secrets", "", Key{"list", "secrets"}},
		{"GET", "/api/v1/secrets?watch=true&resourceVersion=7", "", Key{"watch", "secrets"}},
		{"GET", "/api/v1/watch/namespaces/kb-x/secrets", "", Key{"watch", "secrets"}},
		{"GET", "/api/v1/namespaces/kb-x/secrets/kubeconfig", "", Key{"get", "secrets"}},
		{"POST", "/api/v1/namespaces/kb-x/serviceaccounts/kube-bind-consumer/token", "", Key{"create", "serviceaccounts/token"}},
		{"PATCH", "/apis/kube-bind.io/v1alpha1/namespaces/kb-x/clusterbindings/cluster/status", "application/merge-patch+json", Key{"patch", "clusterbindings/status"}},
		{"PATCH", "/api/v1/namespaces/kb-x/secrets/kubeconfig?fieldManager=x&force=true", "application/apply-patch+yaml", Key{"apply", "secrets"}},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/default/leases/backend", "", Key{"update", "leases"}},
		{"DELETE", "/api/v1/namespaces/kb-x", "", Key{"delete", "namespaces"}},
		{"DELETE", "/api/v1/namespaces/rel/secrets?labelSelector=x", "", Key{"deletecollection", "secrets"}},
		{"POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", "", Key{"create", "selfsubjectreviews"}},
		// Paths that name no resource.
		{"GET", "/version", "", Key{"get", ""}},
		{"GET", "/api", "", Key{"get", ""}},
		{"GET", "/api/v1", "", Key{"get", ""}},
		{"GET", "/apis/kube-bind.io/v1alpha2", "", Key{"get", ""}},
		{"GET", "/openapi/v3", "", Key{"get", ""}},
		// Whatever is not a resource name is not a label value.
		{"GET", "/api/v1/namespaces/kb-x/Secrets%20X", "", Key{"get", ""}},
	} {
		req := httptest.NewRequest(tc.method, tc.url, nil)
		if tc.contentType != "" {
			req.Header.Set("Content-Type", tc.contentType)
		}
		if got := Classify(req); got != tc.want {
			t.Errorf("%s %s: %+v, want %+v", tc.method, tc.url, got, tc.want)
		}
	}
}

// Every request through the wrapped transport is counted once, failed
// ones too, in the metric and in Counts.
func TestWrapCounts(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/missing") {
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c := New("test", "requests")
	client := &http.Client{Transport: c.Wrap(http.DefaultTransport)}
	for _, p := range []string{"/api/v1/namespaces/a/secrets/x", "/api/v1/namespaces/a/secrets/missing", "/api/v1/namespaces"} {
		resp, err := client.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	got := c.Counts()
	if got[Key{"get", "secrets"}] != 2 || got[Key{"list", "namespaces"}] != 1 || len(got) != 2 {
		t.Fatalf("counts %v, want 2 secret GETs and 1 namespace LIST", got)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			l := f.GetName()
			for _, lp := range m.GetLabel() {
				l += " " + lp.GetName() + "=" + lp.GetValue()
			}
			lines = append(lines, fmt.Sprintf("%s %g", l, m.GetCounter().GetValue()))
		}
	}
	want := []string{"test_api_requests_total resource=namespaces verb=list 1", "test_api_requests_total resource=secrets verb=get 2"}
	if !slices.Equal(lines, want) {
		t.Fatalf("metric %q, want %q", lines, want)
	}
}
