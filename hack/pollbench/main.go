// Command pollbench measures what a pending poll costs the backend, as
// separate processes: one replica, and two replicas in a hashring with
// every poll sent to one of them (so about half are forwarded to the
// other, their owner). The backends run pinned to one CPU with
// GOMAXPROCS=1, this load generator on another; it reports polls per
// second and the backends' CPU time per poll (from /proc), and the ratio
// of the two set-ups. README.md says how to run it and what it measured.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kbprovider/backend/internal/hmac"
)

type options struct {
	backend     string
	backendPath string // the one measured now
	modes       []string
	sessions    int
	conns       int
	warmup      time.Duration
	duration    time.Duration
	interval    time.Duration
	backendCPU  string
	loadCPU     string
	logLevel    string
	repeat      int
	maxRate     int
	logDir      string
}

func main() {
	var o options
	var modes string
	flag.StringVar(&o.backend, "backend", "", "cmd/backend binaries to measure, comma-separated, each path or label=path (default: build ./cmd/backend of this checkout)")
	flag.StringVar(&modes, "modes", "one,two", "set-ups to measure, in order: one (a single replica, memory store), two (two replicas in a hashring, load sent to the first)")
	flag.IntVar(&o.sessions, "sessions", 200000, "pending sessions to poll (each polled once per poll interval)")
	flag.IntVar(&o.conns, "conns", 64, "connections the load generator keeps busy (one request in flight each)")
	flag.DurationVar(&o.warmup, "warmup", 3*time.Second, "load before measuring")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured load")
	flag.DurationVar(&o.interval, "poll-interval", 2*time.Second, "the backends' --poll-interval; each session is polled at most this often")
	flag.StringVar(&o.backendCPU, "backend-cpu", "0", "CPU list the backends are pinned to (taskset -c)")
	flag.StringVar(&o.loadCPU, "load-cpu", "1", "CPU list this load generator pins itself to (taskset -c); empty: not pinned")
	flag.StringVar(&o.logLevel, "backend-log-level", "warn", "the backends' --log-level (info logs every request)")
	flag.IntVar(&o.repeat, "repeat", 1, "measure each set-up this many times (alternating), to show the spread")
	flag.StringVar(&o.logDir, "backend-logs", "", "also write each backend's output (with GODEBUG=gctrace=1, its GC cycles) to a file in this directory")
	flag.IntVar(&o.maxRate, "max-rate", 80000, "most polls per second expected: the polls signed in advance last warmup+duration at this rate")
	var load loadOptions
	flag.StringVar(&load.file, "load-file", "", "(internal) run the load phase from this file of pre-signed requests")
	flag.StringVar(&load.addr, "load-addr", "", "(internal) where to send them")
	flag.StringVar(&load.pids, "load-pids", "", "(internal) the backends' process IDs")
	flag.Parse()
	o.modes = strings.Split(modes, ",")
	if load.file != "" {
		if err := runLoad(o, load); err != nil {
			fail(err)
		}
		return
	}
	if err := run(o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "pollbench:", err)
	os.Exit(1)
}

// binary is a backend binary to measure, and its label in the report.
type binary struct{ label, path string }

func run(o options) error {
	dir, err := os.MkdirTemp("", "pollbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var bins []binary
	if o.backend == "" {
		path := filepath.Join(dir, "backend")
		fmt.Println("building ./cmd/backend")
		build := exec.Command("go", "build", "-o", path, "./cmd/backend")
		build.Stdout, build.Stderr = os.Stdout, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("building the backend: %w", err)
		}
		bins = append(bins, binary{"this-checkout", path})
	}
	for _, b := range strings.Split(o.backend, ",") {
		if b == "" {
			continue
		}
		label, path, ok := strings.Cut(b, "=")
		if !ok {
			label, path = filepath.Base(b), b
		}
		bins = append(bins, binary{label, path})
	}
	// Runs alternate between set-ups and binaries, so that a change in the
	// machine's load spreads over all of them.
	results := map[binary]map[string][]result{}
	for i := 0; i < o.repeat; i++ {
		for _, mode := range o.modes {
			for _, bin := range bins {
				o.backendPath = bin.path
				r, err := measure(o, dir, mode)
				if err != nil {
					return fmt.Errorf("%s %s: %w", bin.label, mode, err)
				}
				if results[bin] == nil {
					results[bin] = map[string][]result{}
				}
				results[bin][mode] = append(results[bin][mode], r)
				fmt.Println(r.line(bin.label))
			}
		}
	}
	fmt.Println()
	for _, bin := range bins {
		for i := range results[bin]["one"] {
			if i >= len(results[bin]["two"]) {
				break
			}
			one, two := results[bin]["one"][i], results[bin]["two"][i]
			fmt.Printf("%s run %d: two/one throughput per core %.2f; CPU per poll one/two %.2f\n",
				bin.label, i+1, two.rate/one.rate, one.cpuPerPoll/two.cpuPerPoll)
		}
	}
	return nil
}

