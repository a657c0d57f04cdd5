package benchutil

import (
	"testing"
	"time"
)

func TestQuantileNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{0.5, 50 * time.Millisecond},
		{0.9, 90 * time.Millisecond},
		{0.99, 99 * time.Millisecond},
		{1, 100 * time.Millisecond},
		{0.001, 1 * time.Millisecond},
	} {
		if got := Quantile(ds, c.q); got != c.want {
			t.Errorf("Quantile(1..100ms, %v) = %s, want %s", c.q, got, c.want)
		}
	}
	// Few values: p99 of three is the largest, never one past it.
	three := []time.Duration{1, 2, 3}
	if got := Quantile(three, 0.99); got != 3 {
		t.Errorf("p99 of 1,2,3 = %d, want 3", got)
	}
	if got := Quantile(three, 0.5); got != 2 {
		t.Errorf("p50 of 1,2,3 = %d, want 2", got)
	}
	if got := Quantile(nil, 0.5); got != 0 {
		t.Errorf("Quantile of none = %d, want 0", got)
	}
}

func TestParseAPIRequests(t *testing.T) {
	metrics := `# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="secrets",scope="namespace",subresource="",verb="POST",version="v1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="secrets",scope="namespace",subresource="",verb="POST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="namespaces",scope="resource",subresource="status",verb="PATCH",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="",scope="",subresource="/openapi/v3",verb="GET",version=""} 1
apiserver_request_duration_seconds_count{resource="secrets",verb="POST"} 99
`
	got := ParseAPIRequests(metrics)
	want := map[string]float64{"POST secrets": 9, "PATCH namespaces/status": 3, "GET /openapi/v3": 1}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	d := Sub(map[string]float64{"POST secrets": 12, "GET /openapi/v3": 1}, got)
	if len(d) != 1 || d["POST secrets"] != 3 {
		t.Errorf("Sub = %v, want only POST secrets 3", d)
	}
}
