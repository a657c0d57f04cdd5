// Package upgrade moves a consumer that bound through kube-bind.io/v1alpha1
// with the previous release (commit 1c85617, built from this clone's
// history) across the provider's upgrade to this tree's backend and CRDs,
// and then from konnector v0.4.8 to v0.8.2, with real parts: two control
// planes, the backends as processes, the real OpenID Connect provider and
// chromium, and the released konnectors as processes.
package upgrade

import (
	"os"
	"testing"

	"github.com/kbprovider/backend/internal/testutil/backendproc"
)

func TestMain(m *testing.M) {
	os.Exit(backendproc.RunMain(m))
}
