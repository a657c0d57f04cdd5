package konnector

import (
	"os/exec"
	"syscall"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// startInNetns starts cmd in a new network namespace (we run as root in CI
// and in the dev container), tied to the calling process (procs.StartTied:
// own process group, killed if the caller dies).
func startInNetns(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	return procs.StartTied(cmd)
}
