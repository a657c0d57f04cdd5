package chart_test

import (
	"os/exec"
	"regexp"
	"sort"
	"sync"
	"testing"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

var (
	backendOnce sync.Once
	backendBin  string
	backendErr  error
)

// backendBinary builds cmd/backend once for the package (TestMain removes
// its folder).
func backendBinary(t *testing.T) string {
	t.Helper()
	backendOnce.Do(func() { backendBin, _, backendErr = procs.Build("./cmd/backend") })
	if backendErr != nil {
		t.Fatalf("building cmd/backend: %v", backendErr)
	}
	return backendBin
}

// backendFlags are the flag names the backend's usage lists.
func backendFlags(t *testing.T) map[string]bool {
	t.Helper()
	out, _ := exec.Command(backendBinary(t), "-h").CombinedOutput() // -h exits non-zero by design
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+--?([a-z0-9][-a-z0-9]*)`).FindAllSubmatch(out, -1) {
		known["--"+string(m[1])] = true
	}
	if len(known) < 10 {
		t.Fatalf("could not read the backend's flags from its -h output:\n%s", out)
	}
	return known
}

// Every flag the chart passes, in every configuration, is one the backend
// has: a renamed flag fails here instead of crash-looping pods.
func TestChartFlagsAreBackendFlags(t *testing.T) {
	known := backendFlags(t)
	used := map[string]bool{}
	for _, sets := range [][]string{
		nil,
		{"replicaCount=1"},
		{"tls.enabled=true", "tls.existingSecret=tls", "oidc.callbackURL=https://bind.example.com/cb",
			"providerCluster.externalAddress=https://api.example.com:6443", "providerCluster.externalCA=-----BEGIN CERTIFICATE-----",
			"providerCluster.externalServerName=api", "oidc.allowedUsers[0]=alice", "oidc.allowedGroups[0]=admins",
			"callbackAllowedURLs[0]=https://cli.example.com/cb"},
		{"callbackFlow=false"},
	} {
		for name := range flags(t, render(t, sets...)) {
			used[name] = true
		}
	}
	var missing []string
	for name := range used {
		if !known[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("the chart passes flags cmd/backend does not define: %v", missing)
	}
	t.Logf("the chart uses %d of the backend's %d flags", len(used), len(known))
}
