package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/internal/testutil/pollbackend"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
)

// binary is the command built once for all tests: they run it as a real
// process, the way a user over SSH does.
var binary string

func TestMain(m *testing.M) {
	bin, cleanup, err := procs.Build("./cmd/kube-bind-poll")
	if err != nil {
		fmt.Fprintln(os.Stderr, "building kube-bind-poll:", err)
		os.Exit(1)
	}
	binary = bin
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// proc is a running kube-bind-poll.
type proc struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr procs.Buffer // read while the process runs
	lines  chan string
	done   chan struct{}
}

func start(t *testing.T, dir string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(binary, args...), lines: make(chan string, 100), done: make(chan struct{})}
	p.cmd.Dir = dir
	// No cluster unless a test names one: a kubeconfig of the machine must
	// not turn a files-only test into a bind.
	p.cmd.Env = append(os.Environ(), "HOME="+dir, "KUBECONFIG=", "KUBERNETES_SERVICE_HOST=")
	p.cmd.Stdout = &p.stdout
	errPipe, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(errPipe)
		for sc.Scan() {
			fmt.Fprintln(&p.stderr, sc.Text())
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	})
	return p
}

// authURL waits for the URL the command prints for the user.
func (p *proc) authURL(t *testing.T) *url.URL {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case line := <-p.lines:
			if s := strings.TrimSpace(line); strings.HasPrefix(s, "http") {
				u, err := url.Parse(s)
				if err != nil {
					t.Fatal(err)
				}
				return u
			}
		case <-timeout:
			t.Fatalf("no URL printed; stderr:\n%s", p.errText())
		}
	}
}

// wait waits for the process to end and returns its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	exited := make(chan error, 1)
	go func() {
		<-p.done // stderr fully read
		exited <- p.cmd.Wait()
	}()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(30 * time.Second):
		t.Fatalf("kube-bind-poll did not exit; stderr:\n%s", p.errText())
		return -1
	}
}

func (p *proc) errText() string { return p.stderr.String() }

func sessionOf(t *testing.T, u *url.URL) string {
	t.Helper()
	sid := u.Query().Get(protocol.ParamSession)
	if sid == "" || u.Query().Get(protocol.ParamNonce) == "" || u.Query().Get(protocol.ParamSignature) == "" {
		t.Fatalf("printed URL %s is not signed", u)
	}
	return sid
}

func TestBindWritesFiles(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{})
	out := t.TempDir()
	p := start(t, t.TempDir(), "--output-dir", out, b.ExportURL)
	u := p.authURL(t)
	if !strings.HasPrefix(u.String(), b.URL+"/authorize?") {
		t.Errorf("printed URL %s is not the provider's authenticatedURL", u)
	}
	sid := sessionOf(t, u)
	sess, err := b.Sessions.Open(sid)
	if err != nil {
		t.Fatal(err)
	}
	// No cluster ID was presented: the backend issued the one it derives
	// from the session ID.
	clusterID, _ := b.Sessions.SettleCluster(sess, "")
	r, _ := protocol.RequestFromURL("GET", u, nil)
	if !protocol.Verify(sess.Secret, r, u.Query().Get(protocol.ParamSignature)) {
		t.Error("printed URL's signature does not verify with the session's secret")
	}
	resp := pollbackend.BindingResponse(t, sid, "kube-bind-cli", "mangodbs.mangodb.com")
	time.Sleep(300 * time.Millisecond) // let it poll while pending
	if err := b.Complete(sid, resp); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, p.errText())
	}

	gotJSON := readFile0600(t, filepath.Join(out, "binding-response.json"))
	var compact bytes.Buffer
	if err := json.Compact(&compact, gotJSON); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(compact.Bytes(), resp) {
		t.Errorf("binding-response.json\n%s\nwant (up to whitespace)\n%s", gotJSON, resp)
	}
	var br v1alpha1.BindingResponse
	if err := json.Unmarshal(resp, &br); err != nil {
		t.Fatal(err)
	}
	if got := readFile0600(t, filepath.Join(out, "kubeconfig")); !bytes.Equal(got, br.Kubeconfig) {
		t.Errorf("kubeconfig\n%s\nwant\n%s", got, br.Kubeconfig)
	}
	stderr := p.errText()
	for _, want := range []string{"namespace kube-bind-cli", "--cluster-id " + clusterID, "Test Provider"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, sess.Secret) || p.stdout.Len() != 0 {
		t.Errorf("secret on stderr, or output on stdout %q", p.stdout.String())
	}
	entries, _ := os.ReadDir(out)
	if len(entries) != 2 {
		t.Errorf("output dir holds %d entries, want the two files (no temporaries)", len(entries))
	}

	// A second run refuses to overwrite, before contacting anyone.
	p = start(t, t.TempDir(), "--output-dir", out, b.ExportURL)
	if code := p.wait(t); code != 2 || !strings.Contains(p.errText(), "--force") {
		t.Errorf("second run: exit %d, stderr %s; want 2 and a hint at --force", code, p.errText())
	}
}

