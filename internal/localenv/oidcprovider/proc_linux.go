package oidcprovider

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill node when the test binary (or the demo)
// dies, so a crashed or killed test leaves no provider behind. Its own
// process group keeps a Ctrl-C on the terminal away from it: the program
// that started it stops it, in its own order.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
