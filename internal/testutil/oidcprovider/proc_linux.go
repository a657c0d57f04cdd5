package oidcprovider

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill node when the test binary dies, so a
// crashed or killed test leaves no provider behind.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