func readFile0600(t *testing.T, path string) []byte {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBindToStdoutWithClusterID(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{})
	cwd := t.TempDir()
	p := start(t, cwd, b.ExportURL, "--print-response", "--cluster-id", "aB3xY9", "-v", "2")
	sid := sessionOf(t, p.authURL(t))
	sess, err := b.Sessions.Open(sid)
	if err != nil {
		t.Fatal(err)
	}
	if sess.ClusterID != "aB3xY9" {
		t.Errorf("session's cluster ID %q, want the one presented", sess.ClusterID)
	}
	resp := pollbackend.BindingResponse(t, sid, "ns-stdout", "a.example.org", "b.example.org")
	time.Sleep(300 * time.Millisecond)
	if err := b.Complete(sid, resp); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, p.errText())
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, p.stdout.Bytes()); err != nil || !bytes.Equal(compact.Bytes(), resp) {
		t.Errorf("stdout %s (%v), want the BindingResponse", p.stdout.Bytes(), err)
	}
	if entries, _ := os.ReadDir(cwd); len(entries) != 0 {
		t.Errorf("files written with --print-response: %v", entries)
	}
	if !strings.Contains(p.errText(), "poll 1: pending") {
		t.Errorf("-v 2 logs no polls:\n%s", p.errText())
	}
}

func TestDenied(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{})
	out := t.TempDir()
	p := start(t, t.TempDir(), "--output-dir", out, b.ExportURL)
	sid := sessionOf(t, p.authURL(t))
	if err := b.Deny(sid, "the user cancelled"); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 1 {
		t.Fatalf("exit code %d, want 1; stderr:\n%s", code, p.errText())
	}
	if !strings.Contains(p.errText(), "the user cancelled") || !strings.Contains(p.errText(), "access denied") {
		t.Errorf("stderr does not say why:\n%s", p.errText())
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("files written after a denial: %v", entries)
	}
}

func TestExpired(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{})
	p := start(t, t.TempDir(), "--output-dir", t.TempDir(), b.ExportURL)
	p.authURL(t)
	b.Clock.Advance(11 * time.Minute)
	if code := p.wait(t); code != 1 || !strings.Contains(p.errText(), "Run the command again") {
		t.Fatalf("exit code %d, want 1 with a hint to start over; stderr:\n%s", code, p.errText())
	}
}

func TestTimeoutAndInterrupt(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{})
	p := start(t, t.TempDir(), "--timeout", "700ms", "--print-response", b.ExportURL)
	p.authURL(t)
	if code := p.wait(t); code != 1 || !strings.Contains(p.errText(), "gave up after --timeout 700ms") {
		t.Fatalf("exit code %d, want 1; stderr:\n%s", code, p.errText())
	}

	p = start(t, t.TempDir(), "--print-response", b.ExportURL)
	p.authURL(t)
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 1 || !strings.Contains(p.errText(), "interrupted") {
		t.Fatalf("exit code %d, want 1; stderr:\n%s", code, p.errText())
	}
}

