// Package konnector is internal/localenv/konnector for tests: a konnector
// that is stopped when the test ends, and helpers that fail the test
// instead of returning an error; also the released kubectl-bind, run and
// driven through its browser parts (cli.go).
package konnector

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/localenv/konnector"
)

type (
	// Options configure Start.
	Options = konnector.Options
	// Konnector is a running konnector.
	Konnector = konnector.Konnector
)

// Start starts the konnector for the test and stops it when the test ends.
// When the test failed, its log is shown.
func Start(t testing.TB, o Options) *Konnector {
	t.Helper()
	k, err := konnector.Run(o)
	if err != nil {
		t.Fatalf("konnector: %v", err)
	}
	t.Cleanup(func() {
		k.Stop()
		if t.Failed() {
			t.Logf("konnector log:\n%s", k.Log())
		}
	})
	return k
}

// ReleasedBinary returns the path of the released kube-bind binary name
// ("konnector" or "kubectl-bind"), checked against its sum; it fails the
// test when the release folder cannot be found or a sum does not match.
func ReleasedBinary(t testing.TB, name string) string {
	t.Helper()
	return ReleasedBinaryOf(t, konnector.ReleasedVersion, name)
}

// ReleasedBinaryOf is ReleasedBinary of another release (e.g.
// konnector.ReleasedV1alpha2).
func ReleasedBinaryOf(t testing.TB, release, name string) string {
	t.Helper()
	p, err := konnector.ReleasedPathOf(release, name)
	if err != nil {
		t.Fatalf("released kube-bind %s: %v", release, err)
	}
	return p
}

// TokenWhenDeployed is konnector.TokenWhenDeployed: a token of the
// konnector's ServiceAccount once kube-bind-poll has deployed it.
func TokenWhenDeployed(ctx context.Context, kube kubernetes.Interface, ttl time.Duration, giveUp <-chan struct{}) (string, error) {
	return konnector.TokenWhenDeployed(ctx, kube, ttl, giveUp)
}