// result is one measured set-up.
type result struct {
	mode       string
	polls      int64
	rate       float64       // polls per second
	cpuPerPoll float64       // µs of backend CPU per poll, all backends
	cpuShare   []float64     // each backend's CPU use, fraction of one CPU
	statuses   map[int]int64 // answers by status, in the window
	errors     int64         // failed connections
	window     time.Duration // measured time
	// peerMessages and peerRequests: what the first backend sent to its
	// peer during the load (warm-up included), from its /metrics.
	peerMessages, peerRequests float64
}

func (r result) line(label string) string {
	var st []string
	for code, n := range r.statuses {
		st = append(st, fmt.Sprintf("%d:%d", code, n))
	}
	var share []string
	for _, s := range r.cpuShare {
		share = append(share, fmt.Sprintf("%.0f%%", 100*s))
	}
	peer := ""
	if r.peerMessages > 0 {
		peer = fmt.Sprintf("; peer requests per message %.1f", r.peerRequests/r.peerMessages)
	}
	return fmt.Sprintf("%s %-3s %8.0f polls/s %7.1f µs CPU/poll  (backend CPU %s; %d polls in %.1fs; answers %s; conn errors %d%s)",
		label, r.mode, r.rate, r.cpuPerPoll, strings.Join(share, "+"), r.polls, r.window.Seconds(), strings.Join(st, " "), r.errors, peer)
}

// peerSent reads how many peer messages and requests the backend at base
// sent so far (zero for a backend without a hashring).
func peerSent(base string) (messages, requests float64) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, _ := strings.Cut(sc.Text(), " ")
		f, _ := strconv.ParseFloat(v, 64)
		switch name {
		case "hashring_peer_messages_sent_total":
			messages = f
		case "hashring_peer_requests_sent_total":
			requests = f
		}
	}
	return messages, requests
}

// backend is one running cmd/backend process.
type backend struct {
	cmd     *exec.Cmd
	public  string // base URL
	logs    *bytes.Buffer
	logsMu  *sync.Mutex
	stopped chan struct{}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.b.Len() > 1<<20 {
		return len(p), nil
	}
	return w.b.Write(p)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func startBackend(o options, args []string, public string) (*backend, error) {
	cmd := exec.Command("taskset", append([]string{"-c", o.backendCPU, o.backendPath}, args...)...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	b := &backend{cmd: cmd, public: public, logs: &bytes.Buffer{}, logsMu: &sync.Mutex{}, stopped: make(chan struct{})}
	var out io.Writer = lockedWriter{b.logsMu, b.logs}
	if o.logDir != "" {
		f, err := os.CreateTemp(o.logDir, "backend-*.log")
		if err != nil {
			return nil, err
		}
		defer f.Close() // the child has its own descriptor
		out = f
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { cmd.Wait(); close(b.stopped) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(public + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return b, nil
			}
		}
		select {
		case <-b.stopped:
			return nil, fmt.Errorf("backend exited: %s", b.logString())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.stop()
			return nil, fmt.Errorf("backend not healthy after 30s: %s", b.logString())
		}
	}
}

func (b *backend) logString() string {
	b.logsMu.Lock()
	defer b.logsMu.Unlock()
	return b.logs.String()
}

func (b *backend) stop() {
	b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.stopped:
	case <-time.After(30 * time.Second):
		b.cmd.Process.Kill()
		<-b.stopped
	}
}

// cpuTicks is the CPU time (user and system, all threads) of a process,
// in clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; the fields after it are fixed.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	return utime + stime, nil
}

// clockTick is USER_HZ, 100 on Linux for every architecture Go supports
// but alpha and ia64.
const clockTick = 100

