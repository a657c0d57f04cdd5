package konnector

import (
	"os/exec"
	"syscall"

	"github.com/kbprovider/backend/internal/testutil/procs"
)

// startInNetns starts cmd in a new network namespace (we run as root in CI
// and in the dev container), tied to the test binary (procs.StartTied: own
// process group, killed if the test binary dies).
func startInNetns(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	return procs.StartTied(cmd)
}
