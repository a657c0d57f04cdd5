package controlplane

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// BinariesEnv names the folder holding etcd, kube-apiserver,
// kube-controller-manager, kubectl (and helm): the last line
// hack/install-test-binaries.sh prints. hack/test.sh sets it.
const BinariesEnv = "KUBE_BIND_TEST_BINARIES"

// InstallScript builds the binaries once and caches them.
const InstallScript = "hack/install-test-binaries.sh"

var requiredBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kubectl"}

// findBinaries returns the folder of the test binaries: $KUBE_BIND_TEST_BINARIES,
// else the cache folder of hack/install-test-binaries.sh if that already holds
// them (asked with --print-dir, which never builds: a test must not start a
// build of several minutes by surprise).
func findBinaries() (string, error) {
	if dir := os.Getenv(BinariesEnv); dir != "" {
		if err := checkBinaries(dir); err != nil {
			return "", fmt.Errorf("%s=%s: %w; run %s and set %s to the folder it prints (or run hack/test.sh)",
				BinariesEnv, dir, err, InstallScript, BinariesEnv)
		}
		return dir, nil
	}
	var stderr bytes.Buffer
	cmd := exec.Command("bash", filepath.Join(procs.RepoRoot(), InstallScript), "--print-dir")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("the test binaries (etcd, kube-apiserver, kube-controller-manager, kubectl) are not built: "+
			"run %s once (a few minutes; then cached) or hack/test.sh (%v: %s)",
			InstallScript, err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := lines[len(lines)-1]
	if err := checkBinaries(dir); err != nil {
		return "", fmt.Errorf("%s printed %s but %w; run %s", InstallScript, dir, err, InstallScript)
	}
	return dir, nil
}

// FindBinaries finds the test binaries as Start does (the node's
// package, internal/localenv/node, looks for its own beside them).
func FindBinaries() (string, error) { return findBinaries() }

func checkBinaries(dir string) error {
	var missing []string
	for _, b := range requiredBinaries {
		st, err := os.Stat(filepath.Join(dir, b))
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s", strings.Join(missing, ", "))
	}
	return nil
}
