//go:build !unix

package main

func openFileLimit() (uint64, bool) { return 0, false }
