// Package procs holds what the local environment and the tests need to
// run the project's commands as real processes: building a command, free
// loopback ports, random keys, starting a child tied to its parent, and a
// buffer that collects a process's output while another goroutine reads
// it. testing.go and command.go add what only tests use: helpers that
// fail the test instead of returning an error, a command under test read
// line by line, a process's memory and CPU.
package procs

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
)

// RepoRoot is the root of this repository.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// PrebuiltEnv names, for the commands several test packages run, the
// environment variable that may hold the path of a build of it made once
// for the whole suite (hack/test.sh does), so that each package does not
// link its own.
var PrebuiltEnv = map[string]string{
	"./cmd/backend":        "KUBE_BIND_TEST_BACKEND_BINARY",
	"./cmd/kube-bind-poll": "KUBE_BIND_TEST_POLL_BINARY",
}

// Build builds the command in pkg (a path relative to the repository root,
// e.g. "./cmd/backend") into a new temporary folder and returns the
// binary's path and a function that removes the folder. Without
// extraArgs, a build named by pkg's PrebuiltEnv variable is put there
// instead (hard-linked, else copied).
func Build(pkg string, extraArgs ...string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "procs-build-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	bin := filepath.Join(dir, filepath.Base(pkg))
	if prebuilt := os.Getenv(PrebuiltEnv[pkg]); prebuilt != "" && len(extraArgs) == 0 {
		if err := linkOrCopy(prebuilt, bin); err != nil {
			cleanup()
			return "", nil, fmt.Errorf("%s=%s: %w", PrebuiltEnv[pkg], prebuilt, err)
		}
		return bin, cleanup, nil
	}
	args := append([]string{"build", "-o", bin}, extraArgs...)
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	return bin, cleanup, nil
}

// ParallelSetEnv is set by hack/test.sh for the test packages it runs
// several at a time, the ones whose tests import none of the real parts
// (control plane, node, konnector, identity provider, browser). Each part
// refuses to start under it (RefuseInParallelSet): a package that starts
// one by another way fails instead of loading the machine unaccounted.
const ParallelSetEnv = "KUBE_BIND_TEST_PARALLEL_SET"

// RefuseInParallelSet returns an error naming part when ParallelSetEnv is
// set.
func RefuseInParallelSet(part string) error {
	if os.Getenv(ParallelSetEnv) == "" {
		return nil
	}
	return fmt.Errorf("%s started by a test package that hack/test.sh runs among the packages without real parts (%s is set): its test imports must name the part's package, which puts it among the packages that start them", part, ParallelSetEnv)
}

// linkOrCopy makes dst the executable file src: a hard link, or a copy
// where src is on another file system.
func linkOrCopy(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("not an executable file")
	}
	if os.Link(src, dst) == nil {
		return nil
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755)
}

// UnusedPort returns a loopback TCP port nothing listens on right now, and
// never one it returned before in this process: the kernel may hand the
// same ephemeral port to two listens in a row once the first is closed,
// and two parts of a test given one port clash (a replica's public and
// peer listeners did, in CI).
func UnusedPort() (int, error) {
	givenMu.Lock()
	defer givenMu.Unlock()
	for range 1000 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !given[port] {
			given[port] = true
			return port, nil
		}
	}
	return 0, errors.New("procs.UnusedPort: no port that was not handed out before")
}

var (
	givenMu sync.Mutex
	given   = map[int]bool{}
)

// Alive reports whether process pid runs, as /proc shows it (Linux only:
// elsewhere it reports false); a zombie, dead but not yet reaped, counts as
// dead.
func Alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

// RandomKey returns n random bytes in standard base64, the form the
// backend's key flags take. crypto/rand never fails on supported
// platforms, so neither does RandomKey.
func RandomKey(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

// Buffer collects output written concurrently (a process's stdout and
// stderr, a server's logs) while another goroutine (a test) reads it.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// MemoryOf returns the resident memory of process pid now (VmRSS) and at
// its peak (VmHWM), in bytes, from /proc/<pid>/status.
func MemoryOf(pid int) (rss, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(string(b)) {
		fields := strings.Fields(line)
		if len(fields) != 3 || fields[2] != "kB" {
			continue
		}
		n, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			rss = n << 10
		case "VmHWM:":
			peak = n << 10
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return rss, peak, nil
}
