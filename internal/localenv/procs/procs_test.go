package procs

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

func TestAliveSeesRunningAndZombieProcesses(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Alive reads /proc, which only Linux has")
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if !Alive(pid) {
		t.Fatalf("a running sleep (pid %d) is not alive", pid)
	}
	// Killed but not yet reaped: a zombie, which counts as dead.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive 10s after SIGKILL", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
		t.Fatalf("pid %d is gone from /proc before it was reaped (%v): the zombie case was not tested", pid, err)
	}
	_ = cmd.Wait()
	if Alive(pid) {
		t.Fatalf("pid %d alive after it was reaped", pid)
	}
}

// Ports handed out in one process are all different, even though the
// kernel may give a just-closed ephemeral port again.
func TestUnusedPortNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 2000 {
		p, err := UnusedPort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
