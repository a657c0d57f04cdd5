// Command pollbench measures what a pending poll costs the backend, as
// separate processes on one pinned CPU, in four set-ups measured in turn:
//
//   - bare: the ceiling, a minimal net/http server (this binary in a hidden
//     mode) answering every request with the backend's pending answer;
//   - one: one replica with the memory session store;
//   - ring1: one replica with the ring store (a ring of one) and its
//     session records in a real kube-apiserver;
//   - two: two replicas in a ring, every poll sent to the first.
//
// The servers run pinned to one CPU with GOMAXPROCS=1, the load generator
// (this binary in another hidden mode) on another; it reports polls per
// second, the servers' CPU time per poll (from /proc), and the ratios of
// the set-ups. README.md says how to run it and what it measured.
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
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/benchutil"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/pkg/protocol"
)

// The set-ups, in their default order.
const (
	modeBare  = "bare"
	modeOne   = "one"
	modeRing1 = "ring1"
	modeTwo   = "two"
)

const (
	// externalURL is what every backend advertises and every poll is
	// signed for, as replicas behind one Service share their public URL.
	// Nobody connects to it: the load goes to the first server's address.
	externalURL = "http://backend.pollbench.test"
	// sessionNamespace holds the ring's session records.
	sessionNamespace = "pollbench"
	// peerKey is every ring replica's --peer-key-file (45 bytes,
	// base64). The session keys are derived from it, so sessions created
	// on one ring backend of a run are valid on every other.
	peerKey = "cG9sbGJlbmNoLXBlZXIta2V5LW5vdC1zZWNyZXQtYXQtYWxsLTAxMjM0NTY3"
	// sessionTTL outlasts any run: polls signed in the first set-up of a
	// run are still valid in the last.
	sessionTTL = 6 * time.Hour
)

type options struct {
	backend    string
	modes      []string
	sessions   int
	conns      int
	warmup     time.Duration
	duration   time.Duration
	interval   time.Duration
	backendCPU string
	loadCPU    string
	logLevel   string
	repeat     int
	maxRate    int
	logDir     string
}

