package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kbprovider/backend/internal/localenv/procs"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/protocol"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
	cleanBin  func()
)

func TestMain(m *testing.M) {
	code := m.Run()
	if cleanBin != nil {
		cleanBin()
	}
	os.Exit(code)
}

// buildBackend builds this command once per test run, stamped with a
// version, as a release build would be.
func buildBackend(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		builtBin, cleanBin, buildErr = procs.Build("./cmd/backend",
			"-ldflags", "-X github.com/kbprovider/backend/internal/version.Version=v9.8.7-test")
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// TestProcess starts the backend as a separate process, talks to it over
// real HTTP, and stops it with SIGTERM.
func TestProcess(t *testing.T) {
	bin := buildBackend(t)

	out, err := exec.Command(bin, "--version").Output()
	if err != nil || strings.TrimSpace(string(out)) != "v9.8.7-test" {
		t.Fatalf("--version: %q, %v", out, err)
	}

	cmd := exec.Command(bin, "--listen-address=127.0.0.1:0", "--diagnostics-address=127.0.0.1:0", "--log-level=debug", "--pretty-name=Process Test")
	cmd.Env = append(os.Environ(), "KUBE_BIND_POLL_INTERVAL=1s")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed when the process ended; waitErr says how.
	exited := make(chan struct{})
	var waitErr error
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
	})

	// The log line "serving" says where the backend and its diagnostics are.
	lines := bufio.NewScanner(stderr)
	found := make(chan [2]string, 1)
	var logs procs.Buffer
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		sent := false
		for lines.Scan() {
			fmt.Fprintln(&logs, lines.Text())
			var rec struct {
				Msg         string `json:"msg"`
				ExternalURL string `json:"external_url"`
				Diagnostics string `json:"diagnostics_address"`
			}
			if !sent && json.Unmarshal(lines.Bytes(), &rec) == nil && rec.Msg == "serving" {
				found <- [2]string{rec.ExternalURL, "http://" + rec.Diagnostics}
				sent = true
			}
		}
	}()
	go func() { <-logDone; waitErr = cmd.Wait(); close(exited) }()

	var base, diag string
	select {
	case where := <-found:
		base, diag = where[0], where[1]
	case <-exited:
		t.Fatalf("backend exited early: %v\n%s", waitErr, logs.String())
	case <-time.After(20 * time.Second):
		t.Fatal("backend did not log \"serving\" within 20s")
	}
	if !strings.HasPrefix(base, "http://127.0.0.1:") {
		t.Fatalf("external URL %q, want the derived http://127.0.0.1:<port>", base)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	getAt := func(base, path string) (*http.Response, []byte) {
		t.Helper()
		resp, err := client.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	get := func(path string) (*http.Response, []byte) { t.Helper(); return getAt(base, path) }

	resp, body := get("/export")
	var bp v1alpha1.BindingProvider
	if resp.StatusCode != 200 || json.Unmarshal(body, &bp) != nil || len(bp.AuthenticationMethods) != 2 {
		t.Fatalf("/export: %d %s", resp.StatusCode, body)
	}
	poll := bp.AuthenticationMethods[0].OAuth2CodeGrantPoll
	if bp.ProviderPrettyName != "Process Test" || poll == nil || poll.PollURL != base+"/poll" || poll.PollInterval != "1s" {
		t.Fatalf("/export: %s", body)
	}
	if resp, body := get("/healthz"); resp.StatusCode != 200 {
		t.Fatalf("/healthz: %d %s", resp.StatusCode, body)
	}
	// The public port says ready or not, no more, and serves no metrics;
	// the diagnostics port has the detail.
	if resp, body := get("/readyz?verbose"); resp.StatusCode != 200 || string(body) != "ok\n" {
		t.Fatalf("public /readyz: %d %s", resp.StatusCode, body)
	}
	if resp, body := get("/metrics"); resp.StatusCode != 404 {
		t.Fatalf("public /metrics: %d, want 404\n%.200s", resp.StatusCode, body)
	}
	if resp, body := getAt(diag, "/readyz"); resp.StatusCode != 200 || !strings.Contains(string(body), "[+]shutdown ok") {
		t.Fatalf("diagnostics /readyz: %d %s", resp.StatusCode, body)
	}
	if resp, body := getAt(diag, "/metrics"); resp.StatusCode != 200 || !strings.Contains(string(body), "go_goroutines") {
		t.Fatalf("diagnostics /metrics: %d %.200s", resp.StatusCode, body)
	}

	resp, err = client.Post(poll.SessionURL, "application/json", strings.NewReader(`{"clusterID":"aB3dE9"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var ps v1alpha1.PollSession
	if resp.StatusCode != 201 || json.Unmarshal(body, &ps) != nil || ps.ClusterID != "aB3dE9" {
		t.Fatalf("POST /sessions: %d %s", resp.StatusCode, body)
	}
	pollOnce := func() (int, string, http.Header) {
		t.Helper()
		u, _ := url.Parse(poll.PollURL)
		signed, err := protocol.SignURL(ps.SessionSecret, ps.SessionID, "GET", u, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Get(signed.String())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e v1alpha1.Error
		json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error, resp.Header
	}
	if code, e, _ := pollOnce(); code != 403 || e != "authorization_pending" {
		t.Fatalf("first poll: %d %s", code, e)
	}
	if code, e, h := pollOnce(); code != 429 || e != "slow_down" || h.Get("Retry-After") != "1" {
		t.Fatalf("second poll at once: %d %s Retry-After %q", code, e, h.Get("Retry-After"))
	}

	// A request in flight when SIGTERM comes is finished: its body is
	// only half sent when the signal arrives. Expect: 100-continue makes
	// the server say when the handler has started reading the body, so the
	// request is certainly accepted and in flight before the signal.
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	inFlightReader := bufio.NewReader(conn)
	sessionBody := `{"clusterID":"aB3dE9"}`
	fmt.Fprintf(conn, "POST /sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n",
		len(sessionBody))
	if cont, err := http.ReadResponse(inFlightReader, nil); err != nil || cont.StatusCode != http.StatusContinue {
		t.Fatalf("no 100 Continue for the in-flight request: %v", err)
	}
	if _, err := conn.Write([]byte(sessionBody[:5])); err != nil {
		t.Fatal(err)
	}

	// SIGTERM: exits 0, promptly.
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(logs.String(), "shutting down") {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("no shutdown log 10s after SIGTERM\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// While the request drains, the kubelet's probe on the diagnostics
	// port sees the replica not ready.
	if resp, body := getAt(diag, "/readyz"); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "[-]shutdown failed") {
		t.Fatalf("diagnostics /readyz while draining: %d %s", resp.StatusCode, body)
	}
	if _, err := conn.Write([]byte(sessionBody[5:])); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	inFlight, err := http.ReadResponse(inFlightReader, nil)
	if err != nil {
		t.Fatalf("in-flight request during shutdown: %v", err)
	}
	if inFlight.StatusCode != http.StatusCreated {
		t.Fatalf("in-flight request during shutdown: %d", inFlight.StatusCode)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("exit after SIGTERM: %v, want exit code 0\n%s", waitErr, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("backend still running 10s after SIGTERM\n%s", logs.String())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("shutdown took %s", d)
	}
	for _, want := range []string{`"msg":"shutting down`, `"msg":"stopped"`, `"path":"/poll"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), ps.SessionSecret) {
		t.Error("logs contain the session secret")
	}
}

// TestBadConfigExits2 runs the real binary with a bad flag: a clear
// message and exit code 2, no panic.
func TestBadConfigExits2(t *testing.T) {
	bin := buildBackend(t)
	cmd := exec.Command(bin, "--external-url", "bind.example.com")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("exit: %v, want code 2\n%s", err, out)
	}
	if !strings.Contains(string(out), "--external-url") || strings.Contains(string(out), "panic") {
		t.Fatalf("output:\n%s", out)
	}
}
