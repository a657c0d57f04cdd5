package kbcache

import (
	"runtime"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// A consumer's ClusterBinding as a konnector keeps it, the kind every
// consumer has and the one with the most status.
const sampleClusterBinding = `{"apiVersion":"kube-bind.io/v1alpha2","kind":"ClusterBinding","metadata":{
"name":"cluster","namespace":"kube-bind-7f3c9a1e2b4d","uid":"0f9d5a62-6a1c-4c38-9d8e-2f3b1c4d5e6f",
"resourceVersion":"123456","generation":1,"creationTimestamp":"2026-12-01T10:00:00Z",
"labels":{"app.kubernetes.io/managed-by":"kube-bind-backend"},
"annotations":{"kube-bind.io/bound-by":"alice@example.com","kube-bind.io/bound-at":"2026-12-01T10:00:00Z",
"kube-bind.io/provisioned-at":"2026-12-01T10:00:00Z","kube-bind.io/delivered-at":"2026-12-01T10:00:05Z",
"kube-bind.io/credentials-settled":"v1;kube-bind-token-abcde;2026-12-01T22:00:00Z;2026-12-02T10:00:00Z"}},
"spec":{"kubeconfigSecretRef":{"name":"kubeconfig","key":"kubeconfig"},"providerPrettyName":"Example"},
"status":{"lastHeartbeatTime":"2026-12-01T11:00:00Z","heartbeatInterval":"2m30s","konnectorVersion":"v0.8.2",
"conditions":[
{"type":"Ready","status":"True","lastTransitionTime":"2026-12-01T10:00:10Z"},
{"type":"Healthy","status":"True","reason":"HeartbeatSeen","message":"the konnector sent a heartbeat 10s ago","lastTransitionTime":"2026-12-01T10:00:10Z"},
{"type":"CredentialsValid","status":"True","reason":"Current","message":"the kubeconfig holds token kube-bind-token-abcde, valid until 2026-12-02T10:00:00Z","lastTransitionTime":"2026-12-01T10:00:10Z"},
{"type":"SecretValid","status":"True","lastTransitionTime":"2026-12-01T10:00:10Z"}]}}`

// BenchmarkCachedSize is what the cache holds per ClusterBinding
// (B/object, the live heap after a collection) as unstructured maps and
// as a Compact, both trimmed alike.
func BenchmarkCachedSize(b *testing.B) {
	opts := Options{Labels: []string{"app.kubernetes.io/managed-by"}, Drop: [][]string{{"spec"}},
		Annotations: []string{"kube-bind.io/bound-by", "kube-bind.io/bound-at", "kube-bind.io/provisioned-at",
			"kube-bind.io/delivered-at", "kube-bind.io/credentials-settled"}}
	const n = 2000
	measure := func(b *testing.B, decode func() any) {
		for b.Loop() {
			kept := make([]any, n)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for i := range kept {
				kept[i] = decode()
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/object")
			runtime.KeepAlive(kept)
		}
	}
	b.Run("unstructured", func(b *testing.B) {
		measure(b, func() any {
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON([]byte(sampleClusterBinding)); err != nil {
				b.Fatal(err)
			}
			u.SetManagedFields(nil)
			u.SetAnnotations(only(u.GetAnnotations(), opts.Annotations))
			u.SetLabels(only(u.GetLabels(), opts.Labels))
			trim(u.Object, opts)
			return u
		})
	})
	b.Run("compact", func(b *testing.B) {
		measure(b, func() any {
			c := &Compact[widget]{}
			if err := c.UnmarshalJSON([]byte(sampleClusterBinding)); err != nil {
				b.Fatal(err)
			}
			out, err := Transform(opts)(c)
			if err != nil {
				b.Fatal(err)
			}
			return out
		})
	})
}

// BenchmarkUnstructured is what a reader pays to get a cached
// ClusterBinding as unstructured.
func BenchmarkUnstructured(b *testing.B) {
	c := &Compact[widget]{}
	if err := c.UnmarshalJSON([]byte(sampleClusterBinding)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Unstructured(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeBody is what a reader of two status fields pays per
// cached ClusterBinding (the metrics read every one at every scrape).
func BenchmarkDecodeBody(b *testing.B) {
	c := &Compact[widget]{}
	if err := c.UnmarshalJSON([]byte(sampleClusterBinding)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		var body struct {
			Status struct {
				LastHeartbeatTime any `json:"lastHeartbeatTime"`
				HeartbeatInterval any `json:"heartbeatInterval"`
			} `json:"status"`
		}
		if err := c.DecodeBody(&body); err != nil || body.Status.LastHeartbeatTime == nil {
			b.Fatal(err)
		}
	}
}