func main() {
	var o options
	var modes string
	flag.StringVar(&o.backend, "backend", "", "cmd/backend binaries to measure, comma-separated, each path or label=path (default: build ./cmd/backend of this checkout)")
	flag.StringVar(&modes, "modes", "bare,one,ring1,two", "set-ups to measure, in order: bare (a minimal net/http server giving the backend's pending answer: the ceiling), one (a single replica, memory store), ring1 (a single replica, ring store against a kube-apiserver), two (two replicas in a ring, load sent to the first)")
	flag.IntVar(&o.sessions, "sessions", 200000, "pending sessions to poll (each polled once per poll interval)")
	flag.IntVar(&o.conns, "conns", 64, "connections the load generator keeps busy (one request in flight each)")
	flag.DurationVar(&o.warmup, "warmup", 3*time.Second, "load before measuring")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured load")
	flag.DurationVar(&o.interval, "poll-interval", 2*time.Second, "the backends' --poll-interval; each session is polled at most this often")
	flag.StringVar(&o.backendCPU, "backend-cpu", "0", "CPU list the servers (backends, bare server) are pinned to (taskset -c)")
	flag.StringVar(&o.loadCPU, "load-cpu", "1", "CPU list the load generator and the control plane (etcd, kube-apiserver, kube-controller-manager) are pinned to (taskset -c); empty: not pinned")
	flag.StringVar(&o.logLevel, "backend-log-level", "warn", "the backends' --log-level (info logs every request)")
	flag.IntVar(&o.repeat, "repeat", 1, "measure each set-up this many times (alternating), to show the spread")
	flag.StringVar(&o.logDir, "backend-logs", "", "also write each backend's output (with GODEBUG=gctrace=1, its GC cycles) to a file in this directory")
	flag.IntVar(&o.maxRate, "max-rate", 80000, "most polls per second expected: the polls signed in advance last warmup+duration at this rate")
	var load loadOptions
	flag.StringVar(&load.file, "load-file", "", "(internal) run the load phase from this file of pre-signed requests")
	flag.StringVar(&load.addr, "load-addr", "", "(internal) where to send them")
	flag.StringVar(&load.pids, "load-pids", "", "(internal) the measured servers' process IDs")
	flag.StringVar(&load.otherPids, "load-other-pids", "", "(internal) process IDs whose CPU is reported, not measured (the control plane)")
	var bare bareOptions
	flag.StringVar(&bare.addr, "serve-bare", "", "(internal) serve the bare set-up on this address")
	flag.StringVar(&bare.answer, "bare-answer", "", "(internal) the answer the bare server gives, as captured from a backend")
	flag.Parse()
	o.modes = strings.Split(modes, ",")
	switch {
	case bare.addr != "":
		if err := serveBare(bare); err != nil {
			fail(err)
		}
		return
	case load.file != "":
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

// bench is what one run shares between its measurements.
type bench struct {
	o   options
	dir string
	// answer is the file of the backend's pending answer (bare).
	answer string
	// barePolls are polls for the bare set-up: any signed polls do.
	barePolls string
	// ringPolls are polls of sessions created on a ring backend of
	// each binary, valid on all of them (the session keys come from
	// the peer key); made by the first ring set-up measured.
	ringPolls map[string]string
	// cp is the provider cluster of the ring set-ups.
	cp         *controlplane.ControlPlane
	kubeconfig string
	cpPids     []int
	cpClient   *kubernetes.Clientset
}

func run(o options) error {
	if _, err := benchutil.CPUList(o.backendCPU); err != nil {
		return fmt.Errorf("--backend-cpu: %w", err)
	}
	for _, m := range o.modes {
		if !slices.Contains([]string{modeBare, modeOne, modeRing1, modeTwo}, m) {
			return fmt.Errorf("unknown set-up %q (want bare, one, ring1 or two)", m)
		}
	}
	dir, err := os.MkdirTemp("", "pollbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// On an interrupt, the servers die with this process (procs.StartTied);
	// only the folder of signed polls (hundreds of MB) needs removing.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, "pollbench: interrupted")
		os.Exit(130)
	}()

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
	bn := &bench{o: o, dir: dir, ringPolls: map[string]string{}}
	if slices.Contains(o.modes, modeBare) {
		if err := bn.prepareBare(bins[0]); err != nil {
			return fmt.Errorf("bare: %w", err)
		}
	}
	if slices.Contains(o.modes, modeRing1) || slices.Contains(o.modes, modeTwo) {
		err := bn.startControlPlane()
		if bn.cp != nil {
			defer bn.cp.Stop()
		}
		if err != nil {
			return err
		}
	}

	// Runs alternate between set-ups and binaries, so that a change in the
	// machine's load spreads over all of them.
	results := map[string][]result{} // by label+" "+mode
	key := func(label, mode string) string { return label + " " + mode }
	for i := 0; i < o.repeat; i++ {
		for _, mode := range o.modes {
			for _, bin := range bins {
				label := bin.label
				if mode == modeBare {
					label = "net/http"
				}
				r, err := bn.measure(mode, bin)
				if err != nil {
					return fmt.Errorf("%s %s: %w", label, mode, err)
				}
				results[key(label, mode)] = append(results[key(label, mode)], r)
				fmt.Println(r.line(label))
				if mode == modeBare {
					break // the same for every binary
				}
			}
		}
	}

	fmt.Println()
	fmt.Println("summary: median (min-max) over the runs; per core = polls per second of server CPU (1/CPU per poll)")
	for _, mode := range o.modes {
		for _, bin := range bins {
			label := bin.label
			if mode == modeBare {
				label = "net/http"
			}
			rs := results[key(label, mode)]
			fmt.Printf("%-14s %-5s %s polls/s  %s µs CPU/poll  %s polls per CPU-second  (other processes on the servers' CPU %s%%)\n", label, mode,
				spread(of(rs, func(r result) float64 { return r.rate }), "%.0f"),
				spread(of(rs, func(r result) float64 { return r.cpuPerPoll }), "%.1f"),
				spread(of(rs, func(r result) float64 { return 1e6 / r.cpuPerPoll }), "%.0f"),
				spread(of(rs, func(r result) float64 { return 100 * r.otherShare }), "%.0f"))
			if mode == modeBare {
				break
			}
		}
	}
	// Ratios within a repetition (the set-ups of one repetition ran
	// minutes apart at most), then their median and range.
	type ratio struct{ name, num, den string }
	var ratios []ratio
	for _, bin := range bins {
		ratios = append(ratios,
			ratio{bin.label + " one/bare", key(bin.label, modeOne), key("net/http", modeBare)},
			ratio{bin.label + " ring1/bare", key(bin.label, modeRing1), key("net/http", modeBare)},
			ratio{bin.label + " ring1/one", key(bin.label, modeRing1), key(bin.label, modeOne)},
			ratio{bin.label + " two/one", key(bin.label, modeTwo), key(bin.label, modeOne)})
	}
	fmt.Println()
	fmt.Println("ratios: polls/s, and polls per CPU-second (throughput per core); median (min-max) over the repetitions")
	for _, q := range ratios {
		num, den := results[q.num], results[q.den]
		n := min(len(num), len(den))
		if n == 0 {
			continue
		}
		var byRate, byCPU []float64
		for i := 0; i < n; i++ {
			byRate = append(byRate, num[i].rate/den[i].rate)
			byCPU = append(byCPU, den[i].cpuPerPoll/num[i].cpuPerPoll)
		}
		fmt.Printf("%-26s polls/s %s   per core %s\n", q.name, spread(byRate, "%.2f"), spread(byCPU, "%.2f"))
	}
	return nil
}

// of returns f of each result.
func of(rs []result, f func(result) float64) []float64 {
	var v []float64
	for _, r := range rs {
		v = append(v, f(r))
	}
	return v
}

// spread formats the median, min and max of v.
func spread(v []float64, format string) string {
	if len(v) == 0 {
		return "-"
	}
	v = slices.Clone(v)
	slices.Sort(v)
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	if len(v) == 1 {
		return fmt.Sprintf(format, med)
	}
	return fmt.Sprintf(format+" ("+format+"-"+format+")", med, v[0], v[len(v)-1])
}

// startControlPlane starts etcd, kube-apiserver and kube-controller-manager
// (internal/localenv/controlplane), pins them to the load CPU and creates
// the session namespace.
func (bn *bench) startControlPlane() error {
	t := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{Dir: filepath.Join(bn.dir, "controlplane")})
	if err != nil {
		return fmt.Errorf("starting the control plane (binaries: $%s or %s): %w", controlplane.BinariesEnv, controlplane.InstallScript, err)
	}
	bn.cp = cp
	bn.kubeconfig = cp.AdminKubeconfigPath()
	if bn.cpClient, err = kubernetes.NewForConfig(cp.AdminConfig()); err != nil {
		return err
	}
	_, err = bn.cpClient.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sessionNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", sessionNamespace, err)
	}
	// The control plane's processes are this process's children.
	names := map[string]bool{"etcd": true, "kube-apiserver": true, "kube-controller": true} // comm: 15 bytes at most
	bn.cpPids = benchutil.ChildrenNamed(names)
	if len(bn.cpPids) != 3 {
		return fmt.Errorf("found %d control plane processes, want 3 (etcd, kube-apiserver, kube-controller-manager)", len(bn.cpPids))
	}
	where := "not pinned"
	if bn.o.loadCPU != "" {
		for _, pid := range bn.cpPids {
			// -a: every thread; new threads inherit it.
			out, err := exec.Command("taskset", "-a", "-p", "-c", bn.o.loadCPU, strconv.Itoa(pid)).CombinedOutput()
			if err != nil {
				return fmt.Errorf("pinning the control plane: taskset: %w: %s", err, out)
			}
		}
		where = "pinned to CPU " + bn.o.loadCPU + " (the load generator's)"
	}
	fmt.Printf("control plane up at %s in %.1fs, %s; session records in namespace %s\n",
		cp.Host(), time.Since(t).Seconds(), where, sessionNamespace)
	return nil
}

