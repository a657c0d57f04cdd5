//go:build !linux

package konnector

import (
	"errors"
	"os/exec"
)

func startInNetns(*exec.Cmd) error { return errors.New("network namespaces need Linux") }
