package controlplane

import (
	"os/exec"
	"syscall"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

const (
	sigTerm = syscall.SIGTERM
	sigKill = syscall.SIGKILL
)

// startCmd starts cmd tied to the caller (procs.StartTied): in its own
// process group, killed by the kernel if the caller (test binary, demo) dies.
func startCmd(cmd *exec.Cmd) error { return procs.StartTied(cmd) }

func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	if cmd.Process == nil {
		return
	}
	// The negative pid addresses the whole process group.
	if err := syscall.Kill(-cmd.Process.Pid, sig); err != nil {
		_ = cmd.Process.Signal(sig)
	}
}