const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`

func measure(o options, dir, mode string) (result, error) {
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(kubeconfig), 0o600); err != nil {
		return result{}, err
	}
	keyFile := filepath.Join(dir, "peer-key")
	if err := os.WriteFile(keyFile, []byte("cG9sbGJlbmNoLXBlZXIta2V5LW5vdC1zZWNyZXQtYXQtYWxsLTAxMjM0NTY3"), 0o600); err != nil {
		return result{}, err
	}
	n := 1
	if mode == "two" {
		n = 2
	} else if mode != "one" {
		return result{}, fmt.Errorf("unknown set-up %q (want one or two)", mode)
	}
	ports := make([]int, 2*n)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return result{}, err
		}
		ports[i] = p
	}
	ext := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	var peers []string
	for i := 0; i < n; i++ {
		peers = append(peers, fmt.Sprintf("http://127.0.0.1:%d", ports[n+i]))
	}
	var backends []*backend
	defer func() {
		for _, b := range backends {
			b.stop()
		}
	}()
	for i := 0; i < n; i++ {
		args := []string{
			"--listen-address", fmt.Sprintf("127.0.0.1:%d", ports[i]),
			// Every replica advertises the first one's URL, as replicas
			// behind one Service share their external URL.
			"--external-url", ext,
			"--kubeconfig", kc,
			"--leader-election=false",
			"--log-level", o.logLevel, "--log-format", "text",
			"--max-pending-sessions", strconv.Itoa(o.sessions + o.sessions/4 + 1000),
			"--max-connections-per-client", "0",
			"--session-ttl", "1h",
			"--poll-interval", o.interval.String(),
		}
		if n > 1 {
			args = append(args, "--session-store", "hashring",
				"--peer-listen-address", fmt.Sprintf("127.0.0.1:%d", ports[n+i]),
				"--peer-self-url", peers[i],
				"--peers", strings.Join(peers, ","),
				"--peer-key-file", keyFile)
		}
		b, err := startBackend(o, args, fmt.Sprintf("http://127.0.0.1:%d", ports[i]))
		if err != nil {
			return result{}, err
		}
		backends = append(backends, b)
	}
	target := backends[0].public
	start := time.Now()
	sess, err := createSessions(target, o.sessions, o.conns)
	if err != nil {
		return result{}, err
	}
	fmt.Printf("%s: %d sessions created in %.1fs\n", mode, len(sess), time.Since(start).Seconds())

	// Pre-signed polls: a round polls every session once; as many rounds
	// as the run can use at the highest rate expected.
	rounds := int((o.warmup+o.duration).Seconds()*float64(o.maxRate))/len(sess) + 2
	rounds = min(rounds, int((o.warmup+o.duration)/o.interval)+2)
	start = time.Now()
	reqFile := filepath.Join(dir, "polls")
	nreqs, err := presign(reqFile, sess, rounds, ext, strings.TrimPrefix(target, "http://"))
	if err != nil {
		return result{}, err
	}
	fmt.Printf("%s: %d polls signed in %.1fs\n", mode, nreqs, time.Since(start).Seconds())

	// The load phase runs in a process of its own, pinned to its CPU.
	var pids []string
	for _, b := range backends {
		pids = append(pids, strconv.Itoa(b.cmd.Process.Pid))
	}
	self, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	args := []string{self, "--load-file", reqFile, "--load-addr", strings.TrimPrefix(target, "http://"), "--load-pids", strings.Join(pids, ","),
		"--sessions", strconv.Itoa(len(sess)), "--conns", strconv.Itoa(o.conns), "--warmup", o.warmup.String(),
		"--duration", o.duration.String(), "--poll-interval", o.interval.String()}
	if o.loadCPU != "" {
		args = append([]string{"taskset", "-c", o.loadCPU}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	m0, r0 := peerSent(target)
	out, err := cmd.Output()
	if err != nil {
		return result{}, fmt.Errorf("load phase: %w", err)
	}
	m1, r1 := peerSent(target)
	var lr loadResult
	if err := json.Unmarshal(out, &lr); err != nil {
		return result{}, fmt.Errorf("load phase answered %q: %w", out, err)
	}
	r := result{mode: mode, window: lr.Window, statuses: lr.Statuses, errors: lr.Errors, polls: lr.Polls,
		peerMessages: m1 - m0, peerRequests: r1 - r0}
	if r.polls == 0 {
		return r, errors.New("no poll answered in the window")
	}
	var cpu float64
	for _, t := range lr.Ticks {
		sec := float64(t) / clockTick
		cpu += sec
		r.cpuShare = append(r.cpuShare, sec/r.window.Seconds())
	}
	r.rate = float64(r.polls) / r.window.Seconds()
	r.cpuPerPoll = cpu / float64(r.polls) * 1e6
	if lr.RanOut {
		fmt.Printf("%s: the signed polls ran out after %.1fs of the window; raise --max-rate\n", mode, r.window.Seconds())
	}
	return r, nil
}

type loadOptions struct{ file, addr, pids string }

// loadResult is what the load phase measured in its window.
type loadResult struct {
	Polls    int64         `json:"polls"`
	Window   time.Duration `json:"window"`
	Ticks    []int64       `json:"ticks"` // CPU of each backend in the window
	Statuses map[int]int64 `json:"statuses"`
	Errors   int64         `json:"errors"`
	RanOut   bool          `json:"ranOut"`
}

// runLoad is the load phase: it sends the pre-signed polls, and measures
// the backends' CPU time and the answers between the end of the warm-up
// and the end of the run. It prints a loadResult.
func runLoad(o options, lo loadOptions) error {
	data, err := os.ReadFile(lo.file)
	if err != nil {
		return err
	}
	var reqs [][]byte
	for len(data) > 0 {
		i := bytes.Index(data, []byte("\r\n\r\n"))
		if i < 0 {
			return errors.New("truncated request file")
		}
		reqs = append(reqs, data[:i+4])
		data = data[i+4:]
	}
	var pids []int
	for _, p := range strings.Split(lo.pids, ",") {
		pid, err := strconv.Atoi(p)
		if err != nil {
			return err
		}
		pids = append(pids, pid)
	}
	ticks := func() ([]int64, error) {
		var ts []int64
		for _, pid := range pids {
			t, err := cpuTicks(pid)
			if err != nil {
				return nil, err
			}
			ts = append(ts, t)
		}
		return ts, nil
	}
	g := &generator{reqs: reqs, sessions: o.sessions, interval: o.interval + 20*time.Millisecond,
		lastSent: make([]atomic.Int64, o.sessions), addr: lo.addr}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < o.conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.worker(ctx)
		}()
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	time.Sleep(o.warmup)
	before := g.snapshot()
	t0 := time.Now()
	ticks0, err := ticks()
	if err != nil {
		return err
	}
	var lr loadResult
	deadline := time.After(o.duration)
wait:
	for {
		select {
		case <-deadline:
			break wait
		case <-time.After(50 * time.Millisecond):
			if g.next.Load() >= int64(len(reqs)) {
				lr.RanOut = true
				break wait
			}
		}
	}
	after := g.snapshot()
	lr.Window = time.Since(t0)
	ticks1, err := ticks()
	if err != nil {
		return err
	}
	for i := range ticks1 {
		lr.Ticks = append(lr.Ticks, ticks1[i]-ticks0[i])
	}
	lr.Statuses = map[int]int64{}
	for code, n := range after.statuses {
		if d := n - before.statuses[code]; d > 0 {
			lr.Statuses[code] = d
		}
	}
	lr.Polls = after.done - before.done
	lr.Errors = after.errors - before.errors
	return json.NewEncoder(os.Stdout).Encode(lr)
}

type pollSession struct {
	SessionID     string `json:"sessionID"`
	SessionSecret string `json:"sessionSecret"`
}

// createSessions creates n sessions on target with conns clients at once,
// retrying 503 (the owner is full or busy) a few times.
func createSessions(target string, n, conns int) ([]pollSession, error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	out := make([]pollSession, n)
	var next atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for c := 0; c < conns; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				var err error
				for attempt := 0; attempt < 20; attempt++ {
					if out[i], err = createSession(client, target); err == nil {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					next.Store(int64(n))
					return
				}
			}
		}()
	}
	wg.Wait()
	return out, firstErr
}

func createSession(client *http.Client, target string) (pollSession, error) {
	resp, err := client.Post(target+"/sessions", "application/json", strings.NewReader("{}"))
	if err != nil {
		return pollSession{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return pollSession{}, fmt.Errorf("POST /sessions: %d %s", resp.StatusCode, b)
	}
	var s pollSession
	if err := json.Unmarshal(b, &s); err != nil || s.SessionID == "" || s.SessionSecret == "" {
		return pollSession{}, fmt.Errorf("POST /sessions: %s", b)
	}
	return s, nil
}

// presign signs rounds polls of every session (each with a fresh nonce)
// for the URL the backends advertise (ext), as raw HTTP/1.1 requests to
// addr, and writes them to file: request i polls session i % len(sess).
func presign(file string, sess []pollSession, rounds int, ext, addr string) (int, error) {
	pollURL, err := url.Parse(ext + "/poll")
	if err != nil {
		return 0, err
	}
	f, err := os.Create(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	workers := runtime.GOMAXPROCS(0)
	for r := 0; r < rounds; r++ {
		signed := make([][]byte, len(sess))
		var wg sync.WaitGroup
		var firstErr error
		var once sync.Once
		for k := 0; k < workers; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := k; i < len(sess); i += workers {
					u, err := hmac.SignURL(sess[i].SessionSecret, sess[i].SessionID, http.MethodGet, pollURL, nil)
					if err != nil {
						once.Do(func() { firstErr = err })
						return
					}
					signed[i] = []byte("GET " + u.RequestURI() + " HTTP/1.1\r\nHost: " + addr + "\r\n\r\n")
				}
			}()
		}
		wg.Wait()
		if firstErr != nil {
			return 0, firstErr
		}
		for _, b := range signed {
			w.Write(b)
		}
	}
	if err := w.Flush(); err != nil {
		return 0, err
	}
	return rounds * len(sess), f.Close()
}

// generator sends the pre-signed polls in order over raw HTTP/1.1
// connections, one request in flight on each, no session sooner than
// interval after its previous poll.
type generator struct {
	reqs     [][]byte
	sessions int
	interval time.Duration
	lastSent []atomic.Int64
	addr     string
	next     atomic.Int64

	errors   atomic.Int64
	statuses [600]atomic.Int64
}

type counts struct {
	done, errors int64
	statuses     map[int]int64
}

func (g *generator) snapshot() counts {
	c := counts{errors: g.errors.Load(), statuses: map[int]int64{}}
	for code := range g.statuses {
		if n := g.statuses[code].Load(); n > 0 {
			c.statuses[code] = n
			c.done += n
		}
	}
	return c
}

func (g *generator) worker(ctx context.Context) {
	var conn net.Conn
	var br *bufio.Reader
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for ctx.Err() == nil {
		i := g.next.Add(1) - 1
		if i >= int64(len(g.reqs)) {
			return
		}
		s := int(i % int64(g.sessions))
		if last := g.lastSent[s].Load(); last != 0 {
			if wait := time.Duration(last) + g.interval - time.Duration(time.Now().UnixNano()); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
		}
		g.lastSent[s].Store(time.Now().UnixNano())
		if conn == nil {
			c, err := net.Dial("tcp", g.addr)
			if err != nil {
				g.errors.Add(1)
				time.Sleep(10 * time.Millisecond)
				continue
			}
			conn, br = c, bufio.NewReaderSize(c, 4096)
		}
		code, err := roundTrip(conn, br, g.reqs[i])
		if err != nil || code < 100 || code >= len(g.statuses) {
			g.errors.Add(1)
			conn.Close()
			conn = nil
			continue
		}
		g.statuses[code].Add(1)
	}
}

// roundTrip writes one request and reads its answer: the status, the
// headers up to Content-Length, and the body, discarded.
func roundTrip(conn net.Conn, br *bufio.Reader, req []byte) (int, error) {
	if _, err := conn.Write(req); err != nil {
		return 0, err
	}
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, fmt.Errorf("bad status line %q", line)
	}
	code, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, err
	}
	length := -1
	for {
		h, err := br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(h) <= 2 {
			break
		}
		if len(h) > 16 && bytes.EqualFold(h[:15], []byte("Content-Length:")) {
			length, err = strconv.Atoi(string(bytes.TrimSpace(h[15:])))
			if err != nil {
				return 0, err
			}
		}
	}
	if length < 0 {
		return 0, errors.New("answer without Content-Length")
	}
	if _, err := br.Discard(length); err != nil {
		return 0, err
	}
	return code, nil
}