func TestUsageErrors(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{})
	cases := map[string][]string{
		"no argument":              {},
		"two arguments":            {b.ExportURL, b.ExportURL},
		"not a URL":                {"bind.example.com/export"},
		"unknown flag":             {"--nope", b.ExportURL},
		"bad -o":                   {"-o", "file.json", b.ExportURL},
		"the old files-only -o -":  {"-o", "-", b.ExportURL},
		"-o with --output-dir":     {"-o", "yaml", "--output-dir", ".", b.ExportURL},
		"the old boolean -v":       {"-v", b.ExportURL},
		"another namespace":        {"-n", "default", "--print-response", b.ExportURL},
		"bad timeout":              {"--timeout", "soon", b.ExportURL},
		"missing dir":              {"--output-dir", "/nonexistent/dir", b.ExportURL},
		"missing provider CA file": {"--provider-certificate-authority", "/nonexistent/ca.pem", b.ExportURL},
		"negative timeout":         {"--timeout=-1s", b.ExportURL},
		"no cluster":               {b.ExportURL},
		"missing kubeconfig":       {"--kubeconfig", "/nonexistent/kubeconfig", b.ExportURL},
		"dry run to files":         {"--dry-run", "--output-dir", ".", b.ExportURL},
		"dry run to stdout":        {"--dry-run", "--print-response", b.ExportURL},
		"both no-cluster modes":    {"--print-response", "--output-dir", ".", b.ExportURL},
		"bad flow":                 {"--flow", "carrier-pigeon", b.ExportURL},
		"bad protocol":             {"--protocol", "v2", b.ExportURL},
		"v1alpha2 callback flow":   {"--protocol", "v1alpha2", "--flow", "callback", "--print-response", b.ExportURL},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			p := start(t, t.TempDir(), args...)
			if code := p.wait(t); code != 2 {
				t.Errorf("exit code %d, want 2; stderr:\n%s", code, p.errText())
			}
			if p.errText() == "" {
				t.Error("no message on stderr")
			}
		})
	}
	// Nothing of these reached the backend.
	if n := b.SessionsCreated(); n != 0 {
		t.Errorf("usage errors created %d sessions", n)
	}
}

func TestProviderWithoutPollFlow(t *testing.T) {
	// An export URL that is not a poll provider fails with exit 1 and a
	// readable reason.
	b := pollbackend.Start(t, pollbackend.Options{})
	p := start(t, t.TempDir(), "--print-response", b.URL+"/nothing-here")
	if code := p.wait(t); code != 1 || !strings.Contains(p.errText(), "404") {
		t.Fatalf("exit code %d, want 1 naming the 404; stderr:\n%s", code, p.errText())
	}
}

// --protocol v1alpha2 against a provider without a v1alpha2 document
// fails with exit 1 naming the generation; v1alpha1 goes on.
func TestForcedProtocol(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{})
	p := start(t, t.TempDir(), "--protocol", "v1alpha2", "--print-response", b.ExportURL)
	if code := p.wait(t); code != 1 || !strings.Contains(p.errText(), "kube-bind.io/v1alpha2") {
		t.Fatalf("exit code %d, want 1 naming kube-bind.io/v1alpha2; stderr:\n%s", code, p.errText())
	}
	if n := b.SessionsCreated(); n != 0 {
		t.Errorf("created %d sessions", n)
	}
}

func TestNoClusterSaysSo(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{})
	p := start(t, t.TempDir(), b.ExportURL)
	if code := p.wait(t); code != 2 || !strings.Contains(p.errText(), "no cluster to bind into") || !strings.Contains(p.errText(), "--output-dir") {
		t.Fatalf("exit code %d, want 2 naming the missing cluster and --output-dir; stderr:\n%s", code, p.errText())
	}
}

func TestUnreachableClusterFailsBeforeTheBrowserStep(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{})
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	server := fmt.Sprintf("https://127.0.0.1:%d", procs.FreePort(t))
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, dir, "--kubeconfig", kc, b.ExportURL)
	if code := p.wait(t); code != 1 || !strings.Contains(p.errText(), "does not answer") || !strings.Contains(p.errText(), server) {
		t.Fatalf("exit code %d, want 1 saying the cluster at %s does not answer; stderr:\n%s", code, server, p.errText())
	}
	if n := b.SessionsCreated(); strings.Contains(p.errText(), "http://") || n != 0 {
		t.Errorf("a session was opened or a URL printed before the cluster was checked (%d sessions):\n%s", n, p.errText())
	}
}

