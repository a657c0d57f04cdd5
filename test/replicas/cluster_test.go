package replicas

import (
	"bufio"
	"context"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/testutil"

	"github.com/golang/groupcache/consistenthash"
	"golang.org/x/net/html"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kbprovider/backend/internal/binding"
	"github.com/kbprovider/backend/internal/localenv/controlplane"
	"github.com/kbprovider/backend/internal/localenv/oidcprovider"
	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil/backendproc"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/pollclient"
	"github.com/kbprovider/backend/pkg/protocol"
	"github.com/kbprovider/backend/web"
)

const (
	// pollInterval is every replica's --poll-interval.
	pollInterval = time.Second
	// pollGap is what the tests leave between two polls of one session:
	// more than the interval, so the backend never answers slow_down.
	pollGap = pollInterval + 150*time.Millisecond
	// answerWithin bounds every answer while a replica is frozen, cut
	// off or restarting: an owner that does not answer is skipped after
	// a second, so a few seconds are generous.
	answerWithin = 5 * time.Second
)

var alice = oidcprovider.Alice

// replica is one backend process, started again (same flags) as often as a
// test wants.
type replica struct {
	name     string
	host     string // loopback address of both listeners
	addr     string // public listener, host:port
	peerAddr string // peer listener, host:port
	peerURL  string // https://peerAddr, as --peers lists it
	diagAddr string // diagnostics listener (probes, metrics), host:port
	args     []string
	env      []string // added to the process's environment

	logs   *procs.Buffer // of every process, one after another
	runs   int
	cur    *run
	frozen bool
}

// run is one process of a replica.
type run struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error // valid once exited is closed
}

func (r *replica) pid() int { return r.cur.cmd.Process.Pid }

// start runs a new process with r.args until the test ends (or kill,
// stop). It does not wait until it is ready (waitReady).
func (r *replica) start(t *testing.T) {
	t.Helper()
	if r.logs == nil {
		r.logs = &procs.Buffer{}
		t.Cleanup(func() {
			r.shutdown()
			if t.Failed() {
				t.Logf("last lines of the logs of %s:\n%s", r.name, tail(r.logs.String(), 150))
			}
			if t.Failed() || os.Getenv(controlplane.KeepLogsEnv) != "" {
				saveLogs(t, r)
			}
		})
	}
	if r.cur != nil {
		select {
		case <-r.cur.exited:
		default:
			t.Fatalf("%s: started while its process %d runs", r.name, r.pid())
		}
	}
	r.runs++
	fmt.Fprintf(r.logs, "=== %s: process %d started at %s ===\n", r.name, r.runs, time.Now().Format("15:04:05.000"))
	cmd := exec.Command(backendproc.Binary, r.args...)
	cmd.Env = append(append(os.Environ(), backendproc.UnsafeSkipScopeCheckEnv), r.env...)
	cmd.Stdout, cmd.Stderr = r.logs, r.logs
	// In its own process group, killed if the test binary dies.
	if err := procs.StartTied(cmd); err != nil {
		t.Fatalf("starting %s: %v", r.name, err)
	}
	p := &run{cmd: cmd, exited: make(chan struct{})}
	go func() { p.waitErr = cmd.Wait(); close(p.exited) }()
	r.cur = p
	r.frozen = false
}