// apiRequests reads the API server's request counter by "VERB resource"
// or "VERB /path".
func (bn *bench) apiRequests() (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return benchutil.APIRequests(ctx, bn.cpClient.Discovery().RESTClient())
}

// answer is a server's answer: what the bare server gives.
type answer struct {
	Status int         `json:"status"`
	Header http.Header `json:"header"`
	Body   []byte      `json:"body"`
}

// prepareBare captures the answer of a backend (one replica, memory
// store) to a pending poll, for the bare server to give, and signs the
// polls the bare set-up sends (for sessions of that backend: the bare
// server reads nothing of them, but they are the same size).
func (bn *bench) prepareBare(bin binary) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	b, err := startBackend(bn.o, bin.path, bn.backendArgs(modeOne, port, 0, nil), fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	defer b.Stop()
	sess, err := createSessions("http://"+b.addr, bn.o.sessions, bn.o.conns)
	if err != nil {
		return err
	}
	u, err := url.Parse(externalURL + "/poll")
	if err != nil {
		return err
	}
	signed, err := protocol.SignURL(sess[0].SessionSecret, sess[0].SessionID, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodGet, "http://"+b.addr+signed.RequestURI(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	a := answer{Status: resp.StatusCode, Header: resp.Header.Clone()}
	if a.Body, err = io.ReadAll(resp.Body); err != nil {
		return err
	}
	if a.Status != http.StatusForbidden || !bytes.Contains(a.Body, []byte("authorization_pending")) {
		return fmt.Errorf("a pending poll was answered %d %s", a.Status, a.Body)
	}
	// net/http writes these itself.
	a.Header.Del("Date")
	a.Header.Del("Content-Length")
	var names []string
	for k := range a.Header {
		names = append(names, k+": "+strings.Join(a.Header[k], ", "))
	}
	sort.Strings(names)
	fmt.Printf("bare: gives the backend's pending answer: %d, %s, a body of %d bytes\n", a.Status, strings.Join(names, "; "), len(a.Body))
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	bn.answer = filepath.Join(bn.dir, "answer.json")
	if err := os.WriteFile(bn.answer, data, 0o600); err != nil {
		return err
	}
	bn.barePolls = filepath.Join(bn.dir, "polls-bare")
	_, err = bn.presign(modeBare, bn.barePolls, sess)
	return err
}

type bareOptions struct{ addr, answer string }

// serveBare is the bare set-up: net/http with the backend's server
// timeouts, answering every request with the captured answer, nothing
// else. It runs until SIGTERM.
func serveBare(bo bareOptions) error {
	data, err := os.ReadFile(bo.answer)
	if err != nil {
		return err
	}
	var a answer
	if err := json.Unmarshal(data, &a); err != nil {
		return err
	}
	// The header values are assigned, never copied, as the backend does.
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			h := w.Header()
			for k, v := range a.Header {
				h[k] = v
			}
			w.WriteHeader(a.Status)
			w.Write(a.Body)
		}),
		// As internal/server sets them: the deadlines cost a little per
		// request.
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	ln, err := net.Listen("tcp", bo.addr)
	if err != nil {
		return err
	}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
		<-sig
		srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// result is one measured set-up.
type result struct {
	mode       string
	polls      int64
	rate       float64       // polls per second
	cpuPerPoll float64       // µs of server CPU per poll, all servers
	cpuShare   []float64     // each server's CPU use, fraction of one CPU
	otherShare float64       // the servers' CPUs used by other processes, fraction of those CPUs
	loadShare  float64       // the load generator's CPU use, fraction of one CPU
	statuses   map[int]int64 // answers by status, in the window
	errors     int64         // failed connections
	window     time.Duration // measured time
	// fallbacks: peer requests answered locally instead, all replicas,
	// during the load (warm-up included), from /metrics.
	fallbacks float64
	// cpShare: the control plane's CPU use in the window, fraction of
	// one CPU; api: API server requests during the load (warm-up
	// included) by verb and resource.
	cpShare float64
	api     map[string]float64
	hasCP   bool
}

func (r result) line(label string) string {
	var st []string
	for code, n := range r.statuses {
		st = append(st, fmt.Sprintf("%d:%d", code, n))
	}
	sort.Strings(st)
	var share []string
	for _, s := range r.cpuShare {
		share = append(share, fmt.Sprintf("%.0f%%", 100*s))
	}
	extra := ""
	if r.mode == modeRing1 || r.mode == modeTwo {
		extra = fmt.Sprintf("; peer fallbacks %.0f", r.fallbacks)
	}
	if r.hasCP {
		var reqs []string
		for k, v := range r.api {
			reqs = append(reqs, fmt.Sprintf("%s:%.0f", k, v))
		}
		sort.Strings(reqs)
		if len(reqs) == 0 {
			reqs = []string{"none"}
		}
		extra += fmt.Sprintf("; control plane CPU %.1f%%, API requests during the load %s", 100*r.cpShare, strings.Join(reqs, " "))
	}
	return fmt.Sprintf("%-14s %-5s %8.0f polls/s %6.1f µs CPU/poll  (server CPU %s, other processes on it %.0f%%; load generator CPU %.0f%%; %d polls in %.1fs; answers %s; conn errors %d%s)",
		label, r.mode, r.rate, r.cpuPerPoll, strings.Join(share, "+"), 100*r.otherShare, 100*r.loadShare, r.polls, r.window.Seconds(), strings.Join(st, " "), r.errors, extra)
}

// peerFallbacks reads ring_peer_fallbacks_total of the backend at addr.
func peerFallbacks(addr string) float64 {
	return benchutil.MetricSum("http://"+addr+"/metrics", "ring_peer_fallbacks_total")
}

// server is one running server process: a backend or the bare server.
type server struct {
	*benchutil.Process
	addr string // host:port of its public listener
	diag string // host:port of its metrics (its diagnostics listener, or addr for a build before it had one)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// backendArgs are the flags of a backend of mode listening on port, with
// its peer API on peerPort among peers (ring set-ups).
func (bn *bench) backendArgs(mode string, port, peerPort int, peers []string) []string {
	o := bn.o
	args := []string{
		"--listen-address", fmt.Sprintf("127.0.0.1:%d", port),
		"--external-url", externalURL,
		"--leader-election=false",
		"--log-level", o.logLevel, "--log-format", "text",
		"--max-polled-sessions", strconv.Itoa(o.sessions + o.sessions/4 + 1000),
		"--max-connections-per-client", "0",
		"--session-create-rate", "0", // one client creates every session
		"--session-ttl", sessionTTL.String(),
		"--poll-interval", o.interval.String(),
	}
	if mode == modeRing1 || mode == modeTwo {
		args = append(args, "--session-store", "ring",
			"--kubeconfig", bn.kubeconfig,
			"--session-namespace", sessionNamespace,
			"--peer-listen-address", fmt.Sprintf("127.0.0.1:%d", peerPort),
			"--peer-self-url", fmt.Sprintf("https://127.0.0.1:%d", peerPort),
			"--peers", strings.Join(peers, ","),
			"--peer-key-file", filepath.Join(bn.dir, "peer-key"))
	}
	return args
}

// startServer starts a server pinned to the servers' CPU with
// GOMAXPROCS=1, tied to this process, and waits until a GET of path on
// addr answers want.
func startServer(o options, argv []string, addr, path string, want int) (*server, error) {
	po := benchutil.ProcessOptions{
		Argv: append([]string{"taskset", "-c", o.backendCPU}, argv...), Env: []string{"GOMAXPROCS=1"},
		ReadyURL: "http://" + addr + path, ReadyStatus: want,
	}
	if o.logDir != "" {
		f, err := os.CreateTemp(o.logDir, filepath.Base(argv[0])+"-*.log")
		if err != nil {
			return nil, err
		}
		defer f.Close() // the child has its own descriptor
		po.Out = f
	}
	p, err := benchutil.StartProcess(po)
	if err != nil {
		return nil, err
	}
	return &server{Process: p, addr: addr}, nil
}

// startBackend starts a backend and waits until it is ready (the
// ring's session records read), on its diagnostics listener where the
// build has one (a free port), else on its public one.
func startBackend(o options, path string, args []string, addr string) (*server, error) {
	diag := addr
	if hasDiagnostics(path) {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		diag = fmt.Sprintf("127.0.0.1:%d", port)
		args = append(slices.Clip(args), "--diagnostics-address", diag)
	}
	b, err := startServer(o, append([]string{path}, args...), diag, "/readyz", http.StatusOK)
	if err != nil {
		return nil, err
	}
	b.addr, b.diag = addr, diag
	return b, nil
}

// hasDiagnostics reports whether the backend at path has
// --diagnostics-address (builds before it served /metrics and /readyz on
// the public listener).
func hasDiagnostics(path string) bool {
	out, _ := exec.Command(path, "-h").CombinedOutput()
	return bytes.Contains(out, []byte("-diagnostics-address"))
}

// measure starts the servers of mode, sends the load and stops them.
func (bn *bench) measure(mode string, bin binary) (result, error) {
	o := bn.o
	if err := os.WriteFile(filepath.Join(bn.dir, "peer-key"), []byte(peerKey+"\n"), 0o600); err != nil {
		return result{}, err
	}
	n := 1
	if mode == modeTwo {
		n = 2
	}
	ports := make([]int, 2*n)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return result{}, err
		}
		ports[i] = p
	}
	var peers []string
	for i := 0; i < n; i++ {
		peers = append(peers, fmt.Sprintf("https://127.0.0.1:%d", ports[n+i]))
	}
	var servers []*server
	defer func() {
		for _, b := range servers {
			b.Stop()
		}
	}()
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	if mode == modeBare {
		self, err := os.Executable()
		if err != nil {
			return result{}, err
		}
		s, err := startServer(o, []string{self, "--serve-bare", addr, "--bare-answer", bn.answer}, addr, "/poll", http.StatusForbidden)
		if err != nil {
			return result{}, err
		}
		servers = append(servers, s)
	} else {
		for i := 0; i < n; i++ {
			a := fmt.Sprintf("127.0.0.1:%d", ports[i])
			b, err := startBackend(o, bin.path, bn.backendArgs(mode, ports[i], ports[n+i], peers), a)
			if err != nil {
				return result{}, err
			}
			servers = append(servers, b)
		}
	}

	var reqFile string
	switch mode {
	case modeBare:
		reqFile = bn.barePolls
	case modeOne:
		// The memory store's session keys are random per process.
		sess, err := createSessions("http://"+addr, o.sessions, o.conns)
		if err != nil {
			return result{}, err
		}
		reqFile = filepath.Join(bn.dir, "polls-one")
		if _, err := bn.presign(mode, reqFile, sess); err != nil {
			return result{}, err
		}
	default:
		if reqFile = bn.ringPolls[bin.path]; reqFile == "" {
			sess, err := createSessions("http://"+addr, o.sessions, o.conns)
			if err != nil {
				return result{}, err
			}
			reqFile = filepath.Join(bn.dir, fmt.Sprintf("polls-ring-%d", len(bn.ringPolls)))
			if _, err := bn.presign(mode, reqFile, sess); err != nil {
				return result{}, err
			}
			bn.ringPolls[bin.path] = reqFile
		}
	}

	// The load phase runs in a process of its own, pinned to its CPU.
	var pids, other []string
	for _, b := range servers {
		pids = append(pids, strconv.Itoa(b.PID()))
	}
	for _, p := range bn.cpPids {
		other = append(other, strconv.Itoa(p))
	}
	self, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	args := []string{self, "--load-file", reqFile, "--load-addr", addr, "--load-pids", strings.Join(pids, ","),
		"--load-other-pids", strings.Join(other, ","), "--backend-cpu", o.backendCPU,
		"--sessions", strconv.Itoa(o.sessions), "--conns", strconv.Itoa(o.conns), "--warmup", o.warmup.String(),
		"--duration", o.duration.String(), "--poll-interval", o.interval.String()}
	if o.loadCPU != "" {
		args = append([]string{"taskset", "-c", o.loadCPU}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	fallbacks := func() float64 {
		if mode != modeRing1 && mode != modeTwo {
			return 0
		}
		var f float64
		for _, s := range servers {
			f += peerFallbacks(s.diag)
		}
		return f
	}
	f0 := fallbacks()
	var api0 map[string]float64
	if bn.cp != nil {
		if api0, err = bn.apiRequests(); err != nil {
			return result{}, fmt.Errorf("reading the API server's /metrics: %w", err)
		}
	}
	out, err := cmd.Output()
	if err != nil {
		return result{}, fmt.Errorf("load phase: %w", err)
	}
	f1 := fallbacks()
	r := result{mode: mode, fallbacks: f1 - f0}
	if bn.cp != nil {
		api1, err := bn.apiRequests()
		if err != nil {
			return result{}, fmt.Errorf("reading the API server's /metrics: %w", err)
		}
		r.hasCP, r.api = true, map[string]float64{}
		for k, v := range api1 {
			if d := v - api0[k]; d > 0 {
				r.api[k] = d
			}
		}
	}
	var lr loadResult
	if err := json.Unmarshal(out, &lr); err != nil {
		return result{}, fmt.Errorf("load phase answered %q: %w", out, err)
	}
	r.window, r.statuses, r.errors, r.polls = lr.Window, lr.Statuses, lr.Errors, lr.Polls
	if r.polls == 0 {
		return r, errors.New("no poll answered in the window")
	}
	var cpu float64
	for _, t := range lr.Ticks {
		sec := float64(t) / benchutil.ClockTick
		cpu += sec
		r.cpuShare = append(r.cpuShare, sec/r.window.Seconds())
	}
	for _, t := range lr.OtherTicks {
		r.cpShare += float64(t) / benchutil.ClockTick / r.window.Seconds()
	}
	r.loadShare = float64(lr.Self) / benchutil.ClockTick / r.window.Seconds()
	if cpus, err := benchutil.CPUList(o.backendCPU); err == nil {
		r.otherShare = max(0, float64(lr.Busy)/benchutil.ClockTick-cpu) / r.window.Seconds() / float64(len(cpus))
	}
	r.rate = float64(r.polls) / r.window.Seconds()
	r.cpuPerPoll = cpu / float64(r.polls) * 1e6
	if lr.RanOut {
		fmt.Printf("%s: the signed polls ran out after %.1fs of the window; raise --max-rate\n", mode, r.window.Seconds())
	}
	return r, nil
}

type loadOptions struct{ file, addr, pids, otherPids string }

// loadResult is what the load phase measured in its window.
type loadResult struct {
	Polls  int64         `json:"polls"`
	Window time.Duration `json:"window"`
	Ticks  []int64       `json:"ticks"` // CPU of each server in the window
	// Busy: the servers' CPUs' busy time in the window, in clock ticks,
	// whoever used them.
	Busy int64 `json:"busy"`
	// Self: the load generator's CPU in the window, in clock ticks.
	Self       int64         `json:"self"`
	OtherTicks []int64       `json:"otherTicks"` // CPU of each other process in the window
	Statuses   map[int]int64 `json:"statuses"`
	Errors     int64         `json:"errors"`
	RanOut     bool          `json:"ranOut"`
}

func parsePids(list string) ([]int, error) {
	var pids []int
	for _, p := range strings.Split(list, ",") {
		if p == "" {
			continue
		}
		pid, err := strconv.Atoi(p)
		if err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

func ticksOf(pids []int) ([]int64, error) {
	var ts []int64
	for _, pid := range pids {
		t, err := benchutil.CPUTicks(pid)
		if err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, nil
}

// runLoad is the load phase: it sends the pre-signed polls, and measures
// the servers' CPU time and the answers between the end of the warm-up
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
	pids, err := parsePids(lo.pids)
	if err != nil {
		return err
	}
	other, err := parsePids(lo.otherPids)
	if err != nil {
		return err
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
	ticks0, err := ticksOf(pids)
	if err != nil {
		return err
	}
	other0, err := ticksOf(other)
	if err != nil {
		return err
	}
	cpus, err := benchutil.CPUList(o.backendCPU)
	if err != nil {
		return err
	}
	busy0, err := benchutil.CPUBusy(cpus)
	if err != nil {
		return err
	}
	self0, err := benchutil.CPUTicks(os.Getpid())
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
	ticks1, err := ticksOf(pids)
	if err != nil {
		return err
	}
	other1, err := ticksOf(other)
	if err != nil {
		return err
	}
	busy1, err := benchutil.CPUBusy(cpus)
	if err != nil {
		return err
	}
	lr.Busy = busy1 - busy0
	self1, err := benchutil.CPUTicks(os.Getpid())
	if err != nil {
		return err
	}
	lr.Self = self1 - self0
	for i := range ticks1 {
		lr.Ticks = append(lr.Ticks, ticks1[i]-ticks0[i])
	}
	for i := range other1 {
		lr.OtherTicks = append(lr.OtherTicks, other1[i]-other0[i])
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

// createSessions creates n sessions at base with conns clients at once,
// retrying a few times.
func createSessions(base string, n, conns int) ([]pollSession, error) {
	start := time.Now()
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
					if out[i], err = createSession(client, base); err == nil {
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
	if firstErr == nil {
		fmt.Printf("  %d sessions created in %.1fs\n", n, time.Since(start).Seconds())
	}
	return out, firstErr
}

func createSession(client *http.Client, base string) (pollSession, error) {
	resp, err := client.Post(base+"/sessions", "application/json", strings.NewReader("{}"))
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

// presign signs polls of every session for the URL the backends
// advertise, as raw HTTP/1.1 requests, and writes them to file: request i
// polls session i % len(sess), each with a fresh nonce; as many rounds as
// a run can use at --max-rate (at most one per poll interval).
func (bn *bench) presign(mode, file string, sess []pollSession) (int, error) {
	o := bn.o
	start := time.Now()
	rounds := int((o.warmup+o.duration).Seconds()*float64(o.maxRate))/len(sess) + 2
	rounds = min(rounds, int((o.warmup+o.duration)/o.interval)+2)
	pollURL, err := url.Parse(externalURL + "/poll")
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
					u, err := protocol.SignURL(sess[i].SessionSecret, sess[i].SessionID, http.MethodGet, pollURL, nil)
					if err != nil {
						once.Do(func() { firstErr = err })
						return
					}
					// The Host a proxy in front of the replicas passes on.
					signed[i] = []byte("GET " + u.RequestURI() + " HTTP/1.1\r\nHost: " + pollURL.Host + "\r\n\r\n")
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
	n := rounds * len(sess)
	fmt.Printf("  %s: %d polls signed in %.1fs\n", mode, n, time.Since(start).Seconds())
	return n, f.Close()
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
