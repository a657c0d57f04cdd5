//go:build !linux

package konnector

import "os/exec"

func startInNetns(*exec.Cmd) error { return errUnsupported }
