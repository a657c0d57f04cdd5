package procs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
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

func TestBuildUsesThePrebuiltCommand(t *testing.T) {
	prebuilt := filepath.Join(t.TempDir(), "prebuilt-backend")
	if err := os.WriteFile(prebuilt, []byte("#!/bin/sh\necho prebuilt\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(PrebuiltEnv["./cmd/backend"], prebuilt)
	bin, cleanup, err := Build("./cmd/backend")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(bin) != "backend" || filepath.Dir(bin) == filepath.Dir(prebuilt) {
		t.Errorf("Build gave %s, want a backend of its own folder", bin)
	}
	if out, err := exec.Command(bin).Output(); err != nil || string(out) != "prebuilt\n" {
		t.Errorf("running %s: %q, %v; want the prebuilt command", bin, out, err)
	}
	cleanup()
	if _, err := os.Stat(filepath.Dir(bin)); !os.IsNotExist(err) {
		t.Errorf("cleanup left %s: %v", filepath.Dir(bin), err)
	}
	if _, err := os.Stat(prebuilt); err != nil {
		t.Errorf("cleanup removed the prebuilt command: %v", err)
	}

	t.Setenv(PrebuiltEnv["./cmd/backend"], filepath.Join(t.TempDir(), "missing"))
	if _, _, err := Build("./cmd/backend"); err == nil || !strings.Contains(err.Error(), PrebuiltEnv["./cmd/backend"]) {
		t.Errorf("a prebuilt command that is missing: %v, want an error naming the variable", err)
	}
}
