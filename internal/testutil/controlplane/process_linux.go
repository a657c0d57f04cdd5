package controlplane

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

const (
	sigTerm = syscall.SIGTERM
	sigKill = syscall.SIGKILL
)

var (
	spawnerOnce sync.Once
	spawnerRuns chan func()
)

// startCmd starts cmd in its own process group (so stopping it also stops
// anything it started, and a Ctrl-C on the terminal reaches only the test
// binary, which stops the control plane itself) with Pdeathsig, so the
// kernel kills it if the test binary dies without cleaning up (a panic, a
// timeout, SIGKILL).
//
// Pdeathsig fires when the *thread* that started the child exits, and Go
// may end idle threads. So every child is started from one goroutine locked
// to its own thread, which never returns and keeps that thread alive for
// the life of the test binary.
func startCmd(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
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

func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	if cmd.Process == nil {
		return
	}
	// The negative pid addresses the whole process group.
	if err := syscall.Kill(-cmd.Process.Pid, sig); err != nil {
		_ = cmd.Process.Signal(sig)
	}
}