// Help is cobra's, on stdout, with kubectl's flags for the cluster and the
// provider's CA under its own name.
func TestHelp(t *testing.T) {
	p := start(t, t.TempDir(), "--help")
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, p.errText())
	}
	for _, want := range []string{"Usage:\n  kube-bind-poll [flags] <export-url>", "--kubeconfig", "--context", "--cluster", "--user",
		"--server", "--token", "--insecure-skip-tls-verify", "--request-timeout", "--certificate-authority string",
		"--provider-certificate-authority", "-o, --output", "-v, --v Level", "--dry-run", "--print-response"} {
		if !strings.Contains(p.stdout.String(), want) {
			t.Errorf("--help lacks %q:\n%s", want, p.stdout.String())
		}
	}
}

// fakeCluster is a TLS API server that knows /version only: enough for
// the checks before the browser step and a dry run with --skip-konnector.
// It records every request that is not a read.
type fakeCluster struct {
	srv    *httptest.Server
	caFile string
	mu     sync.Mutex
	writes []string
}

func startFakeCluster(t *testing.T) *fakeCluster {
	t.Helper()
	c := &fakeCluster{}
	c.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			c.mu.Lock()
			c.writes = append(c.writes, r.Method+" "+r.URL.Path)
			c.mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/version" {
			fmt.Fprint(w, `{"major":"1","minor":"36","gitVersion":"v1.36.3"}`)
			return
		}
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
	}))
	t.Cleanup(c.srv.Close)
	c.caFile = filepath.Join(t.TempDir(), "ca.pem")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.srv.Certificate().Raw})
	if err := os.WriteFile(c.caFile, ca, 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// --server, --token and --certificate-authority name the consumer cluster
// as in kubectl, without a kubeconfig; the CA is the cluster's, not the
// provider's.
func TestKubectlFlagsNameTheCluster(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{})
	c := startFakeCluster(t)

	p := start(t, t.TempDir(), "--server", c.srv.URL, "--token", "x", b.ExportURL)
	if code := p.wait(t); code != 1 || !strings.Contains(p.errText(), "does not answer") || !strings.Contains(p.errText(), "certificate") {
		t.Fatalf("without the cluster's CA: exit code %d, want 1 naming the certificate; stderr:\n%s", code, p.errText())
	}
	p = start(t, t.TempDir(), "--server", c.srv.URL, "--token", "x", "--certificate-authority", c.caFile, b.ExportURL)
	sessionOf(t, p.authURL(t)) // past the cluster's checks: the session is open
	if !strings.Contains(p.errText(), "Binding into the cluster at "+c.srv.URL) {
		t.Errorf("the cluster of --server is not named:\n%s", p.errText())
	}
}

// A dry run opens no session at the provider and writes nothing in the
// cluster; it prints what it would write there.
func TestDryRunOpensNoSession(t *testing.T) {
	b := pollbackend.Start(t, pollbackend.Options{})
	c := startFakeCluster(t)
	p := start(t, t.TempDir(), "--server", c.srv.URL, "--certificate-authority", c.caFile, "--skip-konnector", "--dry-run", "-o", "json", b.ExportURL)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, p.errText())
	}
	var list struct {
		Kind  string `json:"kind"`
		Items []struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal(p.stdout.Bytes(), &list); err != nil || list.Kind != "List" || len(list.Items) != 1 ||
		list.Items[0].Kind != "Namespace" || list.Items[0].Metadata.Name != "kube-bind" {
		t.Errorf("dry run printed %s (%v), want a List of Namespace kube-bind", p.stdout.String(), err)
	}
	if n := b.SessionsCreated(); n != 0 {
		t.Errorf("the dry run opened %d session(s) at the provider", n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.writes) != 0 {
		t.Errorf("the dry run wrote to the cluster: %v", c.writes)
	}
	if !strings.Contains(p.errText(), "no session was opened") || strings.Contains(p.errText(), "http://") {
		t.Errorf("stderr does not say what the dry run did, or shows a URL:\n%s", p.errText())
	}
}
