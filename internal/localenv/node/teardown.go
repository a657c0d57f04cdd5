package node

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// hostState is what the node may add to fixed host paths that existed
// before it: only what it added is removed.
type hostState struct {
	netns   map[string]bool // /run/netns entries
	created []string        // fixed paths that did not exist before
}

// fixedPaths are host paths the kubelet and containerd use whatever their
// configuration says.
var fixedPaths = []string{"/var/log/pods", "/var/log/containers", "/var/lib/kubelet", "/run/containerd", "/var/lib/cni", "/run/netns"}

func recordHost() hostState {
	h := hostState{netns: map[string]bool{}}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		h.netns[e.Name()] = true
	}
	for _, p := range fixedPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			h.created = append(h.created, p)
		}
	}
	return h
}

// Stop stops the cluster and undoes everything Start did; it reports what
// it could not undo. Calling it again does nothing.
func (n *Node) Stop() error {
	if n.stopped {
		return n.stopErrs
	}
	n.stopped = true
	var errs []error
	// The kubelet first, else it restarts what is killed below.
	for i := len(n.procs) - 1; i >= 1; i-- {
		n.procs[i].stop(10 * time.Second)
	}
	errs = append(errs, killPods())
	if len(n.procs) > 0 {
		n.procs[0].stop(10 * time.Second) // containerd
	}
	errs = append(errs, killShims())
	if n.cp != nil {
		n.cp.Stop()
	}
	errs = append(errs, unmountUnder(stateDir, dataDir, "/run/containerd", "/var/lib/kubelet"))
	// Sandboxes' network namespaces (their veths go with them).
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if !n.before.netns[e.Name()] && strings.HasPrefix(e.Name(), "cni-") {
			p := filepath.Join("/run/netns", e.Name())
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
			errs = append(errs, os.Remove(p))
		}
	}
	errs = append(errs, removeNodeState(), removeCgroups())
	for _, p := range n.before.created {
		errs = append(errs, unmountUnder(p), os.RemoveAll(p))
	}
	errs = append(errs, removeGuard(), restoreSysctls(n.sysctls))
	if diff := sysctlsDiffer(n.sysctls); len(diff) > 0 {
		errs = append(errs, fmt.Errorf("sysctls not restored: %s", strings.Join(diff, ", ")))
	}
	if n.lock != nil {
		os.Remove(lockFile)
		n.lock.Close()
	}
	n.stopErrs = errors.Join(errs...)
	if n.stopErrs != nil {
		n.stopErrs = fmt.Errorf("node: teardown: %w", n.stopErrs)
	}
	return n.stopErrs
}

// cleanLeftovers removes what a node whose process died left behind (its
// processes died with it; container shims and host state did not).
func cleanLeftovers() error {
	_, err := os.Stat(stateDir)
	_, linkErr := os.Stat("/sys/class/net/" + Bridge)
	if errors.Is(err, os.ErrNotExist) && linkErr != nil {
		return nil
	}
	return errors.Join(killPods(), killShims(), unmountUnder(stateDir, dataDir), removeNodeState(), removeCgroups())
}

// removeNodeState deletes the node's links, kube-proxy's nft tables, the
// CNI's cache of this network and the node's fixed folders.
func removeNodeState() error {
	var errs []error
	for _, link := range []string{Bridge} {
		if _, err := os.Stat("/sys/class/net/" + link); err == nil {
			if out, err := exec.Command("ip", "link", "del", link).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("ip link del %s: %w: %s", link, err, out))
			}
		}
	}
	for _, family := range []string{"ip", "ip6"} {
		if exec.Command("nft", "list", "table", family, "kube-proxy").Run() == nil {
			if out, err := exec.Command("nft", "delete", "table", family, "kube-proxy").CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("nft delete table %s kube-proxy: %w: %s", family, err, out))
			}
		}
	}
	cached, _ := filepath.Glob("/var/lib/cni/results/" + cniNetwork + "-*")
	for _, p := range append(cached, stateDir, dataDir) {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cgroupDirs are the node's cgroup folders in every v1 hierarchy.
func cgroupDirs() []string {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupRoot)
	return dirs
}

// killPods kills every process in the node's cgroups; a frozen cgroup is
// thawed first (a frozen process does not die).
func killPods() error {
	for _, d := range cgroupDirs() {
		if filepath.Base(filepath.Dir(d)) == "freezer" {
			_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
				if err == nil && e.IsDir() {
					_ = os.WriteFile(filepath.Join(p, "freezer.state"), []byte("THAWED"), 0o644)
				}
				return nil
			})
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := cgroupPIDs()
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes of the node's pods still alive: %v", pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func cgroupPIDs() []int {
	var pids []int
	for _, d := range cgroupDirs() {
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() || e.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// removeCgroups removes the node's cgroups, deepest first.
func removeCgroups() error {
	var errs []error
	for _, d := range cgroupDirs() {
		var dirs []string
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// killShims kills the container shims of the node's containerd by PID:
// they outlive containerd. They are known by the socket they were given.
func killShims() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := shimPIDs()
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("container shims still alive: %v", pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func shimPIDs() []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 0 && strings.Contains(filepath.Base(args[0]), "containerd-shim") && slices.Contains(args, containerdSocket) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// unmountUnder detaches every mount at or below the given folders,
// deepest first.
func unmountUnder(roots ...string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		for _, r := range roots {
			if mp == r || strings.HasPrefix(mp, r+"/") {
				points = append(points, mp)
			}
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount decodes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Leftovers lists what of a node is still on this machine: after Stop,
// nothing should be.
func Leftovers() []string {
	var left []string
	for _, p := range []string{stateDir, dataDir, lockFile, "/sys/class/net/" + Bridge} {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, p)
		}
	}
	left = append(left, cgroupDirs()...)
	if pids := shimPIDs(); len(pids) > 0 {
		left = append(left, fmt.Sprintf("container shims %v", pids))
	}
	for _, t := range [][]string{{"inet", guardTable}, {"ip", "kube-proxy"}, {"ip6", "kube-proxy"}} {
		if exec.Command("nft", "list", "table", t[0], t[1]).Run() == nil {
			left = append(left, "nft table "+strings.Join(t, " "))
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && (strings.HasPrefix(f[4], stateDir) || strings.HasPrefix(f[4], dataDir)) {
				left = append(left, "mount "+f[4])
			}
		}
	}
	return left
}
