package binding

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Wall time of one Provision against the local API server, for a new
// consumer (namespace, grant, service account, RBAC, token Secret and
// TokenRequest token, kubeconfig, ClusterBinding) and for a returning one
// (everything exists; re-applied).
func BenchmarkProvision(b *testing.B) {
	e := setup(b)
	ctx := context.Background()
	p := newProvisioner(b, e, e.backend, ScopeNamespaced)
	b.Run("new", func(b *testing.B) {
		// Unique across -count runs and test binaries sharing a cluster.
		run := time.Now().UnixNano()
		for i := 0; b.Loop(); i++ {
			c := Consumer{Issuer: issuer, Subject: fmt.Sprintf("bench-new-%d-%d", run, i)}
			if _, err := p.Provision(ctx, c, "cid", []Resource{widgets}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("returning", func(b *testing.B) {
		c := Consumer{Issuer: issuer, Subject: "bench-returning"}
		if _, err := p.Provision(ctx, c, "cid", []Resource{widgets}); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := p.Provision(ctx, c, "cid", []Resource{widgets}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
