// Package benchutil holds what the load tools under hack/ share: server
// processes tied to the tool and waited for, their CPU time and memory
// from /proc, the API server's request counts, and percentiles.
package benchutil

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kbprovider/backend/internal/localenv/procs"
)

// ClockTick is USER_HZ, the unit of /proc's CPU times: 100 on Linux for
// every architecture Go supports but alpha and ia64.
const ClockTick = 100

// CPUTicks is the CPU time (user and system, all threads) of a process,
// in clock ticks.
func CPUTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; the fields after it are fixed.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	return utime + stime, nil
}

// CPUList parses a CPU list in taskset's syntax: "0", "0,2", "0-3".
func CPUList(list string) ([]int, error) {
	var cpus []int
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a < 0 || b < a {
			return nil, fmt.Errorf("CPU list %q: want taskset's syntax, e.g. 0 or 0-1", list)
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// CPUBusy is the busy time of cpus, from /proc/stat, in clock ticks:
// everything but idle and iowait, steal included (the CPU was not ours).
func CPUBusy(cpus []int) (int64, error) {
	want := map[string]bool{}
	for _, c := range cpus {
		want["cpu"+strconv.Itoa(c)] = true
	}
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	var busy int64
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !want[f[0]] {
			continue
		}
		// user nice system idle iowait irq softirq steal
		for i, v := range f[1:9] {
			if i == 3 || i == 4 {
				continue
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			busy += n
		}
	}
	return busy, nil
}

// ChildrenNamed returns the process IDs of this process's children whose
// command name (/proc/<pid>/comm, at most 15 bytes) is in names.
func ChildrenNamed(names map[string]bool) []int {
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		comm := s[open+1 : end]
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == self && names[comm] {
			pids = append(pids, pid)
		}
	}
	return pids
}

// APIRequests reads the API server's request counter
// (apiserver_request_total) through rc, by "VERB resource" or "VERB
// /path" (ParseAPIRequests).
func APIRequests(ctx context.Context, rc rest.Interface) (map[string]float64, error) {
	b, err := rc.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	return ParseAPIRequests(string(b)), nil
}

// ParseAPIRequests sums apiserver_request_total of an API server's
// /metrics by verb and resource ("LIST secrets", "PATCH
// namespaces/status"), all other labels (codes, scopes, components)
// added up. Reads of /metrics itself are left out: they are the
// measurement's.
func ParseAPIRequests(metrics string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		l := map[string]string{}
		for _, kv := range strings.Split(labels, ",") {
			k, val, _ := strings.Cut(kv, "=")
			l[k] = strings.Trim(val, `"`)
		}
		what := l["resource"]
		if l["subresource"] != "" {
			what = strings.TrimPrefix(what+"/"+l["subresource"], "/")
			if what == "metrics" || strings.HasSuffix(what, "/metrics") {
				continue
			}
		}
		out[l["verb"]+" "+what] += v
	}
	return out
}

// Sub returns after minus before, keys whose difference is not positive
// left out.
func Sub(after, before map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after {
		if x := v - before[k]; x > 0 {
			d[k] = x
		}
	}
	return d
}

// MetricSum fetches a Prometheus text page at metricsURL and sums the
// series of every metric whose name ends in suffix; 0 when it does not
// answer.
func MetricSum(metricsURL, suffix string) float64 {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(metricsURL) //nolint:noctx // bounded by the client's Timeout; a bench's one-off read has nothing to cancel it
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var sum float64
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		if !strings.HasSuffix(name, suffix) {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// Quantile is the q-quantile (0 < q <= 1) of sorted by nearest rank: the
// smallest value that at least q of the values do not exceed; 0 for none.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// ProcessOptions say how to start a server process.
type ProcessOptions struct {
	// Argv is the command and its arguments.
	Argv []string
	// Env is added to this process's environment.
	Env []string
	// Out receives its output; nil keeps the last MiB (Logs).
	Out io.Writer
	// ReadyURL is polled until it answers ReadyStatus, for up to
	// ReadyWithin (default 60 s).
	ReadyURL    string
	ReadyStatus int
	ReadyWithin time.Duration
}

// Process is a server process started by StartProcess, tied to this one
// (procs.StartTied: killed by the kernel if this process dies).
type Process struct {
	cmd     *exec.Cmd
	logsMu  sync.Mutex
	logs    bytes.Buffer
	exited  chan struct{}
	waitErr error
}

// StartProcess starts a server and waits until it is ready; a server
// that exits first or is not ready in time is stopped, and its output
// is in the error.
func StartProcess(o ProcessOptions) (*Process, error) {
	p := &Process{cmd: exec.Command(o.Argv[0], o.Argv[1:]...), exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), o.Env...)
	out := o.Out
	if out == nil {
		out = lockedWriter{p}
	}
	p.cmd.Stdout, p.cmd.Stderr = out, out
	if err := procs.StartTied(p.cmd); err != nil {
		return nil, err
	}
	go func() { p.waitErr = p.cmd.Wait(); close(p.exited) }()
	within := o.ReadyWithin
	if within == 0 {
		within = 60 * time.Second
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(within)
	for {
		resp, err := client.Get(o.ReadyURL) //nolint:noctx // bounded by the client's Timeout and the loop's deadline
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == o.ReadyStatus {
				return p, nil
			}
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("%s exited (%w): %s", o.Argv[0], p.waitErr, p.Logs())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("%s not ready after %s: %s", o.Argv[0], within, p.Logs())
		}
	}
}

type lockedWriter struct{ p *Process }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.p.logsMu.Lock()
	defer w.p.logsMu.Unlock()
	if w.p.logs.Len() > 1<<20 {
		return len(b), nil
	}
	return w.p.logs.Write(b)
}

// PID is the process's ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Logs is what it wrote (its first MiB), unless ProcessOptions.Out took it.
func (p *Process) Logs() string {
	p.logsMu.Lock()
	defer p.logsMu.Unlock()
	return p.logs.String()
}

// Stop sends SIGTERM and waits until the process has exited, sending
// SIGKILL after 30 s.
func (p *Process) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM) // an error: it has exited already, which <-p.exited sees
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		p.Kill()
	}
}

// Kill sends SIGKILL, as a crash or an OOM kill ends a pod, and waits
// until the process has exited.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL) // an error: it has exited already, which <-p.exited sees
	<-p.exited
}
