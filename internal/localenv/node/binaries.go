package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kbprovider/backend/internal/localenv/controlplane"
)

// nodeBinaries are built by hack/install-test-binaries.sh next to the
// control plane's.
var nodeBinaries = []string{"kubelet", "kube-scheduler", "kube-proxy"}

// findNodeBinaries returns the folder of the control plane's and the
// node's binaries: dir, else as the control plane finds its own.
func findNodeBinaries(dir string) (string, error) {
	if dir == "" {
		var err error
		if dir, err = controlplane.FindBinaries(); err != nil {
			return "", err
		}
	}
	var missing []string
	for _, b := range nodeBinaries {
		if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("node: %s lacks %s (a folder of an older hack/install-test-binaries.sh?): run %s and use the folder it prints",
			dir, strings.Join(missing, ", "), controlplane.InstallScript)
	}
	return dir, nil
}
