// Package chart_test checks the Helm chart in charts/kube-bind-backend with
// the real helm binary: lint, template with several value sets (assertions
// on the rendered objects), the schema and checks refusing bad values, and an
// install into a real API server whose RBAC is then probed with kubectl.
package chart_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
)

func TestMain(m *testing.M) {
	code := controlplane.RunMain(m)
	if helmHome != "" {
		os.RemoveAll(helmHome)
	}
	if backendBin != "" {
		os.RemoveAll(filepath.Dir(backendBin))
	}
	os.Exit(code)
}
