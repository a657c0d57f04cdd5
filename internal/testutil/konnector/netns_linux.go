package konnector

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

var (
	spawnerOnce sync.Once
	spawnerRuns chan func()
)

// startInNetns starts cmd in a new network namespace (we run as root in CI
// and in the dev container) and its own process group, with the
// parent-death signal so a crashed test binary leaves nothing behind.
// Pdeathsig fires when the thread that started the child ends, so every
// child starts from one goroutine locked to a thread that never ends.
func startInNetns(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET,
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
	}
	spawnerOnce.Do(func() {
		spawnerRuns = make(chan func())
		go func() {
			runtime.LockOSThread()
			for run := range spawnerRuns {
				run()
			}
		}()
	})
	errc := make(chan error, 1)
	spawnerRuns <- func() { errc <- cmd.Start() }
	return <-errc
}
