// Package procs is internal/localenv/procs for tests: the same helpers, and
// those that can fail take the test and fail it instead of returning an
// error.
package procs

import (
	"net"
	"sync"
	"testing"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// Buffer collects output written concurrently while a test reads it.
type Buffer = procs.Buffer

// RepoRoot is the root of this repository.
func RepoRoot() string { return procs.RepoRoot() }

// Build builds the command in pkg (relative to the repository root) into a
// new temporary folder; for TestMain, which has no testing.TB.
func Build(pkg string, extraArgs ...string) (string, func(), error) {
	return procs.Build(pkg, extraArgs...)
}

// Alive reports whether process pid runs (a zombie counts as dead).
func Alive(pid int) bool { return procs.Alive(pid) }

// FreePort returns a loopback TCP port nothing listens on right now and
// never handed out before in this process, or fails the test.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// RandomKey returns n random bytes in standard base64, the form the
// backend's key flags take, or fails the test.
func RandomKey(t testing.TB, n int) string {
	t.Helper()
	key, err := procs.RandomKey(n)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// HangingListener listens on a loopback port, accepts connections and
// never answers on them: a peer that is frozen or whose packets are
// dropped, as a client sees it (timeouts, not refusals). It returns the
// address; the listener, its accept loop and the connections end with
// the test.
func HangingListener(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}
