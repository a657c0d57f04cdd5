//go:build !linux

package procs

import "os/exec"

// StartTied starts cmd. Without Linux's Pdeathsig, a parent (test binary, demo) that dies
// without cleaning up may leave cmd running.
func StartTied(cmd *exec.Cmd) error { return cmd.Start() }
