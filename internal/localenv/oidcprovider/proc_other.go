//go:build !linux

package oidcprovider

import "os/exec"

func setProcAttr(*exec.Cmd) {}
