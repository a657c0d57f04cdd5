package procs

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

// StartTied starts cmd in its own process group (stopping the group stops
// what it started, and a Ctrl-C on the terminal reaches only the parent:
// the test binary or the demo) with Pdeathsig, so the kernel kills it if
// the parent dies without cleaning up (a panic, a timeout, SIGKILL). Other fields of
// cmd.SysProcAttr (e.g. Cloneflags) are kept.
//
// Pdeathsig fires when the *thread* that started the child exits, and Go
// may end idle threads. So every child is started from one goroutine locked
// to its own thread, which never returns and keeps that thread alive for
// the life of the process.
func StartTied(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
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
