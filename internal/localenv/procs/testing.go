package procs

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kbprovider/backend/internal/testutil/tb"
)

// FreePort is UnusedPort for a test: it fails the test instead of
// returning an error.
func FreePort(t tb.TB) int {
	t.Helper()
	port, err := UnusedPort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// HangingListener listens on a loopback port, accepts connections and
// never answers on them: a peer that is frozen or whose packets are
// dropped, as a client sees it (timeouts, not refusals). It returns the
// address; the listener, its accept loop and the connections end with
// the test.
func HangingListener(t tb.TB) string {
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

// Memory returns the resident memory of process pid now (VmRSS) and at
// its peak (VmHWM), in bytes (MemoryOf), failing the test if it cannot
// be read.
func Memory(t tb.TB, pid int) (rss, peak int64) {
	t.Helper()
	rss, peak, err := MemoryOf(pid)
	if err != nil {
		t.Fatal(err)
	}
	return rss, peak
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// CPUMillicores is the CPU process pid used over window (utime + stime of
// /proc/<pid>/stat), in thousandths of a core.
func CPUMillicores(t tb.TB, pid int, window time.Duration) float64 {
	t.Helper()
	before, start := cpuTicks(t, pid), time.Now()
	time.Sleep(window)
	after, took := cpuTicks(t, pid), time.Since(start)
	return float64(after-before) / clockTicks / took.Seconds() * 1000
}

func cpuTicks(t tb.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command name may hold spaces; the fields after it do not.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	// Fields 14 and 15 of proc(5), counted from the state (field 3).
	utime, err1 := strconv.ParseInt(f[14-3], 10, 64)
	stime, err2 := strconv.ParseInt(f[15-3], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	return utime + stime
}
