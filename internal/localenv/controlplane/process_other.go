//go:build !linux

package controlplane

import (
	"os"
	"os/exec"
)

var (
	sigTerm os.Signal = os.Interrupt
	sigKill os.Signal = os.Kill
)

// startCmd starts cmd. Without Linux's Pdeathsig, a caller (test binary, demo) that dies
// without cleaning up may leave the servers running.
func startCmd(cmd *exec.Cmd) error { return cmd.Start() }

func signalGroup(cmd *exec.Cmd, sig os.Signal) {
	if cmd.Process != nil {
		_ = cmd.Process.Signal(sig)
	}
}