// shutdown ends the current process, if any: thawed, SIGTERM, SIGKILL
// after 10 s.
func (r *replica) shutdown() {
	p := r.cur
	if p == nil {
		return
	}
	if r.frozen {
		p.cmd.Process.Signal(syscall.SIGCONT)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// killAll sends SIGKILL to every replica at once, then waits for them.
func killAll(t *testing.T, reps ...*replica) {
	t.Helper()
	for _, r := range reps {
		r.cur.cmd.Process.Signal(syscall.SIGKILL)
	}
	for _, r := range reps {
		select {
		case <-r.cur.exited:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s still runs 10s after SIGKILL", r.name)
		}
		r.frozen = false
	}
}

// stop sends SIGTERM and expects a clean exit within 30 s, with the peer
// listener closed.
func (r *replica) stop(t *testing.T) {
	t.Helper()
	r.cur.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.cur.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s still runs 30s after SIGTERM", r.name)
	}
	if r.cur.waitErr != nil || !strings.Contains(r.logs.String(), "msg=stopped") {
		t.Errorf("%s after SIGTERM: exit %v, or no msg=stopped in its logs", r.name, r.cur.waitErr)
	}
	if c, err := net.DialTimeout("tcp", r.peerAddr, time.Second); err == nil {
		c.Close()
		t.Errorf("%s: the peer listener still accepts connections after the process exited", r.name)
	}
}

// freeze stops the process (SIGSTOP) as a stalled node would: its sockets
// stay open, connections are accepted by the kernel and never answered.
func (r *replica) freeze(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(r.pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	r.frozen = true
}

func (r *replica) thaw(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(r.pid(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	r.frozen = false
}

// readyz returns the status and body of /readyz on the diagnostics
// listener, which lists each readiness check.
func (r *replica) readyz() (int, string, error) {
	code, body, _, err := r.diagnostics("/readyz")
	return code, body, err
}

// diagnostics gets path from the diagnostics listener.
func (r *replica) diagnostics(path string) (int, string, http.Header, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + r.diagAddr + path)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, nil
}

// waitReady waits up to 60 s until the replica is ready and sees every
// dependency (identity provider, provider cluster) answer: the status
// page of its diagnostics listener.
func (r *replica) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body, h, err := r.diagnostics("/statusz")
		if code == http.StatusOK && h.Get("X-Ready") == "true" && !strings.Contains(body, "\n[-]") && !strings.Contains(body, "\n[?]") {
			return
		}
		select {
		case <-r.cur.exited:
			t.Fatalf("%s exited: %v\n%s", r.name, r.cur.waitErr, tail(r.logs.String(), 100))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after 60s: %d %s %v\n%s", r.name, code, body, err, tail(r.logs.String(), 100))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// memory returns the process's resident set and its peak, in bytes
// (VmRSS and VmHWM of /proc/<pid>/status).
func (r *replica) memory(t *testing.T) (rss, peak int64) {
	t.Helper()
	return procs.Memory(t, r.pid())
}

// metric returns the value of an unlabelled metric on /metrics of the
// diagnostics listener.
func (r *replica) metric(t *testing.T, name string) float64 {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + r.diagAddr + "/metrics")
	if err != nil {
		t.Fatalf("%s /metrics: %v", r.name, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %s %q", r.name, name, v)
			}
			return f
		}
	}
	t.Fatalf("%s: no metric %s on /metrics", r.name, name)
	return 0
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("(%d lines before)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// saveLogs writes a replica's whole logs to $KUBE_BIND_TEST_ARTIFACTS, if
// set (after a failure, or always with $KUBE_BIND_TEST_KEEP_LOGS).
func saveLogs(t *testing.T, r *replica) {
	dir := os.Getenv("KUBE_BIND_TEST_ARTIFACTS")
	if dir == "" {
		return
	}
	dir = filepath.Join(dir, "replicas", strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	p := filepath.Join(dir, r.name+".log")
	if os.WriteFile(p, []byte(r.logs.String()), 0o644) == nil {
		t.Logf("logs of %s: %s", r.name, p)
	}
}

// front stands for the Service in front of the replicas: the external URL
// of every replica. Tests pick the replica it sends to.
type front struct {
	url    string
	target atomic.Pointer[replica]
	mu     sync.Mutex
	hits   map[string]int
}

func newFront(t *testing.T) *front {
	f := &front{hits: map[string]int{}}
	rp := &httputil.ReverseProxy{
		// A new connection per request: replicas are killed and restarted.
		Transport: &http.Transport{DisableKeepAlives: true},
		Rewrite: func(pr *httputil.ProxyRequest) {
			r := f.target.Load()
			pr.SetURL(&url.URL{Scheme: "http", Host: r.addr})
			pr.Out.Host = pr.In.Host
			f.mu.Lock()
			f.hits[r.name]++
			f.mu.Unlock()
		},
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *front) pin(r *replica) { f.target.Store(r) }

// hitsOf returns the requests sent to each replica since the last call.
func (f *front) takeHits() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.hits
	f.hits = map[string]int{}
	return h
}

// cluster is a test's replicas with everything they share: the front, the
// identity provider, the session namespace and the keys.
type cluster struct {
	t    *testing.T
	ctx  context.Context
	cp   *controlplane.ControlPlane
	kube kubernetes.Interface
	idp  *oidcprovider.Provider
	f    *front
	ext  string
	// ns holds the session records.
	ns string
	// cookie and cluster secret keys, the same on every replica
	sign, enc, clusterKey string
	// peerKey is the key of defaultKeyFile, base64.
	peerKey        string
	defaultKeyFile string
	reps           []*replica
	// client sends the tests' polls: a new connection each, since
	// replicas are killed and restarted.
	client *http.Client
}

// clusterOpts configure newCluster.
type clusterOpts struct {
	replicas int
	// hosts are the loopback addresses of the replicas (default
	// 127.0.0.1 for each).
	hosts []string
	// keyFiles are the --peer-key-file of each replica (default: one
	// file with one random key for all).
	keyFiles []string
	// args are added to every replica's flags.
	args []string
	// logLevel of the replicas (default info).
	logLevel string
	// noStart: the replicas are prepared, not started.
	noStart bool
}

// newCluster prepares and (unless noStart) starts replicas that share
// sessions in a static ring, behind a front, logging users in at a real
// identity provider and provisioning on the package's control plane.
func newCluster(t *testing.T, opts clusterOpts) *cluster {
	t.Helper()
	cp := controlplane.Get(t)
	prepareCluster(t, cp)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := &cluster{
		t: t, ctx: ctx, cp: cp, kube: kubernetes.NewForConfigOrDie(cp.AdminConfig()),
		sign: procs.RandomKey(64), enc: procs.RandomKey(32), clusterKey: procs.RandomKey(32),
		peerKey: procs.RandomKey(32),
		client:  &http.Client{Timeout: 40 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
	}
	c.defaultKeyFile = writeKeyFile(t, c.peerKey)
	c.f = newFront(t)
	c.ext = c.f.url
	c.idp = oidcprovider.Start(t, oidcprovider.Options{RedirectURIs: []string{c.ext + "/callback"}, Users: []oidcprovider.User{alice}})

	// The session records' namespace, one per test.
	c.ns = "kb-sessions-" + randomHex(4)
	if _, err := c.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.kube.CoreV1().Namespaces().Delete(context.Background(), c.ns, metav1.DeleteOptions{})
	})

	for i := range opts.replicas {
		host := "127.0.0.1"
		if i < len(opts.hosts) {
			host = opts.hosts[i]
		}
		c.reps = append(c.reps, newReplica(t, fmt.Sprintf("replica-%d", i), host))
	}
	peers := peerURLs(c.reps)
	for i, r := range c.reps {
		keyFile := c.defaultKeyFile
		if i < len(opts.keyFiles) {
			keyFile = opts.keyFiles[i]
		}
		r.args = append(c.replicaArgs(r, peers, keyFile, opts.logLevel), opts.args...)
	}
	if !opts.noStart {
		for _, r := range c.reps {
			r.start(t)
		}
		for _, r := range c.reps {
			r.waitReady(t)
		}
	}
	return c
}

// newReplica prepares a replica on fresh ports of host.
func newReplica(t *testing.T, name, host string) *replica {
	port, peerPort, diagPort := procs.FreePort(t), procs.FreePort(t), procs.FreePort(t)
	r := &replica{
		name:     name,
		host:     host,
		addr:     net.JoinHostPort(host, strconv.Itoa(port)),
		peerAddr: net.JoinHostPort(host, strconv.Itoa(peerPort)),
		diagAddr: net.JoinHostPort(host, strconv.Itoa(diagPort)),
	}
	r.peerURL = "https://" + r.peerAddr
	return r
}

func peerURLs(reps []*replica) []string {
	var peers []string
	for _, r := range reps {
		peers = append(peers, r.peerURL)
	}
	return peers
}

// replicaArgs are the flags of r in a static ring of peers.
func (c *cluster) replicaArgs(r *replica, peers []string, keyFile, logLevel string) []string {
	if logLevel == "" {
		logLevel = "info"
	}
	return []string{
		"--listen-address", r.addr,
		"--diagnostics-address", r.diagAddr,
		"--external-url", c.ext,
		"--session-store", "ring",
		"--session-namespace", c.ns,
		"--peer-listen-address", r.peerAddr,
		"--peer-self-url", r.peerURL,
		"--peers", strings.Join(peers, ","),
		"--peer-key-file", keyFile,
		"--poll-interval", pollInterval.String(),
		"--oidc-issuer-url", c.idp.IssuerURL,
		"--oidc-issuer-client-id", c.idp.ClientID,
		"--oidc-issuer-client-secret", c.idp.ClientSecret,
		"--oidc-allowed-groups", "binders",
		"--cookie-signing-key", c.sign,
		"--cookie-encryption-key", c.enc,
		"--cluster-secret-key", c.clusterKey,
		"--kubeconfig", c.cp.AdminKubeconfigPath(),
		"--namespace-prefix", namespacePrefix,
		// The package's tests bind as alice, each a new cluster, on one
		// control plane: the per-user cap is test/e2e's subject.
		"--max-clusters-per-user", "10000",
		"--log-format", "text",
		"--log-level", logLevel,
	}
}

// writeKeyFile writes a --peer-key-file with keys (base64), one a line.
func writeKeyFile(t *testing.T, keys ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "peer-keys")
	if err := os.WriteFile(p, []byte(strings.Join(keys, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// ownerOf is the replica that owns a session: groupcache's consistent
// hash, 50 virtual nodes per member, the members the sorted peer URLs, as
// internal/sessions/ring places sessions.
func ownerOf(reps []*replica, id string) *replica {
	members := slices.Sorted(slices.Values(peerURLs(reps)))
	m := consistenthash.New(50, nil)
	m.Add(members...)
	o := m.Get(id)
	for _, r := range reps {
		if r.peerURL == o {
			return r
		}
	}
	panic("owner " + o + " is no replica")
}

// sessionKeyID is the ID of the session key derived from a peer key
// (base64) as internal/server derives it: the bytes 1 to 4 of the IDs it
// issues (internal/sessions/sessionkey).
func sessionKeyID(t *testing.T, peerKey string) []byte {
	t.Helper()
	pk, err := base64.StdEncoding.DecodeString(peerKey)
	if err != nil {
		t.Fatal(err)
	}
	k, err := hkdf.Key(sha256.New, pk, nil, "kube-bind session key", 32)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(k)
	return sum[:4]
}

// keyIDOf returns the key ID bytes of a session ID.
func keyIDOf(t *testing.T, id string) []byte {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil || len(b) < 5 {
		t.Fatalf("session ID %q does not decode", id)
	}
	return b[1:5]
}

// session is a poll session as the client holds it.
type session struct {
	v1alpha1.PollSession
	ext string // external URL the signatures are made for
	// clusterSecret, when set, proves the presented cluster ID in the
	// authentication URL (pkg/protocol).
	clusterSecret string
}

// create posts a session to replica r and expects 201: a session is
// derived from keys, so creating one never fails.
func (c *cluster) create(t *testing.T, r *replica) *session {
	t.Helper()
	resp, err := c.client.Post("http://"+r.addr+"/sessions", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatalf("POST /sessions on %s: %v", r.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /sessions on %s: %d %s", r.name, resp.StatusCode, b)
	}
	s := &session{ext: c.ext}
	if err := json.Unmarshal(b, &s.PollSession); err != nil || s.SessionID == "" || s.SessionSecret == "" {
		t.Fatalf("POST /sessions on %s: %s (%v)", r.name, b, err)
	}
	return s
}

// signedPoll is the URL of one signed poll (one fresh nonce) for the
// advertised poll URL.
func (s *session) signedPoll() *url.URL {
	u, _ := url.Parse(s.ext + "/poll")
	signed, err := protocol.SignURL(s.SessionSecret, s.SessionID, http.MethodGet, u, nil)
	if err != nil {
		panic(err)
	}
	return signed
}

// authURL is the signed authentication URL the client shows the user.
func (s *session) authURL() string {
	u, _ := url.Parse(s.ext + "/authorize")
	if s.clusterSecret != "" {
		u.RawQuery = url.Values{protocol.ProofParam: {protocol.ClusterProof(s.clusterSecret, s.SessionID)}}.Encode()
	}
	signed, err := protocol.SignURL(s.SessionSecret, s.SessionID, http.MethodGet, u, nil)
	if err != nil {
		panic(err)
	}
	return signed.String()
}

// pollAnswer is what a replica answered to a poll.
type pollAnswer struct {
	status     int
	code, msg  string
	retryAfter string
	body       []byte
	took       time.Duration
	err        error // no answer
}

func (a pollAnswer) String() string {
	if a.err != nil {
		return fmt.Sprintf("no answer after %s: %v", a.took.Round(time.Millisecond), a.err)
	}
	return fmt.Sprintf("%d %s %q Retry-After %q (%s)", a.status, a.code, a.msg, a.retryAfter, a.took.Round(time.Millisecond))
}

func (a pollAnswer) pending() bool {
	return a.status == http.StatusForbidden && a.code == v1alpha1.ErrorAuthorizationPending
}

// send sends a signed poll to replica r directly (the signature is for the
// external URL, which every replica checks against).
func (c *cluster) send(r *replica, signed *url.URL, header http.Header) pollAnswer {
	u := *signed
	u.Scheme, u.Host = "http", r.addr
	req, _ := http.NewRequestWithContext(c.ctx, http.MethodGet, u.String(), nil)
	for k, v := range header {
		req.Header[k] = v
	}
	start := time.Now()
	resp, err := c.client.Do(req)
	if err != nil {
		return pollAnswer{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a := pollAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: b, took: time.Since(start), err: err}
	var e v1alpha1.Error
	if resp.StatusCode != http.StatusOK && json.Unmarshal(b, &e) == nil {
		a.code, a.msg = e.Error, e.Message
	}
	return a
}

// poll sends one freshly signed poll of s to r.
func (c *cluster) poll(r *replica, s *session) pollAnswer {
	return c.send(r, s.signedPoll(), nil)
}

// expect fails the test unless a has the status and error code.
func expect(t *testing.T, what string, a pollAnswer, status int, code string) {
	t.Helper()
	if a.err != nil || a.status != status || a.code != code {
		t.Fatalf("%s: %s; want %d %s\nbody: %.300s", what, a, status, code, a.body)
	}
}

// checkResponse checks a BindingResponse for s: valid for its session,
// naming a namespace provisioned for its cluster. It returns the
// namespace.
func (c *cluster) checkResponse(t *testing.T, s *session, body []byte) string {
	t.Helper()
	var br v1alpha1.BindingResponse
	if err := json.Unmarshal(body, &br); err != nil {
		t.Fatalf("session %s: the 200 is no BindingResponse: %v", s.SessionID, err)
	}
	res, err := pollclient.ValidateBindingResponse(&br, s.SessionID)
	if err != nil {
		t.Fatalf("session %s: %v", s.SessionID, err)
	}
	if !strings.HasPrefix(res.Namespace, namespacePrefix) {
		t.Fatalf("session %s: provider namespace %q", s.SessionID, res.Namespace)
	}
	ns, err := c.kube.CoreV1().Namespaces().Get(c.ctx, res.Namespace, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("session %s: the response's namespace: %v", s.SessionID, err)
	}
	if got := ns.Annotations[binding.AnnotationCluster]; got != s.ClusterID {
		t.Fatalf("session %s: namespace %s belongs to cluster %q, not the session's %q", s.SessionID, res.Namespace, got, s.ClusterID)
	}
	return res.Namespace
}

// deliver polls s on r until the BindingResponse comes (pending answers
// are waited out, a poll gap apart, for up to within) and checks it. Any
// other answer fails the test.
func (c *cluster) deliver(t *testing.T, r *replica, s *session, within time.Duration) []byte {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		a := c.poll(r, s)
		switch {
		case a.err == nil && a.status == http.StatusOK:
			c.checkResponse(t, s, a.body)
			return a.body
		case a.pending() && time.Now().Before(deadline):
			time.Sleep(pollGap)
		default:
			t.Fatalf("poll of %s on %s: %s; want the BindingResponse\nbody: %.300s", s.SessionID, r.name, a, a.body)
		}
	}
}

// selection is a browser on the API selection page of one session.
type selection struct {
	client *http.Client
	s      *session
	target *url.URL
	form   url.Values
}

// openSelection does the browser part of session s like a browser with
// cookies would, through the front (pinned by the caller): the
// authentication URL, the login at the identity provider, the callback
// and the selection page.
func (c *cluster) openSelection(t *testing.T, s *session) *selection {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	callback, err := c.idp.Login(c.ctx, client, s.authURL(), alice.Name, alice.Password)
	if err != nil {
		t.Fatalf("session %s: login: %v", s.SessionID, err)
	}
	if !strings.HasPrefix(callback.String(), c.ext+"/callback") {
		t.Fatalf("session %s: login ended at %s, want the backend's callback", s.SessionID, callback)
	}
	resp, err := client.Get(callback.String())
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("session %s: callback led to %d at %s:\n%s", s.SessionID, resp.StatusCode, resp.Request.URL, brief(page))
	}
	forms, err := testutil.ParseForms(page)
	if err != nil || len(forms) == 0 || forms[0].Fields.Get(web.FieldCSRF) == "" {
		t.Fatalf("session %s: no selection form at %s:\n%s", s.SessionID, resp.Request.URL, brief(page))
	}
	action, form := forms[0].Action, forms[0].Fields
	return &selection{client: client, s: s, target: resp.Request.URL.ResolveReference(&url.URL{Path: action}), form: form}
}

// signIn logs alice in through link (the callback through the front) and
// returns the status the callback led to: 200 on the selection page.
func (c *cluster) signIn(t *testing.T, link string) int {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	callback, err := c.idp.Login(c.ctx, client, link, alice.Name, alice.Password)
	if err != nil {
		t.Fatalf("login through %s: %v", link, err)
	}
	resp, err := client.Get(callback.String())
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// bind picks the exported API and presses Bind, through the front; it
// returns the status and the page.
func (sel *selection) bind(ctx context.Context, origin string) (int, string) {
	form := bindForm(sel.form)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, sel.target.String(), strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", origin)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := sel.client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(page)
}

// mustBind presses Bind and expects the page that sends the user back to
// the terminal.
func (c *cluster) mustBind(t *testing.T, sel *selection) {
	t.Helper()
	status, page := sel.bind(c.ctx, c.ext)
	if status != http.StatusOK || !strings.Contains(strings.ToLower(page), "terminal") {
		t.Fatalf("session %s: Bind answered %d: %s", sel.s.SessionID, status, brief([]byte(page)))
	}
}

// bindVia does the whole browser part of s: authentication URL, login and
// selection page through replica login, Bind through replica bind.
func (c *cluster) bindVia(t *testing.T, s *session, login, bind *replica) {
	t.Helper()
	c.f.pin(login)
	sel := c.openSelection(t, s)
	c.f.pin(bind)
	c.mustBind(t, sel)
}

// bindForm is the selection page's form (its hidden fields) with the
// exported CRD chosen and Bind confirmed.
func bindForm(page url.Values) url.Values {
	form := url.Values{}
	for k, v := range page {
		form[k] = v
	}
	form.Add(web.FieldAPI, exportedCRD)
	form.Set(web.FieldAction, web.ActionBind)
	form.Set(web.FieldConfirm, web.ConfirmYes)
	return form
}

// brief is the text of a page's first heading and paragraph, for reports.
func brief(page []byte) string {
	doc, err := html.Parse(strings.NewReader(string(page)))
	if err != nil {
		return fmt.Sprintf("%.200q", page)
	}
	var parts []string
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && (n.Data == "h1" || n.Data == "p") && len(parts) < 2 {
			var b strings.Builder
			for c := n.FirstChild; c != nil; c = c.NextSibling {
				if c.Type == html.TextNode {
					b.WriteString(c.Data)
				}
			}
			parts = append(parts, strings.Join(strings.Fields(b.String()), " "))
			return
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	if len(parts) == 0 {
		return fmt.Sprintf("%.200q", page)
	}
	return strings.Join(parts, " / ")
}

// noFollow is a client that does not follow redirects.
var noFollow = &http.Client{
	Timeout:       30 * time.Second,
	Transport:     &http.Transport{DisableKeepAlives: true},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// openLink opens a signed authentication URL on replica r directly and
// returns the status (a good link redirects to the identity provider).
func openLink(t *testing.T, r *replica, link string) int {
	t.Helper()
	u, _ := url.Parse(link)
	u.Scheme, u.Host = "http", r.addr
	resp, err := noFollow.Get(u.String())
	if err != nil {
		t.Fatalf("authentication URL on %s: %v", r.name, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// quantile of sorted ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(q*float64(len(ds))+0.5) - 1
	return ds[min(max(i, 0), len(ds)-1)].Round(time.Millisecond)
}

// latencies collects how long answers took, safe for concurrent use.
type latencies struct {
	mu sync.Mutex
	ds []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.ds = append(l.ds, d)
	l.mu.Unlock()
}

func (l *latencies) String() string {
	l.mu.Lock()
	ds := slices.Sorted(slices.Values(l.ds))
	l.mu.Unlock()
	if len(ds) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d answers: p50 %s, p90 %s, max %s", len(ds), quantile(ds, 0.5), quantile(ds, 0.9), ds[len(ds)-1].Round(time.Millisecond))
}
