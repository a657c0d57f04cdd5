//go:build unix

package main

import "syscall"

// openFileLimit returns the process's soft limit of open files (Go raises
// it to the hard limit at start-up).
func openFileLimit() (uint64, bool) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, false
	}
	return uint64(r.Cur), true
}
